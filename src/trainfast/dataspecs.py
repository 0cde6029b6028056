"""The `--data SPEC` each task reads, parsed without torch: the CLI and the ablation refuse a spec no loader reads (an
unknown dataset name, a folder kind without its path) before torch loads or any work starts, and the loaders
(data/loading.py, detection/loading.py, text/batching.py) parse the spec with these same functions, so the check and
the loader cannot drift. Whether a folder exists is the CLI's own early check (cliflags.check_data_folder)."""
from __future__ import annotations

from .errors import DataError

IMAGE_KINDS = ("digits", "synthetic", "imagefolder", "cifar10")
DETECTION_KINDS = ("synthetic", "coco")


def parse_data_spec(spec: str) -> tuple[str, str | None]:
    """The classification task's data: `digits`, `synthetic`, `imagefolder:PATH` or `cifar10:PATH`."""
    kind, _, arg = spec.partition(":")
    if kind not in IMAGE_KINDS:
        raise DataError(f"--data {spec!r}: unknown dataset {kind!r}; choose digits, synthetic, "
                        "imagefolder:PATH or cifar10:PATH")
    if kind in ("imagefolder", "cifar10") and not arg:
        raise DataError(f"--data {spec!r}: {kind} needs a path, e.g. {kind}:/data/{kind}")
    if kind in ("digits", "synthetic") and arg:
        raise DataError(f"--data {spec!r}: {kind} takes no path")
    return kind, arg or None


def parse_detection_spec(spec: str) -> tuple[str, str | None]:
    """The detection task's data: `synthetic`, `synthetic:shapes`, `synthetic:digits` or `coco:PATH`."""
    kind, _, arg = spec.partition(":")
    if kind not in DETECTION_KINDS:
        raise DataError(f"--data {spec!r}: unknown detection dataset {kind!r}; choose synthetic, "
                        f"synthetic:shapes, synthetic:digits or coco:PATH")
    if kind == "coco" and not arg:
        raise DataError(f"--data {spec!r}: coco needs a folder, e.g. coco:/data/coco "
                        "(an instances*.json and its images)")
    if kind == "synthetic" and arg not in ("", "shapes", "digits"):
        raise DataError(f"--data {spec!r}: synthetic objects are 'shapes' or 'digits', not {arg!r}")
    return kind, arg or None


def parse_text_spec(spec: str) -> tuple[str, int | None]:
    """The language-model task's data: `stdlib` (every document), `stdlib:N` (N training documents, a fixed sample of
    them), `text:PATH` -> (the corpus's spec, the number of training documents or None for all)."""
    if spec.startswith("stdlib:"):
        count = spec[len("stdlib:"):]
        if not count.isdigit() or int(count) < 1:
            raise DataError(f"--data {spec}: stdlib:N takes a number of training documents (e.g. stdlib:768)")
        return "stdlib", int(count)
    check_corpus_spec(spec)
    return spec, None


def check_corpus_spec(spec: str) -> None:
    """A corpus text/corpus.py reads: `stdlib` or `text:PATH`."""
    if spec != "stdlib" and not spec.startswith("text:"):
        raise DataError(f"--data {spec!r}: the language-model task reads `stdlib` (the standard library's source, the "
                        "default) or text:PATH (a folder of .txt / .jsonl documents)")
