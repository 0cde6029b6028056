"""`trainfast selfcheck`: every CUDA path of trainfast exercised on this machine by one command.

Each check runs trainfast's own code (the precision levels, the transfer and the prefetcher, the Session's
techniques, the distributed layer, the doctor, the ablation) on a small case and judges what it measured with
a pure function (judges.py), so the judging is tested on any CPU with made-up numbers. A check says pass,
fail or not applicable (and why: no CUDA, one GPU, no bf16...), with the figure its verdict turned on.

Where the pieces are:
  catalog.py           the checks: name, what passing proves, what each needs, where its code is
  judges.py            the verdicts and their thresholds (pure, no torch)
  runner.py            the machine's facts, running and timing each check, the table, selfcheck.json
  common.py            the small models, data and timed steps the checks share
  precision_checks.py  fp16 loss scaling, O1/O2/bf16 parity with fp32
  device_checks.py     non_blocking, the prefetcher, channels_last, cudnn.benchmark, compile, fused AdamW, nvJPEG
  parallel_checks.py   DDP over NCCL (set_epoch, reduced metrics, the non-finite stop), DataParallel
  tool_checks.py       the doctor on planted mistakes, the ablation's non_blocking rung and peak memory

Nothing here imports torch until a command runs: `trainfast --help` stays fast.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from .catalog import CHECKS, NAMES, select

HELP = "check every CUDA path of trainfast on this machine: pass / fail / not applicable, with the measured figure"
EXAMPLES = """\
  trainfast selfcheck                                # every check on the GPU(s) here (2 minutes on an H100)
  trainfast selfcheck --only fp16_scaler,prefetch_overlap --out runs/sc
  trainfast selfcheck --cpu-subset                   # no GPU: the checks a CPU can run; the rest not applicable"""


def _names(text: str) -> list[str]:
    """argparse type of --only: refused at parse time, naming the checks there are."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        select(names)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return names


_names.__name__ = "check names"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `selfcheck` to the CLI's subcommands (`subparsers`: what ArgumentParser.add_subparsers returned)."""
    parser = subparsers.add_parser("selfcheck", help=HELP, description=HELP[0].upper() + HELP[1:] + ".",
                                   epilog="examples:\n" + EXAMPLES,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser)
    return parser


def add_flags(parser: argparse.ArgumentParser) -> None:
    """selfcheck's flags (the CLI adds the subcommand itself, as it does every other)."""
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for selfcheck.json (default: runs/selfcheck-<timestamp>)")
    parser.add_argument("--cpu-subset", action="store_true",
                        help="run on the CPU the checks that can run there (" +
                             ", ".join(c.name for c in CHECKS if c.cpu) +
                             "); the CUDA ones are reported not applicable")
    parser.add_argument("--only", type=_names, default=None, metavar="NAME,...",
                        help=f"run only these checks (comma-separated): {', '.join(NAMES)}")


def main(args: argparse.Namespace) -> int:
    """Exit status: 0 every check that ran passed; 1 a check failed; 2 no CUDA here and no --cpu-subset."""
    import torch

    from .runner import Context, no_cuda_line, probe_machine, report_payload, run_all, write_report

    cpu_subset = bool(getattr(args, "cpu_subset", False))
    if not torch.cuda.is_available() and not cpu_subset:
        print(no_cuda_line(), file=sys.stderr)
        return 2
    checks = select(getattr(args, "only", None))
    machine = probe_machine(cpu_subset)
    out = Path(args.out) if getattr(args, "out", None) else Path("runs") / datetime.now().strftime(
        "selfcheck-%Y%m%d-%H%M%S")
    ctx = Context(torch.device(machine["device"]), out, machine)
    results = run_all(checks, ctx, cpu_subset)
    payload = report_payload(results, machine, cpu_subset)
    path = write_report(out, payload)
    counts = payload["summary"]
    print(f"selfcheck: {counts['pass']} passed, {counts['fail']} failed, {counts['not applicable']} not applicable; "
          f"{path}")
    return payload["exit_status"]
