"""The layers of trainfast, enforced: a module imports only from its own layer or the layers below it, never
from a layer above, not even inside a function or under TYPE_CHECKING; no two modules import each other round
a cycle, whatever their layers, a package's __init__ and its own modules included; no module is longer
than MAX_LINES, and no class longer than MAX_CLASS_LINES. The order is written down in CONTRIBUTING.md
("Layers")."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainfast"
# Past this a module holds more than one concern: split it by what each part does (checks/ is the example).
MAX_LINES = 600
# Past this a class does more than one job: move a cohesive group of its methods into a helper object of its own
# (Watch's instruments are the example) or into module-level functions.
MAX_CLASS_LINES = 180

# Top to bottom. A name matches a module or, with ".*", every module of a package.
LAYERS: list[tuple[str, list[str]]] = [
    ("entry points", ["trainfast", "trainfast.__main__", "trainfast.cli", "trainfast.cliargs", "trainfast._site",
                      "trainfast._site.*",
                      "trainfast.cliflags"]),
    ("search", ["trainfast.tune", "trainfast.tune.*"]),
    ("applications", ["trainfast.ablation", "trainfast.ablation.*", "trainfast.doctor", "trainfast.doctor.*",
                      "trainfast.bench_data", "trainfast.trainer", "trainfast.selfcheck", "trainfast.selfcheck.*"]),
    ("output", ["trainfast.report", "trainfast.report.*", "trainfast.track", "trainfast.track.*"]),
    ("assembly and instruments", ["trainfast.run", "trainfast.curves", "trainfast.launch", "trainfast.probe",
                                  "trainfast.probe.*",
                                  "trainfast.checks", "trainfast.checks.*",
                                  "trainfast.instruments", "trainfast.instruments.*", "trainfast.envcheck",
                                  "trainfast.frameworks",
                                  "trainfast.frameworks.*"]),
    ("loop and tasks", ["trainfast.engine", "trainfast.tasks", "trainfast.tasks.*"]),
    ("session", ["trainfast.session", "trainfast.session.*"]),
    ("techniques, data, distribution", ["trainfast.techniques", "trainfast.techniques.*", "trainfast.data",
                                        "trainfast.data.*", "trainfast.detection", "trainfast.detection.*",
                                        "trainfast.distributed", "trainfast.nodes", "trainfast.faults",
                                        "trainfast.checkpoint",
                                        "trainfast.models", "trainfast.text", "trainfast.text.*"]),
    ("foundations", ["trainfast.recipe", "trainfast.target", "trainfast.measure", "trainfast.measure.*",
                     "trainfast.stats", "trainfast.procs", "trainfast.results", "trainfast.observers",
                     "trainfast.procstate", "trainfast.errors", "trainfast.modelnames", "trainfast.defaults",
                     "trainfast.dataspecs",
                     "trainfast.quiet", "trainfast.scriptargs",
                     "trainfast.printedmetric", "trainfast.rankfaults"]),
]


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_from(package: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module a `from X import ...` in `package` reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every trainfast module `name` imports, at any depth of its code (functions, TYPE_CHECKING blocks)."""
    package = package_of(name, path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = imported_from(package, node)
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:       # `from pkg import name`: the module pkg.name, or pkg
                target = target.rpartition(".")[0]
            if target.startswith("trainfast") and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return index
    raise LookupError(name)


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = module_files(root)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, targets in edges.items():
        for target in targets:
            if target.startswith(name + "."):        # a package's __init__ re-exporting its own modules
                continue
            if layer_of(target) < layer_of(name):
                bad.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles (strongly connected components of more than one module). A package's __init__ importing its
    own modules counts: a module that then imports the package back (`from . import sibling` reads the package,
    still being initialised) closes a cycle."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    unplaced = []
    for name in module_files():
        try:
            layer_of(name)
        except LookupError:
            unplaced.append(name)
    assert not unplaced, f"modules in no layer (add them to LAYERS and CONTRIBUTING.md): {unplaced}"


def test_no_module_imports_from_a_layer_above():
    bad = upward_imports(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def long_modules(root: Path = PACKAGE) -> list[str]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in module_files(root).items()}
    return sorted(f"{name}: {n} lines" for name, n in lengths.items() if n > MAX_LINES)


def test_no_module_over_the_line_limit():
    long = long_modules()
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def long_classes(root: Path = PACKAGE) -> list[str]:
    """Every class longer than MAX_CLASS_LINES, counted from its `class` line to its last line (ast's end_lineno),
    with its file and its length."""
    long = []
    for _, path in sorted(module_files(root).items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    long.append(f"class {node.name} in {path.relative_to(root.parent)} (line {node.lineno}): {n} lines")
    return long


def test_no_class_over_the_line_limit():
    long = long_classes()
    assert not long, (f"classes over {MAX_CLASS_LINES} lines (move a cohesive group of their methods into a helper "
                      f"object or module-level functions):\n" + "\n".join(long))


def private_imports(root: Path = PACKAGE) -> list[str]:
    """Every `from X import _name` inside trainfast that takes a private name (one leading underscore; dunders such as
    __version__ are public) from another module: a name another module needs is part of its owner's interface, so
    it gets a public name. A private submodule (`from . import _site`) is a module, not a name, and is allowed."""
    mods = module_files(root)
    found = []
    for name, path in sorted(mods.items()):
        package = package_of(name, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = imported_from(package, node)
            if not module.startswith("trainfast"):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not (alias.name.startswith("__") and alias.name.endswith("__"))
                if private and f"{module}.{alias.name}" not in mods:
                    found.append(f"{name} (line {node.lineno}) imports {alias.name} from {module}")
    return found


def test_no_private_name_imported_across_modules():
    found = private_imports()
    assert not found, "private names imported from another module (give them a public name):\n" + "\n".join(found)


@pytest.mark.parametrize("code", ["from .datasets import _channel_stats\n",
                                  "def f():\n    from .datasets import _channel_stats\n",
                                  "from trainfast.data.datasets import IMAGE_EXTENSIONS, _channel_stats\n"])
def test_the_check_finds_a_private_import(tmp_path, code):
    """The check can fail: a private name imported from a sibling (at the top, inside a function, absolute) is
    reported; a dunder beside it is not."""
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "data" / "sampler.py", "a") as f:
        f.write("\n" + code + "from .. import __version__\n")
    found = private_imports(copy)
    assert len(found) == 1 and found[0].startswith("trainfast.data.sampler (line "), found
    assert found[0].endswith(" imports _channel_stats from trainfast.data.datasets"), found


@pytest.mark.parametrize("code, expect", [
    ("def f():\n    from ..ablation import ablate\n", "trainfast.ablation"),      # inside a function
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..tune import tune\n", "trainfast.tune"),
    ("import trainfast.cli\n", "trainfast.cli"),
])
def test_the_check_finds_an_upward_import(tmp_path, code, expect):
    """The check can fail: an upward import planted in a copy of a low module is reported."""
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "data" / "sampler.py", "a") as f:
        f.write("\n" + code)
    bad = upward_imports(graph(copy))
    assert any(line.startswith("trainfast.data.sampler ") and expect in line for line in bad), bad


def test_the_check_finds_a_cycle(tmp_path):
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "stats.py", "a") as f:
        f.write("\ndef f():\n    from .procs import run_supervised\n")
    with open(copy / "procs.py", "a") as f:
        f.write("\ndef g():\n    from .stats import compare\n")
    assert ["trainfast.procs", "trainfast.stats"] in cycles(graph(copy))


def test_the_check_finds_a_cycle_inside_a_package(tmp_path):
    """A package's module importing back a name its package's __init__ defines, inside a function: the __init__
    imports that module, so the two make a cycle."""
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "techniques" / "switch.py", "a") as f:
        f.write("\ndef f():\n    from . import process_env\n")
    assert any({"trainfast.techniques", "trainfast.techniques.switch"} <= set(c) for c in cycles(graph(copy)))


def test_the_check_finds_a_long_module(tmp_path):
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "stats.py", "a") as f:
        f.write("\n" * MAX_LINES)
    assert [line for line in long_modules(copy) if line.startswith("trainfast.stats:")]


def test_the_check_finds_a_long_class(tmp_path):
    import shutil

    copy = tmp_path / "trainfast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS_LINES))      # the class line and these: one too many
    with open(copy / "stats.py", "a") as f:
        f.write("\n\nclass Sprawling:\n" + body)
    found = [line for line in long_classes(copy) if line.startswith("class Sprawling ")]
    assert len(found) == 1 and found[0].startswith("class Sprawling in trainfast/stats.py (line "), found
    assert found[0].endswith(f": {MAX_CLASS_LINES + 1} lines"), found
