"""The selfcheck's verdicts: pure functions from measured numbers to pass or fail, kept apart from the code
that measures them so each can be tested on the CPU with made-up inputs (a pass and a fail case each).

Every threshold is here, with the reason for its value; docs/selfcheck.md lists them for the reader.
No torch import: a verdict is arithmetic on plain numbers.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

# Loss parity with fp32 over a short run: the mean of the last PARITY_TAIL losses may differ from fp32's by this
# fraction. fp16 keeps 10 mantissa bits, bf16 7, so a few dozen steps drift by ~1% and ~3% on the small model;
# the bounds leave room for that and still catch a wrong cast, a missing unscale or a lost update (tens of %).
PARITY_TOLERANCE = {"fp16": 0.05, "bf16": 0.10, "compile": 1e-3}
PARITY_TAIL = 5
LEARNED = 0.8            # the fp32 reference must end below 80% of its first loss, or parity proves nothing
HOST_BLOCKED_MAX = 0.25  # non_blocking from pinned memory: the host waits at most 25% of the copy's device time
CONTROL_BLOCKED_MIN = 0.75   # ...while a blocking copy (the control) makes it wait at least 75% of it
OVERLAP_MIN = 0.5        # the prefetcher hides at least half of the shorter of (copy, compute)
SERIAL_MIN = 0.8         # the serial path must take >= 80% of copy + compute, or it overlapped by itself
CHANNELS_LAST_GAIN = 1.05    # NHWC under mixed precision on a conv net: tensor-core kernels, >= 5% faster
CUDNN_FIXED_GAIN = 0.98      # cudnn.benchmark with fixed shapes: never slower (cuDNN's own pick is often the
                             # best already, so a tie within 2% noise passes; a loss beyond it fails)
FUSED_MAX_DIFF = 1e-5    # fused vs for-loop AdamW: the same arithmetic, reordered: weights within 1e-5 after 10 steps
JPEG_MEAN_DIFF = 2.0     # nvJPEG vs libjpeg: IDCT rounding moves pixels by a level or two, never more on average
DP_MAX_DIFF = 1e-4       # DataParallel vs one device: the same global batch, summed in another order
INPUT_BOUND = 0.20       # the ablation's and the doctor's input-bound line (checks.INPUT_BOUND_SHARE)
REDUCE_TOLERANCE = 1e-4  # a reduced metric vs the mean of the ranks' own values (fp32 sums over ranks)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    figure: float | None = None       # the measured number the verdict turned on
    unit: str = ""
    detail: str = ""


def applicable(needs: dict[str, Any], machine: dict[str, Any], cpu_subset: bool) -> str | None:
    """Why a check cannot run here ("needs CUDA", "1 GPU", ...), or None when it can. `needs`: cuda (bool),
    gpus (int), bf16 (bool), compiler (bool); `machine`: cuda, gpus, bf16, compiler, the facts of this run
    (under --cpu-subset the device is the CPU, so a CUDA machine counts as having no CUDA)."""
    cuda = machine.get("cuda", False) and not cpu_subset
    if needs.get("cuda") and not cuda:
        return "needs CUDA" + (" (--cpu-subset runs on the CPU)" if cpu_subset and machine.get("cuda") else "")
    gpus = needs.get("gpus", 1)
    if gpus > 1 and machine.get("gpus", 0) < gpus:
        count = machine.get("gpus", 0)
        return f"{count} GPU{'' if count == 1 else 's'}"
    if needs.get("bf16") and not machine.get("bf16"):
        return f"no bf16 support on {'this GPU' if cuda else 'this device'}"
    if needs.get("compiler") and not machine.get("compiler"):
        return "no C++ compiler: inductor cannot build kernels here"
    return None


def tail_mean(losses: Sequence[float], tail: int = PARITY_TAIL) -> float:
    return statistics.fmean(losses[-tail:])


def judge_parity(reference: Sequence[float], losses: Sequence[float], tolerance: float) -> Verdict:
    """Losses of a run against the fp32 reference on the same model, data and seed: the mean of the last few
    must be within `tolerance` (relative), and the reference must have learned something."""
    if len(reference) != len(losses) or len(losses) < PARITY_TAIL:
        return Verdict(False, None, "", f"runs of {len(reference)} and {len(losses)} steps cannot be compared")
    if not all(math.isfinite(v) for v in losses):
        bad = next(i for i, v in enumerate(losses) if not math.isfinite(v))
        return Verdict(False, None, "", f"loss not finite at step {bad}")
    ref, got = tail_mean(reference), tail_mean(losses)
    if ref > LEARNED * reference[0]:
        return Verdict(False, None, "", f"the fp32 reference did not learn ({reference[0]:.4f} -> {ref:.4f}): "
                                        "nothing to compare")
    diff = abs(got - ref) / abs(ref)
    text = f"final loss {got:.4f} vs fp32 {ref:.4f} (tolerance {tolerance:.0%})"
    return Verdict(diff <= tolerance, diff, "rel. diff", text)


def judge_scaler(scales: Sequence[float], changed: Sequence[bool], inf_step: int, skipped: int,
                 backoff: float = 0.5) -> Verdict:
    """fp16 loss scaling around one planted inf gradient. `scales[i]`: the scale after step i; `changed[i]`:
    whether step i moved the weights; `skipped`: the precision's own count of skipped steps. Passes when the
    planted step (and only it) was skipped, the scale backed off by `backoff` there, and grew back later."""
    if not 0 < inf_step < len(scales) - 1 or len(changed) != len(scales):
        return Verdict(False, None, "", "the trace does not reach past the planted step")
    before, after = scales[inf_step - 1], scales[inf_step]
    later = max(scales[inf_step + 1:])
    problems = []
    if changed[inf_step]:
        problems.append(f"step {inf_step} (inf gradient) still moved the weights")
    others = [i for i, moved in enumerate(changed) if not moved and i != inf_step]
    if others:
        problems.append(f"step(s) {others[:5]} without a planted inf were skipped too")
    if not math.isclose(after, before * backoff, rel_tol=1e-6):
        problems.append(f"the scale went {before:g} -> {after:g} at the inf, not x{backoff:g}")
    if later <= after:
        problems.append(f"the scale never grew back after {after:g}")
    if skipped != 1:
        problems.append(f"{skipped} skipped step(s) counted, not 1")
    text = f"scale {before:g} -> {after:g} at the inf -> {later:g} later; {skipped} step skipped"
    return Verdict(not problems, later / after if after else None, "x regrowth",
                   "; ".join(problems) if problems else text)


def judge_masters(weight_dtypes: Sequence[str], master_dtypes: Sequence[str], copy_diff: float) -> Verdict:
    """O2: half weights in the model, fp32 masters in the optimizer, and the half weights equal to the masters
    rounded to half after the last step (`copy_diff`: the largest difference)."""
    half = [d for d in weight_dtypes if d in ("float16", "bfloat16")]
    if not half:
        return Verdict(False, None, "", f"no half weights in the model ({sorted(set(weight_dtypes))})")
    if len(master_dtypes) < len(half):
        return Verdict(False, None, "", f"{len(half)} half weights but {len(master_dtypes)} master copies")
    wrong = sorted(set(d for d in master_dtypes if d != "float32"))
    if wrong:
        return Verdict(False, None, "", f"the optimizer steps {wrong} tensors, not fp32 masters")
    if copy_diff != 0.0:
        return Verdict(False, copy_diff, "max diff", f"half weights differ from their rounded masters by {copy_diff:g}")
    return Verdict(True, copy_diff, "max diff", f"{len(half)} half weights, {len(master_dtypes)} fp32 masters, "
                                                 "copied back exactly")


def judge_host_blocking(nb_host_s: float, nb_copy_s: float, block_host_s: float, block_copy_s: float) -> Verdict:
    """non_blocking + pin_memory: the host returns before a pinned non_blocking copy ends (waits for at most
    HOST_BLOCKED_MAX of its device time), while a blocking copy, the control, holds it for most of it."""
    if nb_copy_s <= 0 or block_copy_s <= 0:
        return Verdict(False, None, "", "the copies took no measurable device time")
    nb, control = nb_host_s / nb_copy_s, block_host_s / block_copy_s
    text = (f"host blocked {nb:.0%} of a {nb_copy_s * 1e3:.2f} ms non_blocking copy, {control:.0%} of a blocking one "
            f"(limits {HOST_BLOCKED_MAX:.0%} / {CONTROL_BLOCKED_MIN:.0%})")
    if control < CONTROL_BLOCKED_MIN:
        return Verdict(False, nb, "blocked", "the control (a blocking copy) did not block: the measurement cannot "
                                             "tell the two apart; " + text)
    return Verdict(nb <= HOST_BLOCKED_MAX, nb, "blocked", text)


def judge_overlap(serial_s: float, overlapped_s: float, copy_s: float, compute_s: float,
                  minimum: float = OVERLAP_MIN) -> Verdict:
    """The prefetcher's side stream: of the shorter of (copy, compute), the share the overlapped loop saves over
    the serial one (copy then compute on one stream) must be at least `minimum`."""
    shorter = min(copy_s, compute_s)
    if shorter <= 0:
        return Verdict(False, None, "", "copy or compute took no measurable time")
    if serial_s < SERIAL_MIN * (copy_s + compute_s):
        return Verdict(False, None, "", f"the serial loop ({serial_s * 1e3:.1f} ms) already hid the copy "
                                        f"({copy_s * 1e3:.1f} + {compute_s * 1e3:.1f} ms): nothing to compare with")
    hidden = max(0.0, min(1.0, (serial_s - overlapped_s) / shorter))
    text = (f"serial {serial_s * 1e3:.1f} ms, prefetched {overlapped_s * 1e3:.1f} ms (copy {copy_s * 1e3:.1f}, compute "
            f"{compute_s * 1e3:.1f}): {hidden:.0%} of the copy hidden (limit {minimum:.0%})")
    return Verdict(hidden >= minimum, hidden, "hidden", text)


def judge_gain(base_s: float, new_s: float, minimum: float, what: str) -> Verdict:
    """A switch's speed-up: base step time over the new one, at least `minimum`."""
    if base_s <= 0 or new_s <= 0:
        return Verdict(False, None, "", "a step took no measurable time")
    gain = base_s / new_s
    text = f"{what}: {base_s * 1e3:.2f} -> {new_s * 1e3:.2f} ms per step ({gain:.2f}x, limit {minimum:.2f}x)"
    return Verdict(gain >= minimum, gain, "x", text)


def judge_flagged(planted: str, control: str, finding: str, expect: str = "problem") -> Verdict:
    """The doctor on a planted mistake and on a clean control: the planted one must get `expect` ("problem", or
    "measured" where the device makes it harmless), the control must be neither (a check that flags everything
    proves nothing)."""
    ok = planted == expect and control not in ("problem", expect)
    return Verdict(ok, None, "", f"{finding}: planted case {planted!r} (expected {expect!r}), clean control "
                                 f"{control!r}")


def judge_compile(eager: Sequence[float], compiled: Sequence[float], frames: int, breaks: int, recompiles: int,
                  tolerance: float = PARITY_TOLERANCE["compile"]) -> Verdict:
    """torch.compile: something was compiled, without graph breaks or recompiles on fixed shapes, and the
    compiled steps give the eager losses (fusion reorders float sums: a relative `tolerance` per step)."""
    if len(eager) != len(compiled) or not eager:
        return Verdict(False, None, "", "no steps to compare")
    diff = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(eager, compiled))
    problems = [p for p, bad in ((f"{frames} frames compiled", frames < 1), (f"{breaks} graph break(s)", breaks > 0),
                                 (f"{recompiles} recompile(s) on fixed shapes", recompiles > 0),
                                 (f"losses differ by {diff:.2g} (tolerance {tolerance:g})", diff > tolerance)) if bad]
    text = f"{frames} frame(s) compiled, no breaks or recompiles, losses within {diff:.2g} of eager"
    return Verdict(not problems, diff, "rel. diff", "; ".join(problems) if problems else text)


def judge_close(max_diff: float, tolerance: float, what: str) -> Verdict:
    ok = math.isfinite(max_diff) and max_diff <= tolerance
    return Verdict(ok, max_diff, "max diff", f"{what}: largest difference {max_diff:.3g} (tolerance {tolerance:g})")


def judge_jpeg(cpu_shape: Sequence[int], gpu_shape: Sequence[int], gpu_device: str, mean_diff: float) -> Verdict:
    if list(cpu_shape) != list(gpu_shape):
        return Verdict(False, None, "", f"shapes differ: CPU {list(cpu_shape)}, GPU {list(gpu_shape)}")
    if not gpu_device.startswith("cuda"):
        return Verdict(False, None, "", f"the device decode returned a tensor on {gpu_device}")
    ok = mean_diff <= JPEG_MEAN_DIFF
    return Verdict(ok, mean_diff, "levels", f"mean difference {mean_diff:.2f} of 255 from the CPU decode "
                                            f"(limit {JPEG_MEAN_DIFF:g})")


def judge_set_epoch(orders: Sequence[Sequence[Sequence[int]]]) -> Verdict:
    """DistributedSampler with set_epoch: `orders[rank][epoch]` the sample indices a rank saw. Within an epoch
    the ranks' shards must be disjoint; from one epoch to the next the order must change (set_epoch called)."""
    if not orders or len(orders[0]) < 2:
        return Verdict(False, None, "", "fewer than two epochs recorded")
    epochs = len(orders[0])
    for e in range(epochs):
        seen: set[int] = set()
        for rank in orders:
            shard = set(rank[e])
            if seen & shard:
                return Verdict(False, None, "", f"epoch {e}: ranks saw the same samples (no distributed sampler)")
            seen |= shard
    same = [e for e in range(1, epochs) if all(list(r[e]) == list(r[e - 1]) for r in orders)]
    if same:
        return Verdict(False, None, "", f"epoch {same[0]} repeated the previous epoch's order (set_epoch not called)")
    return Verdict(True, float(len(orders)), "ranks", f"{len(orders)} disjoint shards, reshuffled in each of "
                                                      f"{epochs} epochs")


def window_means(losses: Sequence[float], every: int) -> list[float]:
    return [statistics.fmean(losses[i:i + every]) for i in range(0, len(losses), every)]


def judge_reduced(local: Sequence[Sequence[float]], records: Sequence[Sequence[float]], every: int,
                  tolerance: float = REDUCE_TOLERANCE) -> Verdict:
    """Metrics reduced over ranks: `local[rank]` each rank's per-step losses, `records[rank]` the windowed values
    the rank logged (tf.log, `every` steps a window). Every rank must log, for each window, the mean over
    ranks of the ranks' own window means."""
    expected = [statistics.fmean(ws) for ws in zip(*(window_means(steps, every) for steps in local))]
    worst = 0.0
    for rank, got in enumerate(records):
        if len(got) != len(expected):
            return Verdict(False, None, "", f"rank {rank} logged {len(got)} windows, expected {len(expected)}")
        worst = max([worst] + [abs(g - e) / max(abs(e), 1e-12) for g, e in zip(got, expected)])
    return Verdict(worst <= tolerance, worst, "rel. diff", f"{len(records)} ranks logged {len(expected)} windows; "
                   f"largest difference from the mean over ranks {worst:.2g} (tolerance {tolerance:g})")


def judge_nonfinite_stop(errors: Sequence[str | None], world: int) -> Verdict:
    """A NaN planted on one rank: every rank must stop with the non-finite error, at the same step."""
    if len(errors) != world:
        return Verdict(False, None, "", f"{len(errors)} of {world} ranks reported")
    steps = []
    for rank, error in enumerate(errors):
        found = re.search(r"at step (\d+)", error or "")
        if not (error or "").startswith("NonFiniteLossError") or not found:
            return Verdict(False, None, "", f"rank {rank} did not stop on the non-finite loss: {error!r}")
        steps.append(int(found.group(1)))
    if len(set(steps)) != 1:
        return Verdict(False, None, "", f"the ranks stopped at different steps: {steps}")
    return Verdict(True, float(steps[0]), "step", f"all {world} ranks stopped at step {steps[0]}")


def judge_rung_measured(rungs: Sequence[dict[str, Any]], name: str) -> Verdict:
    """The ablation on CUDA: rung `name` must be run and timed (effect "measured"), not ruled out as no effect."""
    rung = next((r for r in rungs if r["name"] == name), None)
    if rung is None:
        return Verdict(False, None, "", f"no {name} rung in the ladder")
    if rung["effect"] != "measured" or rung["status"] not in ("done", "partial") or rung.get("speedup") is None:
        return Verdict(False, None, "", f"{name}: effect {rung['effect']}, status {rung['status']}"
                                        + (f" ({rung['reason']})" if rung.get("reason") else ""))
    return Verdict(True, rung["speedup"], "x", f"{name} measured: {rung['speedup']:.2f}x the baseline")


def judge_peaks(rungs: Sequence[dict[str, Any]]) -> Verdict:
    """The allocator's peak per rung: every measured rung has its own positive peak, and they are not all one
    number (a peak read once and copied to every rung would be)."""
    measured = [r for r in rungs if r["status"] in ("done", "partial")]
    if len(measured) < 2:
        return Verdict(False, None, "", f"{len(measured)} measured rung(s): nothing to compare")
    missing = [r["name"] for r in measured if not r.get("peak_memory_bytes")]
    if missing:
        return Verdict(False, None, "", f"no peak memory for {', '.join(missing)}")
    peaks = [r["peak_memory_bytes"] for r in measured]
    text = ", ".join(f"{r['name']} {r['peak_memory_bytes'] / 2**20:.0f} MiB" for r in measured)
    if len(set(peaks)) == 1:
        return Verdict(False, None, "", f"every rung has the same peak: {text}")
    return Verdict(True, max(peaks) / min(peaks), "x max/min", text)


def judge_wait(wait: float, copy: float, host: float, planted: bool) -> Verdict:
    """The step clock's wait for input on the device's timeline. A compute-bound step fed from pageable memory
    (planted False) must not read as input-bound, whatever the host's clock says; a planted slow loader must."""
    detail = (f"device idle for input {100 * wait:.0f}% of the steps, copy {100 * copy:.0f}%; the host's time in "
              f"next() {100 * host:.0f}%")
    ok = wait > INPUT_BOUND if planted else wait < INPUT_BOUND
    return Verdict(ok, wait, "wait share", detail + ("" if ok else (": the planted loader was not seen" if planted
                                                                    else ": compute counted as waiting")))
