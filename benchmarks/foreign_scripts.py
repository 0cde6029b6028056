"""`trainfast ablate` on training scripts nobody here wrote: transformers' language-modeling examples (run_clm.py
on the Trainer, run_clm_no_trainer.py on Accelerate) and one of Lightning's own examples, each run unmodified
but for what offline use needs.

Their code is not in this repository (it is theirs): pass the paths of your copies. This driver makes what they
would otherwise download, under --work:

  train.txt        English text from the docstrings of the Python standard library installed here (sorted by
                   module, so the same interpreter gives the same file), enough for ~400 optimizer steps of
                   16 x 64 tokens per epoch
  tok/             a byte-level BPE tokenizer trained on it (vocabulary 1000), saved as a transformers
                   PreTrainedTokenizerFast directory (what --tokenizer_name loads)
  tiny-gpt2/       a 2-layer GPT-2 config for run_clm_no_trainer.py, which has no --config_overrides

then runs, for each script given, `trainfast ablate ... -- PYTHON SCRIPT FLAGS` (an argument list, never a
shell string), prints each report's table and says where the reports are.

    python benchmarks/foreign_scripts.py --run-clm /tmp/foreign/run_clm.py \\
        --run-clm-no-trainer /tmp/foreign/run_clm_no_trainer.py \\
        --lightning /tmp/foreign/backbone_image_classifier.py --lightning-path /tmp/foreign/lib

--lightning-path: a folder put on PYTHONPATH for the Lightning trial (Lightning's examples parse their command
line with LightningCLI, which needs jsonargparse: `pip install --target DIR "jsonargparse[signatures]"`).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

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


def prepare(work: Path) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    text = make_text(work)
    tok = make_tokenizer(work, text)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tok))
    return {"text": text, "tok": tok, "config": make_config(work, vocab), "vocab": vocab}


# ------------------------------------------------------------------------------------- the script flags

def run_clm_flags(data: dict, out: Path) -> list[str]:
    overrides = ",".join(f"{k}={v}" for k, v in GPT2.items())
    return ["--model_type", "gpt2",
            "--config_overrides", f"{overrides},vocab_size={data['vocab']},bos_token_id=0,eos_token_id=0",
            "--tokenizer_name", str(data["tok"]), "--train_file", str(data["text"]),
            "--block_size", str(BLOCK), "--per_device_train_batch_size", str(BATCH), "--do_train",
            "--num_train_epochs", "1", "--output_dir", str(out),
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "50"]


def run_clm_no_trainer_flags(data: dict, out: Path) -> list[str]:
    return ["--config_name", str(data["config"]), "--tokenizer_name", str(data["tok"]),
            "--train_file", str(data["text"]), "--block_size", str(BLOCK),
            "--per_device_train_batch_size", str(BATCH), "--num_train_epochs", "1", "--seed", "0",
            "--output_dir", str(out)]


def lightning_flags(data: dict, out: Path) -> list[str]:
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
                                                       "backbone_image_classifier.py, MNIST swapped for FakeData")
    parser.add_argument("--lightning-path", type=Path, help="folder put on PYTHONPATH for the Lightning trial "
                                                            "(where jsonargparse is installed)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/foreign"),
                        help="data, tokenizer, outputs (default /tmp/foreign)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--noise-seeds", type=int, default=1)
    parser.add_argument("--settle-within", default="0")
    parser.add_argument("--measure", choices=["speed", "full"], default="speed",
                        help="full: every run to its end, judged on the script's own evaluation (its framework's "
                             "metrics; give the script an evaluation flag, e.g. run_clm.py's --do_eval)")
    parser.add_argument("--lock", type=Path, help="wait until this file is gone, hold it during each ablation")
    parser.add_argument("--prepare-only", action="store_true", help="make the data and print the commands only")
    cli = parser.parse_args()

    data = prepare(cli.work)
    trials = [(name, getattr(cli, option)) for name, (option, _) in TRIALS.items() if getattr(cli, option)]
    if not trials:
        parser.error("give at least one of --run-clm, --run-clm-no-trainer, --lightning")
    failed = 0
    for name, script in trials:
        flags = TRIALS[name][1](data, cli.work / f"out_{name}")
        out = cli.work / f"ab_{name}"
        argv = ablate_argv(cli, script.resolve(), flags, out)
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if name == "lightning" and cli.lightning_path:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cli.lightning_path), env.get("PYTHONPATH")) if p)
        print(f"\n## {name}\n\n    {' '.join(argv)}\n", flush=True)
        if cli.prepare_only:
            continue
        if cli.lock:
            wait_for_lock(cli.lock)
        try:
            rc = subprocess.run(argv, cwd=ROOT, env=env).returncode
        finally:
            if cli.lock:
                cli.lock.unlink(missing_ok=True)
        failed += rc != 0
        print(f"\n{name}: exit {rc}; report {out / 'report.md'}\n\n{report_table(out / 'report.md')}\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
