"""Numbers and verdicts as the table, the charts and the prose write them: significant figures, a rate with
its ±, a speed-up with its interval, a verdict in a few words, a rung's label."""
from __future__ import annotations

import math
import shlex
from typing import Sequence

from ..results import Rung
from ..stats import FASTER, SLOWER
from ..techniques.precision import opt_level


def fmt_sig(x: float | None, digits: int = 3) -> str:
    """`x` with `digits` significant figures, trailing zeros kept (5.40, 45.3, 453; 1,234 stays whole)."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def fmt_rate(x: float | None, spread: float | None = None) -> str:
    """A rate to 3 significant figures, and its ± at the same decimals."""
    if x is None:
        return "—"
    text = fmt_sig(x)
    if spread is None:
        return text
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{text} ± {spread:,.{decimals}f}"


def fmt_bytes(x: float | None) -> str:
    return "—" if x is None else f"{x / 2**20:,.0f} MiB"


def fmt_flops(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e9:,.1f} G"


def fmt_speedup(speedup: float | None, interval: Sequence[float] | None = None) -> str:
    """'1.74x (1.52–1.99)': the speed-up and its 95% interval (left out when it is a point, as the baseline's)."""
    if speedup is None:
        return "—"
    lo, hi = interval or (None, None)
    return f"{speedup:.2f}x" + (f" ({lo:.2f}–{hi:.2f})" if lo is not None and lo != hi else "")


def short_verdict(verdict: str | None, speedup: float | None, firm: bool = True) -> str:
    """'faster by 77%' / 'slower by 8%' / 'no measurable difference' from a comparison's verdict and speed-up;
    a verdict a rerun would not reliably repeat (not firm: stats.rerun_agreement) ends in '?'."""
    if not verdict:
        return "—"
    mark = "" if firm else " ?"
    if verdict == FASTER and speedup is not None:
        return f"faster by {100 * (speedup - 1):.0f}%{mark}"
    if verdict == SLOWER and speedup is not None:
        return f"slower by {100 * (1 - speedup):.0f}%{mark}"
    return verdict + mark


def rung_label(rung: Rung) -> str:
    if rung.name == "baseline":     # the base recipe's precision: fp32 unless the ablation starts from another
        run = rung.repeats[0] if rung.repeats else {}
        if run.get("session") is False and not run.get("frameworks"):
            return "baseline (the script's own settings)"     # no recipe reaches it: it runs its own precision
        return f"baseline ({rung.recipe.precision})"
    if rung.name.startswith("baseline-seed"):
        return f"baseline (seed {rung.recipe.seed}, for the noise band)"
    if "precision_level" in rung.changes:       # a precision-level rung: its name says the dtype already
        return f"{rung.name} ({opt_level(rung.recipe)})"
    if rung.script:                             # a rung of the script's own flags: what it adds to the command
        words = [f"{k}={v}" for k, v in rung.script["env"].items()] + rung.script["args"]
        return f"+{rung.name} ({shlex.join(words)})"
    extra = f" ({rung.changes['precision']})" if "precision" in rung.changes else ""
    return f"+{rung.name}{extra}"


def roofs_text(ceilings: dict[str, float], settings: dict, sep: str = " ") -> str:
    """'fp32 (TF32 kernels) 378,000 GFLOP/s, bf16 ...': each measured roof by the dtype its rungs run in; an fp32
    run whose kernels use TF32 (a conv net on CUDA by default) is measured against TF32's roof."""
    def label(key: str) -> str:
        return "fp32 (TF32 kernels)" if key == "fp32" and settings.get("fp32_roof") == "tf32" else key
    return ", ".join(f"{label(k)}{sep}{v / 1e9:,.0f} GFLOP/s" for k, v in ceilings.items())


# An interval a reader can use: its half-width under the value (a rate), its ends within this factor of each other
# (a speed-up: 0.5x-2x already spans "twice as slow" to "twice as fast"). Past either, the noise rests on too few
# repeats to bound anything, and the table says so instead of printing the bound.
READABLE_SPAN = 4.0
TOO_FEW = "too few repeats to judge"


def readable(r) -> bool:
    """Whether a rung's rate and speed-up intervals bound anything (READABLE_SPAN)."""
    if r.throughput and r.throughput_spread is not None and r.throughput_spread >= r.throughput:
        return False
    lo, hi = (r.speedup_interval or [None, None])[:2]
    return not (lo is not None and hi is not None and (lo <= 0 or hi / lo > READABLE_SPAN))


def repeats_needed(r) -> str:
    """'; 5 repeats would do': the repeats that would detect a 10% difference at the noise measured, if known."""
    wanted = ((r.noise or {}).get("repeats_for") or {})
    return f"; {repeats_advice(next(iter(wanted.values())))}" if wanted else ""


MANY_REPEATS = 20   # past this the noise, not the repeats, is the problem: the advice is a quieter machine


def repeats_advice(repeats: int) -> str:
    """'--repeats 5 would do', or, where the noise would need more than MANY_REPEATS, a quieter machine."""
    if repeats > MANY_REPEATS:
        return f"at this noise more than {MANY_REPEATS} repeats would be needed: rerun on a quieter machine"
    return f"--repeats {repeats} would do"
