"""The part of the switches' declarations the command line needs before torch loads, read from the technique modules'
source without importing them (most import torch at the top): the kind of data each switch acts on (Switch.data).

A task rules out a switch on data it does not offer (tasks/base.py: TaskDeclaration.data_reason); reading that from
the declarations themselves, not from a copy kept beside them, lets `trainfast ablate --task lm --channels-last` be
refused in a fraction of a second while a new switch still needs nothing but its module. What is read is exactly
what `owners()` gives once the modules are imported: tests/test_switches.py compares the two, and a declaration
whose fields or data are not plain literals here (or names of module-level literals) is refused by name.
"""
from __future__ import annotations

import ast
import functools
import pkgutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@functools.cache
def declared_data() -> dict[str, str]:
    """Recipe field -> the kind of data (techniques/switch.py: DATA_KINDS) its switch acts on, for every switch
    declared with one; a field missing here acts on any data."""
    table: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules([str(HERE)]), key=lambda m: m.name):
        table.update(read_module_data(HERE / f"{info.name}.py"))
    return table


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


@functools.cache
def declared_rung_names() -> frozenset[str]:
    """The rung names the switches' declarations write as literals (`RungSpec("amp", ...)`, or a module-level
    literal's name): what a script's own rung (--rung NAME=...) may not be called, checked before torch loads. Names
    made in code (the precision levels) are checked once the declarations are imported (ablation/api.py)."""
    names: set[str] = set()
    for info in pkgutil.iter_modules([str(HERE)]):
        tree = ast.parse((HERE / f"{info.name}.py").read_text(encoding="utf-8"))
        constants = module_constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and called_name(node.func) == "RungSpec" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names.add(first.value)
                elif isinstance(first, ast.Name) and isinstance(constants.get(first.id), str):
                    names.add(constants[first.id])
    return frozenset(names)
