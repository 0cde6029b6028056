"""The language-model ladder on one GPU, in one call of under 8 minutes: a decoder of about 125M parameters
(llama-125m: GPT-2 small's shape, Llama's blocks) on the standard library's documents cut to --seq-len tokens
(2048 by default), bf16 against fp32, then padding-free batches, length grouping, the attention backends the GPU
runs (sdpa; flash where the flash-attn package is installed) and the fused AdamW, each judged on
validation loss. Prints and writes (OUT/summary.md) tokens/s of real tokens and MFU against the device's dense
bf16 peak from its datasheet, beside trainfast's own % of the measured matmul peak.

    python benchmarks/gpu_lm.py [--out DIR]           # on the GPU machine (about 7 minutes on an H100)
    python benchmarks/gpu_lm.py --smoke               # every step on the CPU, small: about 2 minutes

Each run trains one epoch over --documents documents (default 1024, 64 steps of 16) and is timed on its steady
steps (the ablation's own timing: device events on CUDA, warm-up left out), 2 repeats, the baseline 2 seeds."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from trainfast import Recipe, ablate  # noqa: E402
from trainfast.text.batching import load_text  # noqa: E402

# Dense bf16 tensor-core peaks from the datasheets (FLOP/s, without sparsity), by a name fragment of the device.
DENSE_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
              ("L4", 121e12), ("A10", 125e12))
# flex is left out: it compiles its kernel for every new batch shape, minutes of a run that lasts one
# (`trainfast ablate --switches flex` measures it on a longer run).
RUNGS = ["amp", "padding_free", "group_by_length", "sdpa", "flash", "fused"]


def dense_peak(name: str) -> float | None:
    return next((peak for fragment, peak in DENSE_BF16 if fragment in name), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-125m")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--documents", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=f"runs/gpu-lm-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--smoke", action="store_true", help="the same steps on the CPU, small")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.seq_len, args.documents, args.repeats = "llama-tiny", 128, 128, 1
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_lm.py: no GPU here (--smoke runs it on the CPU)")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    split = load_text(f"stdlib:{args.documents}", max_length=args.seq_len)
    print(f"{name}; torch {torch.__version__}; {args.model} on {split.name}, documents cut to {args.seq_len} tokens; "
          f"a padded batch of {args.batch_size} is {split.padding_share(args.batch_size):.0%} padding", flush=True)
    recipe = Recipe(epochs=1, batch_size=args.batch_size, lr=6e-4, weight_decay=0.1, warmup_steps=10, log_every=16)
    result = ablate(args.model, train_set=split, recipe=recipe, device=device, rungs=RUNGS, repeats=args.repeats,
                    noise_seeds=2, out=args.out, amp_dtype="bf16", show=False)
    write_summary(result, name, args, split)


def write_summary(result, name: str, args, split) -> None:
    peak = dense_peak(name)
    lines = [f"# The language-model ladder on {name}", "",
             f"{args.model}, {split.name}, documents cut to {args.seq_len} tokens, batch {args.batch_size}, "
             f"{args.repeats} repeats; a padded batch is {split.padding_share(args.batch_size):.0%} padding. "
             f"MFU: model FLOPs of the real tokens (6 x parameters + attention) over the dense bf16 peak "
             f"{'%.0f TFLOP/s' % (peak / 1e12) if peak else '(unknown for this device)'}.", "",
             "| rung | tokens/s | speed-up (95% CI) | verdict | val loss (Δ) | MFU | % of measured matmul peak |",
             "|---|---|---|---|---|---|---|"]
    for rung in result.rungs:
        r = rung.result
        if r.throughput is None:
            lines.append(f"| {rung.name} | {rung.reason or rung.status} | | | | | |")
            continue
        interval = f" ({r.speedup_interval[0]:.2f}–{r.speedup_interval[1]:.2f})" if r.speedup_interval else ""
        delta = f" ({r.metric_delta:+.3f})" if r.metric_delta is not None else ""
        mfu = f"{r.flops_per_s / peak:.1%}" if peak and r.flops_per_s else "—"
        roof = f"{r.ceiling_fraction:.1%}" if r.ceiling_fraction else "—"
        lines.append(f"| {rung.name} | {r.throughput:,.0f} | {r.speedup:.2f}x{interval} | {r.verdict} | "
                     f"{r.metric:.3f}{delta} | {mfu} | {roof} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.md").write_text(text)
    (Path(args.out) / "summary.json").write_text(json.dumps({"device": name, "model": args.model,
                                                             "seq_len": args.seq_len}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
