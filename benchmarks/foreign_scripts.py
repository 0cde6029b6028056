"""`trainfast ablate` on training scripts nobody here wrote: transformers' language-modeling examples (run_clm.py
on the Trainer, run_clm_no_trainer.py on Accelerate) and one of Lightning's own examples, each run unmodified:
what they would download is made here, offline, where they look for it.

Their code is not in this repository (it is theirs): pass the paths of your copies. This driver makes, under --work:

  train.txt        English text from the docstrings of the Python standard library installed here (sorted by
                   module, so the same interpreter gives the same file), enough for ~400 optimizer steps of
                   16 x 64 tokens per epoch
  tok/             a byte-level BPE tokenizer trained on it (vocabulary 1000), saved as a transformers
                   PreTrainedTokenizerFast directory (what --tokenizer_name loads)
  tiny-gpt2/       a 2-layer GPT-2 config for run_clm_no_trainer.py, which has no --config_overrides
  accuracy/        the accuracy metric run_clm.py loads with evaluate.load("accuracy") when it evaluates (evaluate
                   takes a folder of that name in the working directory before it looks on the Hub)
  data/MNIST/raw   for the Lightning example: MNIST's four files in MNIST's own format (the same counts, 60,000
                   and 10,000 images of 28x28), its digits drawn from scikit-learn's 8x8 digits, scaled to 20x20
                   and placed at a random offset as MNIST centres its digits; written also where the script looks
                   (two folders above it, Datasets/MNIST/raw), so torchvision finds them and downloads nothing

then runs, for each script given, `trainfast ablate ... -- PYTHON SCRIPT FLAGS` (an argument list, never a
shell string) in --work, prints each report's table and says where the reports are.

    python benchmarks/foreign_scripts.py --run-clm /tmp/foreign/run_clm.py \\
        --run-clm-no-trainer /tmp/foreign/run_clm_no_trainer.py \\
        --lightning /tmp/foreign/lt/examples/basics/backbone_image_classifier.py --measure full

--measure full: every run to its end, judged on what the script's framework evaluated: run_clm.py gets --do_eval
(the Trainer's evaluate() at the end: eval_loss, eval_accuracy), run_clm_no_trainer.py --with_tracking (its
perplexity and eval_loss go to accelerator.log each epoch), the Lightning example logs valid_loss itself.
The scripts need datasets, evaluate and (LightningCLI) jsonargparse[signatures] beside trainfast.
--prepare-only makes the data and prints the commands without running them.

These are wall-clock timings: nothing else may run on the machine meanwhile (--lock FILE waits until FILE does
not exist, holds it for each ablation and removes it after, also on failure).
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

HERE = Path(__file__).resolve().parent

TRAIN_CHARS = 1_500_000          # ~450k tokens with the 1000-token BPE: ~440 steps of 16 x 64 per epoch
VOCAB = 1000
EOS = "<|endoftext|>"
BLOCK = 64
BATCH = 16
GPT2 = {"n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128}


# ---------------------------------------------------------------------------------------------- the data

def docstrings(limit: int) -> list[str]:
    """Paragraphs of the standard library's docstrings, in module order, until `limit` characters."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for para in doc.split("\n\n"):
                text = " ".join(para.split())
                if len(text) >= 40:
                    out.append(text)
                    total += len(text) + 1
                    if total >= limit:
                        return out
    return out


def make_text(work: Path) -> Path:
    path = work / "train.txt"
    if not path.exists():
        lines = docstrings(TRAIN_CHARS)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {path}: {len(lines)} lines, {path.stat().st_size / 1e6:.2f} MB")
    return path


def make_tokenizer(work: Path, text: Path) -> Path:
    out = work / "tok"
    if (out / "tokenizer.json").exists():
        return out
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train([str(text)], vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS], show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   model_max_length=GPT2["n_positions"])
    fast.save_pretrained(out)
    print(f"wrote {out}: {len(fast)} tokens")
    return out


def make_config(work: Path, vocab: int) -> Path:
    out = work / "tiny-gpt2"
    if (out / "config.json").exists():
        return out
    from transformers import GPT2Config

    GPT2Config(vocab_size=vocab, bos_token_id=0, eos_token_id=0, **GPT2).save_pretrained(out)
    return out


ACCURACY_METRIC = '''"""Accuracy: the share of predictions equal to their references (scikit-learn's accuracy_score)."""
import datasets
import evaluate
from sklearn.metrics import accuracy_score


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description=__doc__, citation="", inputs_description="predictions, references",
                                   features=datasets.Features({"predictions": datasets.Value("int32"),
                                                               "references": datasets.Value("int32")}))

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        return {"accuracy": float(accuracy_score(references, predictions, normalize=normalize,
                                                 sample_weight=sample_weight))}
'''


def make_accuracy_metric(work: Path) -> Path:
    out = work / "accuracy" / "accuracy.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(ACCURACY_METRIC, encoding="utf-8")
    return out


MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", 60_000),
               "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10_000)}


def digit_images(count: int, pool: "np.ndarray", labels: "np.ndarray", rng) -> tuple["np.ndarray", "np.ndarray"]:
    """`count` 28x28 uint8 digits drawn from `pool` (8x8, 0..16): each scaled to 20x20 and placed at a random
    offset within the 28x28 frame (MNIST's digits are 20x20 in a 28x28 frame), with a little noise."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    pick = rng.integers(0, len(pool), count)
    small = torch.from_numpy(pool[pick].astype(np.float32) / 16.0).reshape(count, 1, 8, 8)
    big = F.interpolate(small, size=(20, 20), mode="bilinear", align_corners=False)[:, 0].numpy()
    out = np.zeros((count, 28, 28), np.float32)
    dy, dx = rng.integers(2, 7, count), rng.integers(2, 7, count)
    for i in range(count):
        out[i, dy[i]:dy[i] + 20, dx[i]:dx[i] + 20] = big[i]
    out = np.clip(out + rng.normal(0, 0.05, out.shape), 0, 1)
    return (out * 255).round().astype(np.uint8), labels[pick].astype(np.uint8)


def write_idx(path: Path, array: "np.ndarray") -> None:
    """MNIST's idx format: a zero word, the type (0x08: unsigned byte) and rank, each dimension big-endian, data."""
    import struct

    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def make_mnist(work: Path) -> Path:
    """MNIST's raw files made from scikit-learn's digits: its first 1,500 images feed the training file, the other
    297 the test file, so the test digits are images the training set never drew from."""
    import numpy as np
    from sklearn.datasets import load_digits

    raw = work / "data" / "MNIST" / "raw"
    if all((raw / name).exists() for files in MNIST_FILES.values() for name in files[:2]):
        return raw
    raw.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    rng = np.random.default_rng(0)
    pools = {"train": slice(0, 1500), "t10k": slice(1500, None)}
    for key, (images, labels, count) in MNIST_FILES.items():
        x, y = digit_images(count, digits.images[pools[key]], digits.target[pools[key]], rng)
        write_idx(raw / images, x)
        write_idx(raw / labels, y)
    print(f"wrote {raw}: MNIST's four files (60000 and 10000 digits of 28x28)")
    return raw


def place_mnist(raw: Path, script: Path) -> None:
    """The raw files also where the Lightning example looks: Datasets/MNIST/raw two folders above the script."""
    import shutil

    there = script.resolve().parent.parent.parent / "Datasets" / "MNIST" / "raw"
    there.mkdir(parents=True, exist_ok=True)
    for files in MNIST_FILES.values():
        for name in files[:2]:
            shutil.copyfile(raw / name, there / name)


def prepare(work: Path) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    make_accuracy_metric(work)
    text = make_text(work)
    tok = make_tokenizer(work, text)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tok))
    return {"text": text, "tok": tok, "config": make_config(work, vocab), "vocab": vocab, "mnist": make_mnist(work)}


# ------------------------------------------------------------------------------------- the script flags

def run_clm_flags(data: dict, out: Path, full: bool) -> list[str]:
    overrides = ",".join(f"{k}={v}" for k, v in GPT2.items())
    return ["--model_type", "gpt2",
            "--config_overrides", f"{overrides},vocab_size={data['vocab']},bos_token_id=0,eos_token_id=0",
            "--tokenizer_name", str(data["tok"]), "--train_file", str(data["text"]),
            "--block_size", str(BLOCK), "--per_device_train_batch_size", str(BATCH), "--do_train",
            "--num_train_epochs", "1", "--output_dir", str(out),
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "50",
            *(["--do_eval", "--per_device_eval_batch_size", str(BATCH)] if full else [])]


def run_clm_no_trainer_flags(data: dict, out: Path, full: bool) -> list[str]:
    return ["--config_name", str(data["config"]), "--tokenizer_name", str(data["tok"]),
            "--train_file", str(data["text"]), "--block_size", str(BLOCK),
            "--per_device_train_batch_size", str(BATCH), "--num_train_epochs", "1", "--seed", "0",
            "--output_dir", str(out), *(["--with_tracking"] if full else [])]


def lightning_flags(data: dict, out: Path, full: bool) -> list[str]:
    return ["--trainer.max_epochs=1", f"--trainer.default_root_dir={out}", "--trainer.enable_progress_bar=false",
            "--trainer.accelerator=cpu", "--data.batch_size=32"]


TRIALS = {   # name -> (script option, flags)
    "run_clm": ("run_clm", run_clm_flags),
    "run_clm_no_trainer": ("run_clm_no_trainer", run_clm_no_trainer_flags),
    "lightning": ("lightning", lightning_flags),
}


# ------------------------------------------------------------------------------------------ the ablations

def ablate_argv(cli: argparse.Namespace, script: Path, flags: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "trainfast", "ablate", "--repeats", str(cli.repeats),
            "--noise-seeds", str(cli.noise_seeds), "--settle-within", cli.settle_within, "--measure", cli.measure,
            "--out", str(out), "--", sys.executable, str(script), *flags]


def wait_for_lock(lock: Path) -> None:
    while lock.exists():
        time.sleep(15)
    lock.touch()


def report_table(report: Path) -> str:
    """The first markdown table of report.md (the ablation's)."""
    if not report.exists():
        return f"(no {report})"
    lines = report.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return "(no table)"
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-clm", type=Path, help="path of transformers' run_clm.py (Trainer)")
    parser.add_argument("--run-clm-no-trainer", type=Path,
                        help="path of transformers' run_clm_no_trainer.py (Accelerate)")
    parser.add_argument("--lightning", type=Path, help="path of Lightning's examples/pytorch/basics/"
                                                       "backbone_image_classifier.py (MNIST is written two folders "
                                                       "above it, in Datasets/)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/foreign"),
                        help="data, tokenizer, outputs (default /tmp/foreign)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--noise-seeds", type=int, default=1)
    parser.add_argument("--settle-within", default="0")
    parser.add_argument("--measure", choices=["speed", "full"], default="speed",
                        help="full: every run to its end, judged on the script's own evaluation (its framework's "
                             "metrics; the scripts get their evaluation flags)")
    parser.add_argument("--tag", help="the ablations' folders are ab_<name>-TAG (a second run beside the first)")
    parser.add_argument("--lock", type=Path, help="wait until this file is gone, hold it during each ablation")
    parser.add_argument("--prepare-only", action="store_true", help="make the data and print the commands only")
    cli = parser.parse_args()
    cli.work = cli.work.resolve()

    data = prepare(cli.work)
    trials = [(name, getattr(cli, option)) for name, (option, _) in TRIALS.items() if getattr(cli, option)]
    if not trials:
        parser.error("give at least one of --run-clm, --run-clm-no-trainer, --lightning")
    failed = 0
    for name, script in trials:
        flags = TRIALS[name][1](data, cli.work / f"out_{name}", cli.measure == "full")
        if name == "lightning":
            place_mnist(data["mnist"], script)
        out = cli.work / (f"ab_{name}-{cli.tag}" if cli.tag else f"ab_{name}")
        argv = ablate_argv(cli, script.resolve(), flags, out)
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        print(f"\n## {name}\n\n    {' '.join(argv)}\n", flush=True)
        if cli.prepare_only:
            continue
        if cli.lock:
            wait_for_lock(cli.lock)
        try:
            rc = subprocess.run(argv, cwd=cli.work, env=env).returncode
        finally:
            if cli.lock:
                cli.lock.unlink(missing_ok=True)
        failed += rc != 0
        print(f"\n{name}: exit {rc}; report {out / 'report.md'}\n\n{report_table(out / 'report.md')}\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
