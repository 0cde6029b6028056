"""Documents to train a language model on, from what ships with every install or from a user's folder.

`stdlib`: the Python standard library's own source, cut into its blocks (each module's preamble, then every
top-level function, class header and method, with the decorators and comments just above it): real text of very
different lengths (a one-line alias next to a 2,000-line class), the length spread that makes padding costly.
Test suites, GUI toolkits and vendored packages are left out. `text:PATH`: every .txt file under PATH is one
document, every line of a .jsonl file one document (its "text" field).

Train and validation are split by source file (a hash of its path), so no validation document shares a file
with a training one: the same split on every machine that has the same Python version."""
from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..dataspecs import check_corpus_spec
from ..errors import DataError

SKIPPED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "tkinter",
                "ensurepip", "__pycache__", "pydoc_data", "encodings"}
VAL_SHARE = 10                      # one source in VAL_SHARE goes to validation (by the hash of its name)
# A block starts at a line that opens a definition at the top level or as a class's method (indented by 4); the
# decorators and comments directly above it belong to it.
BLOCK_START = re.compile(r"^(?:    )?(?:async\s+def|def|class)\s")


@dataclass
class Corpus:
    name: str                       # "stdlib (Python 3.11)" or the folder
    train: list[str]
    val: list[str]
    sources: int                    # files read


def is_validation(source: str) -> bool:
    return int(hashlib.sha1(source.encode()).hexdigest(), 16) % VAL_SHARE == 0


def top_level_blocks(text: str) -> list[str]:
    """`text` (Python source) cut before every top-level def/class and every method, each cut moved up over the
    decorators and comments that belong to the block below it."""
    lines = text.splitlines(keepends=True)
    cuts = [0]
    for i, line in enumerate(lines):
        if i and BLOCK_START.match(line):
            j = i
            while j > cuts[-1] + 1 and lines[j - 1].lstrip().startswith(("@", "#")):
                j -= 1
            cuts.append(j)
    cuts.append(len(lines))
    blocks = ["".join(lines[a:b]).strip("\n") for a, b in zip(cuts, cuts[1:])]
    return [b for b in blocks if b.strip()]


def stdlib_corpus() -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    if not files:
        raise DataError(f"--data stdlib: no Python source found under {root} (a Python installed without its "
                        "standard library's source); use --data text:PATH")
    train, val = [], []
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        (val if is_validation(rel) else train).extend(top_level_blocks(text))
    version = sysconfig.get_python_version()
    return Corpus(f"stdlib (Python {version})", train, val, len(files))


def folder_corpus(spec: str, path: str) -> Corpus:
    """Every .txt file one document, every .jsonl line one (its "text" field); split by file, and for a .jsonl by
    line as well, so one large .jsonl still gives a validation set."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"--data {spec}: {path} is not a folder")
    files = sorted(p for p in root.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    if not files:
        raise DataError(f"--data {spec}: no .txt or .jsonl file under {path}")
    train, val = [], []
    for file in files:
        rel = file.relative_to(root).as_posix()
        if file.suffix == ".txt":
            text = file.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                (val if is_validation(rel) else train).append(text)
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"--data {spec}: {file}:{number} is not a JSON object with a \"text\" field") from None
            if isinstance(text, str) and text.strip():
                (val if is_validation(f"{rel}:{number}") else train).append(text)
    if not train or not val:
        raise DataError(f"--data {spec}: {len(train)} training and {len(val)} validation documents; both splits need "
                        f"one (one file in {VAL_SHARE} goes to validation: add files or .jsonl lines)")
    return Corpus(str(root), train, val, len(files))


def load_corpus(spec: str) -> Corpus:
    check_corpus_spec(spec)
    if spec == "stdlib":
        return stdlib_corpus()
    return folder_corpus(spec, spec[len("text:"):])
