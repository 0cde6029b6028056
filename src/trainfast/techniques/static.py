"""The part of the switches' declarations the command line needs before torch loads, read from the technique modules'
source without importing them (most import torch at the top): the kind of data each switch acts on (Switch.data),
and the rungs' names with the tasks that can name them (RungSpec.name, .tasks: what --switches takes).

A task rules out a switch on data it does not offer (tasks/base.py: TaskDeclaration.data_reason); reading that from
the declarations themselves, not from a copy kept beside them, lets `trainfast ablate --task lm --channels-last` be
refused in a fraction of a second while a new switch still needs nothing but its module. What is read is exactly
what `owners()` gives once the modules are imported: tests/test_switches.py compares the two, and a declaration
whose fields or data are not plain literals here (or names of module-level literals) is refused by name.
"""
from __future__ import annotations

import ast
import difflib
import functools
import pkgutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNG_ALIASES = {"fp32": "baseline"}      # other names --switches takes for a rung: fp32 is the baseline (O0)


@functools.cache
def declared_data() -> dict[str, str]:
    """Recipe field -> the kind of data (techniques/switch.py: DATA_KINDS) its switch acts on, for every switch
    declared with one; a field missing here acts on any data."""
    table: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules([str(HERE)]), key=lambda m: m.name):
        table.update(read_module_data(HERE / f"{info.name}.py"))
    return table


@functools.cache
def declared_rungs() -> dict[str, tuple[str, ...] | None]:
    """Rung name -> the tasks that can name it (None: every task), for every rung any switch declares."""
    table: dict[str, tuple[str, ...] | None] = {}
    for info in sorted(pkgutil.iter_modules([str(HERE)]), key=lambda m: m.name):
        table.update(read_module_rungs(HERE / f"{info.name}.py"))
    return table


def rung_names(task: str | None) -> list[str]:
    """What --switches takes for `task` (None: a user's script, every rung): the baseline, its alias and each rung
    the task can name, read before torch loads."""
    return ["baseline", *RUNG_ALIASES, *sorted(name for name, tasks in declared_rungs().items()
                                                if tasks is None or task is None or task in tasks)]


def unknown_rungs(names: list[str], valid: list[str]) -> str | None:
    """Why `names` (--switches) cannot be planned: each one not in `valid`, with the valid names closest to it."""
    unknown = [name for name in names if name not in valid]
    if not unknown:
        return None
    said = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
        said.append(name + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return f"--switches: unknown rung(s) {', '.join(said)}; choose from {', '.join(valid)}"


def read_module_rungs(path: Path) -> dict[str, tuple[str, ...] | None]:
    """The {rung name: tasks} of the `RungSpec(...)` calls in one module's source. A name made in a comprehension
    over a module-level table (the precision levels' rungs) is read by evaluating that comprehension on the
    module's literal constants alone, with RungSpec's call replaced by its name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = module_constants(tree)
    table: dict[str, tuple[str, ...] | None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.GeneratorExp) and is_rung(node.elt) and not literal_name(node.elt, constants):
            tasks = rung_tasks(node.elt, constants, path)
            named = ast.Expression(ast.GeneratorExp(node.elt.args[0], node.generators))
            code = compile(ast.fix_missing_locations(named), str(path), "eval")
            table.update((name, tasks) for name in eval(code, {**constants, "__builtins__": {"enumerate": enumerate}}))
        elif is_rung(node) and literal_name(node, constants):
            table[literal(node.args[0], constants, path)] = rung_tasks(node, constants, path)
    return table


def is_rung(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and called_name(node.func) == "RungSpec" and bool(node.args)


def literal_name(node: ast.Call, constants: dict[str, Any]) -> bool:
    name = node.args[0]
    return isinstance(name, ast.Constant) or (isinstance(name, ast.Name) and name.id in constants)


def rung_tasks(node: ast.Call, constants: dict[str, Any], path: Path) -> tuple[str, ...] | None:
    tasks = next((k.value for k in node.keywords if k.arg == "tasks"), None)
    return None if tasks is None else tuple(literal(tasks, constants, path))


def read_module_data(path: Path) -> dict[str, str]:
    """The {field: data kind} of the `Switch(...)` declarations in one module's source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = module_constants(tree)
    table: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and called_name(node.func) == "Switch"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        if "data" not in keywords:
            continue
        fields_node = node.args[0] if node.args else keywords.get("fields")
        kind = literal(keywords["data"], constants, path)
        for name in literal(fields_node, constants, path):
            table[name] = kind
    return table


def called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """The module-level names bound to a literal (`DOCUMENTS = "documents"`), which a declaration may use."""
    constants: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
              and isinstance(node.value, (ast.DictComp, ast.ListComp))):
            # a table made from literals (the precision levels' rungs): evaluated on the constants above it alone
            try:
                code = compile(ast.Expression(node.value), "<declaration>", "eval")
                constants[node.target.id] = eval(code, {**constants, "__builtins__": {}})
            except Exception:          # it uses something other than literals: not a constant here
                continue
    return constants


def literal(node: ast.expr | None, constants: dict[str, Any], path: Path) -> Any:
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):        # (FIELD,): a tuple of names of literals
        return tuple(literal(element, constants, path) for element in node.elts)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        line = getattr(node, "lineno", "?")
        raise LookupError(f"{path.name}:{line}: a Switch with data= declares its fields and data as literals (or "
                          "names of module-level literals), so the command line can read them before torch loads "
                          "(techniques/static.py)") from None
