"""One device technique per check, each through the code a real run uses: the batch transfer and the
prefetcher (data/device.py, techniques/transfer.py and prefetch.py), channels_last and cudnn.benchmark (the
Session's build_state and the runtime flags), torch.compile and the fused optimizer (build_state with the
recipe's switch), and JPEG decoding on the GPU."""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ..data.device import build_device_batches
from ..models import resnet9
from ..recipe import Recipe
from ..session import build_state, seed_everything
from ..techniques import owner, rung_table
from ..techniques.precision import auto_amp_dtype
from ..techniques.runtime import apply_runtime_flags
from .common import Clock, interleaved_medians, short_run, step_fn
from .judges import (CHANNELS_LAST_GAIN, CUDNN_FIXED_GAIN, FUSED_MAX_DIFF, Verdict, judge_close, judge_compile,
                     judge_gain, judge_host_blocking, judge_jpeg, judge_overlap, judge_wait)

COPY_BYTES = 64 * 2**20        # one batch: 64 MiB of uint8 pixels, a few milliseconds over PCIe or NVLink-C2C
BATCHES = 8                    # batches per timed pass of the prefetcher


def pinned_batches(n: int, nbytes: int = COPY_BYTES) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(uint8 images, labels) in page-locked memory, as a DataLoader with pin_memory=True hands them out."""
    side = int((nbytes / 3) ** 0.5)
    return [(torch.randint(0, 256, (1, 3, side, side), dtype=torch.uint8).pin_memory(),
             torch.zeros(1, dtype=torch.long).pin_memory()) for _ in range(n)]


def host_and_device_seconds(batches, recipe: Recipe, device: torch.device) -> tuple[float, float]:
    """(seconds the host spent in the transfer of one batch, seconds the copy took on the device), medians."""
    hosts, copies = [], []
    for _ in range(5):
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iterator = iter(build_device_batches(batches[:1], recipe, device))
        start.record()
        t0 = time.perf_counter()
        next(iterator)                             # the loader path's copy (DeviceBatches.to_device)
        hosts.append(time.perf_counter() - t0)
        end.record()
        end.synchronize()
        copies.append(start.elapsed_time(end) / 1e3)
    return statistics.median(hosts), statistics.median(copies)


def check_non_blocking(ctx) -> Verdict:
    batches = pinned_batches(1)
    nb = host_and_device_seconds(batches, Recipe(non_blocking=True, pin_memory=True), ctx.device)
    blocking = host_and_device_seconds(batches, Recipe(non_blocking=False, pin_memory=True), ctx.device)
    return judge_host_blocking(nb[0], nb[1], blocking[0], blocking[1])


def calibrated_compute(device: torch.device, seconds: float):
    """A chain of matmuls on the current stream that takes about `seconds` on this GPU."""
    a = torch.randn(2048, 2048, device=device) / 2048 ** 0.5      # scaled: the chain's values stay finite
    clock = Clock(device)
    one = clock.median(lambda: a @ a, repeats=5)
    count = max(1, round(seconds / max(one, 1e-6)))

    def compute(_batch=None) -> None:
        x = a
        for _ in range(count):
            x = x @ a
    return compute


def timed_pass(batches, recipe: Recipe, device: torch.device, compute) -> float:
    """One pass over `batches` through the run's transfer (plain or prefetched), `compute` on each."""
    def work() -> None:
        for batch in build_device_batches(batches, recipe, device):
            compute(batch)
    return Clock(device).median(work, repeats=3, warmup=1)


def check_prefetch(ctx) -> Verdict:
    dev = ctx.device
    batches = pinned_batches(BATCHES)
    plain = Recipe(non_blocking=True, pin_memory=True)          # copy and compute on one stream: serial
    copy_s = timed_pass(batches, plain, dev, lambda b: None) / BATCHES
    compute = calibrated_compute(dev, copy_s)
    compute_s = Clock(dev).median(compute)
    serial = timed_pass(batches, plain, dev, compute) / BATCHES
    overlapped = timed_pass(batches, Recipe(prefetch=True), dev, compute) / BATCHES
    return judge_overlap(serial, overlapped, copy_s, compute_s)


def conv_state(ctx, **switches):
    """resnet9 under the device's mixed precision, built by the Session with these switches, and a batch
    laid out as the data path lays it out."""
    recipe = Recipe(precision=auto_amp_dtype(ctx.device), optimizer="sgd", **switches)
    apply_runtime_flags(recipe, ctx.device)
    seed_everything(0)
    state = build_state(resnet9(10), recipe, ctx.device)
    x = torch.randn(256, 3, 32, 32, device=ctx.device)
    x = x.contiguous(memory_format=torch.channels_last) if recipe.channels_last else x
    return state, (x, torch.randint(0, 10, (256,), device=ctx.device))


def check_channels_last(ctx) -> Verdict:
    clock = Clock(ctx.device)
    off, off_batch = conv_state(ctx)
    on, on_batch = conv_state(ctx, channels_last=True)
    laid_out = next(on.model.parameters()).is_contiguous(memory_format=torch.channels_last)
    times = interleaved_medians({"off": step_fn(off, off_batch, 5), "on": step_fn(on, on_batch, 5)}, clock)
    verdict = judge_gain(times["off"] / 5, times["on"] / 5, CHANNELS_LAST_GAIN, "channels_last")
    if not laid_out:
        return Verdict(False, verdict.figure, verdict.unit, "the conv weights are not channels_last; " + verdict.detail)
    return verdict


def check_cudnn_fixed(ctx) -> Verdict:
    """Interleaved: the flag is process-wide and read at each conv call, so it is switched between passes."""
    clock = Clock(ctx.device)
    state, batch = conv_state(ctx)
    steps = step_fn(state, batch, 5)
    previous = torch.backends.cudnn.benchmark

    def with_flag(flag: bool):
        def work() -> None:
            apply_runtime_flags(Recipe(cudnn_benchmark=flag), ctx.device)
            steps()
        return work
    try:
        times = interleaved_medians({"off": with_flag(False), "on": with_flag(True)}, clock)
    finally:
        torch.backends.cudnn.benchmark = previous
    return judge_gain(times["off"] / 5, times["on"] / 5, CUDNN_FIXED_GAIN, "cudnn.benchmark, fixed shapes")


def check_compile(ctx) -> Verdict:
    import torch._dynamo

    from ..probe import compile_counters

    base = Recipe(lr=5e-3, weight_decay=0.0)
    eager = short_run(base, ctx.device, steps=8)
    torch._dynamo.reset()          # a fresh compile even when this process compiled the same code before
    seen: dict[int, dict] = {}

    def count(_state, step: int) -> None:     # the counters after the first step (the compile) and the last
        seen[step] = compile_counters() or {}
    before = compile_counters() or {}
    t0 = time.perf_counter()
    compiled = short_run(base.replace(compile=True), ctx.device, steps=8, plant=count)
    seconds = time.perf_counter() - t0
    first, last = seen[0], seen[max(seen)]
    frames = first.get("frames", 0) - before.get("frames", 0)
    breaks = last.get("graph_breaks", 0) - before.get("graph_breaks", 0)
    recompiles = last.get("frames", 0) - first.get("frames", 0)
    verdict = judge_compile(eager.losses, compiled.losses, frames, breaks, recompiles)
    return Verdict(verdict.ok, verdict.figure, verdict.unit, f"{verdict.detail}; 8 compiled steps took {seconds:.1f} s "
                                                             "(compilation included)")


def check_fused_adamw(ctx) -> Verdict:
    """The `fused` rung as declared, against the same switch's for-loop update, read back through its
    declaration (OptimizerSwitch.state)."""
    changes = rung_table()["fused"]
    base = Recipe(optimizer="adamw", lr=5e-3)
    loop = short_run(base.replace(**{name: "for-loop" for name in changes}), ctx.device, steps=10)
    fused = short_run(base.replace(**changes), ctx.device, steps=10)
    built = {name: owner(name).optimizer.state(fused.state.optimizer.optimizer) for name in changes}
    if built != changes:
        return Verdict(False, None, "", f"the optimizer was built as {built}, not {changes}")
    diff = max(float((a.detach() - b.detach()).abs().max())
               for a, b in zip(loop.state.model.parameters(), fused.state.model.parameters()))
    return judge_close(diff, FUSED_MAX_DIFF, "fused vs for-loop AdamW weights after 10 steps")


def sample_jpeg() -> bytes:
    """A real photograph that ships with scikit-learn (a dependency): nothing is downloaded."""
    from importlib.resources import files

    return (files("sklearn.datasets") / "images" / "china.jpg").read_bytes()


def check_nvjpeg(ctx) -> Verdict:
    from torchvision.io import decode_jpeg

    data = torch.frombuffer(bytearray(sample_jpeg()), dtype=torch.uint8)
    cpu = decode_jpeg(data)
    gpu = decode_jpeg(data, device=ctx.device)
    torch.cuda.synchronize(ctx.device)
    mean_diff = float((cpu.float() - gpu.cpu().float()).abs().mean()) if cpu.shape == gpu.shape else float("nan")
    verdict = judge_jpeg(list(cpu.shape), list(gpu.shape), str(gpu.device), mean_diff)
    rate = Clock(ctx.device).median(lambda: decode_jpeg([data] * 16, device=ctx.device))
    detail = f"{verdict.detail}; torchvision nvJPEG {16 / rate:,.0f} images/s in batches of 16"
    try:                                   # torchcodec, where it is installed, decodes on the GPU too
        from torchcodec.decoders import decode_jpeg as codec_decode
    except Exception as exc:               # absent, or its FFmpeg libraries are missing: said, not failed
        return Verdict(verdict.ok, verdict.figure, verdict.unit, f"{detail}; torchcodec not usable here ({exc})")
    codec = codec_decode(sample_jpeg(), device=ctx.device).cpu()
    codec_diff = float((cpu.float() - codec.float()).abs().mean()) if codec.shape == cpu.shape else float("nan")
    codec_verdict = judge_jpeg(list(cpu.shape), list(codec.shape), str(ctx.device), codec_diff)
    return Verdict(verdict.ok and codec_verdict.ok, verdict.figure, verdict.unit,
                   f"{detail}; torchcodec: {codec_verdict.detail}")


class SlowSamples(torch.utils.data.Dataset):
    """A dataset that sleeps for every sample: a planted slow loader (decoding on one core, a slow disk)."""

    def __init__(self, base, seconds: float) -> None:
        self.base, self.seconds = base, seconds

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return self.base[index]


def wait_shares(ctx, dataset, batch_size: int, steps: int = 12) -> tuple[float, float, float]:
    """(the wait's share of the timed steps on the device's timeline, the copy's share, the host's share of
    time in next()): `steps` steps of resnet9 in fp32 through the Session's input path (a DataLoader without
    pinned memory, the plain copy, state.batches' clock, the built-in loop). The host's share is what the step
    clock read before it read the device: the measure a compute-bound model fed from pageable memory fooled."""
    from torch.utils.data import DataLoader

    from ..engine import train_one_epoch
    from ..measure import Meter, Timing

    recipe = Recipe(optimizer="sgd")
    seed_everything(0)
    state = build_state(resnet9(10), recipe, ctx.device)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True)
    batches = build_device_batches(loader, recipe, ctx.device)
    host: list[float] = []
    timed = HostTimed(batches, host)
    meter = Meter(ctx.device, log_every=4, timer=state.timer)
    train_one_epoch(state, timed, nn.functional.cross_entropy, meter)
    state.timer.read()
    timing = Timing.from_steps(state.timer.steps[:steps], min_skip=2)
    kept = host[timing.warmup_steps:timing.warmup_steps + len(timing.step_seconds)]
    return (timing.data_wait_s / timing.seconds, (timing.copy_s or 0.0) / timing.seconds,
            sum(kept) / timing.seconds)


class HostTimed:
    """Device batches with the host's time in each next() recorded beside the step clock's (wait_shares). It
    passes the clock's arrival mark through, as the device-batch object it wraps would."""

    def __init__(self, batches, host: list[float]) -> None:
        self.batches, self.host = batches, host

    @property
    def on_fetched(self):
        return self.batches.on_fetched

    @on_fetched.setter
    def on_fetched(self, mark) -> None:
        self.batches.on_fetched = mark

    def __iter__(self):
        iterator = iter(self.batches)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.host.append(time.perf_counter() - t0)
            yield batch


def check_wait_pageable(ctx) -> Verdict:
    """A compute-bound step fed float batches from pageable memory: the blocking copy waits for the step's queued
    kernels, which the host's clock counted as waiting for data; the device's timeline does not."""
    images = torch.randn(16 * 256, 3, 64, 64)
    dataset = torch.utils.data.TensorDataset(images, torch.randint(0, 10, (len(images),)))
    wait, copy, host = wait_shares(ctx, dataset, 256)
    return judge_wait(wait, copy, host, planted=False)


def check_wait_slow_loader(ctx) -> Verdict:
    """The same step fed by a loader that sleeps 2 ms a sample: the device idles for input, and the wait says so."""
    images = torch.randn(16 * 32, 3, 64, 64)
    dataset = SlowSamples(torch.utils.data.TensorDataset(images, torch.randint(0, 10, (len(images),))), 2e-3)
    wait, copy, host = wait_shares(ctx, dataset, 32)
    return judge_wait(wait, copy, host, planted=True)
