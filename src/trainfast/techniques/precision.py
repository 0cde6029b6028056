"""Precision: one interface so the engine step never branches on dtype or level.

Levels (Apex's opt levels, rebuilt on native torch because Apex's amp has been deleted upstream and
torch.amp only covers O1):
  O0 `fp32`                    every hook is the plain PyTorch call (bit-identical to a plain loop)
  O1 `autocast` bf16 | fp16    fp32 weights, torch.autocast picks a dtype per op; fp16 adds a GradScaler
  O2 `master`   bf16 | fp16    weights and activations in half, BatchNorm/LayerNorm/GroupNorm kept fp32 (Apex's
                               keep_batchnorm_fp32); the optimizer owns fp32 master copies: half gradients are
                               copied and unscaled into fp32, clipped, stepped (weight decay too) in fp32, and the
                               result copied back to the half weights (Apex O2's recipe)
  O3 `pure`     bf16 | fp16    everything half, the optimizer steps the half weights: no master copy. Risky,
                               kept for comparison: an update smaller than half precision's spacing is lost.
fp16 levels use dynamic loss scaling (skip the step on inf/NaN gradients and halve the scale, double it after
`growth_interval` good steps): torch.amp.GradScaler for O1, our own `DynamicLossScaler` for O2/O3, because
GradScaler refuses to unscale fp16 gradients (O3) and O2 unscales after the copy into fp32. bf16 has fp32's
exponent range, so it needs no scaling.

The interface: `prepare_model` (build time: dtype conversion and the input/output casts), `optimizer_params`
(what the optimizer and the clipper see), `forward_context`, `cast_outputs` (what the model hands the loss),
`backward`, `scales_loss` (whether a plain loss.backward() would be wrong), `unscale_` (before clipping), `step`,
`metrics`, `state_dict`/`load_state_dict` (saved with checkpoints).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import torch
from torch import nn

from .base import ACTS, Effect
from .switch import AMP, RungSpec, Switch
from .transfer import map_tensors

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LEVELS = ("autocast", "master", "pure")
OPT_LEVELS = {"autocast": "O1", "master": "O2", "pure": "O3"}

# Alternative ablation rungs, one per (level, dtype); opt-in with --switches, never in the default ladder.
LEVEL_RUNGS: dict[str, dict[str, str]] = {
    f"{level}-{dtype}": {"precision": dtype, "precision_level": level}
    for dtype in ("bf16", "fp16") for level in LEVELS
}

# A healthy fp16 run skips a handful of steps while the scale settles from 2**16; 20 skips in a row take the
# scale from 2**16 down to 2**-4, which only happens when the gradients are non-finite at any scale (a NaN in
# the forward pass, an overflowing activation): the run is no longer training.
COLLAPSE_AFTER = 20

# Normalization layers whose statistics need fp32 (Apex keep_batchnorm_fp32). BatchNorm's CPU and CUDA kernels
# take a half input with fp32 weights and return the input's dtype. LayerNorm's and GroupNorm's take mixed dtypes
# on the CPU only: on CUDA they need one dtype ("expected scalar type Half but found Float"), so these run in fp32,
# their input cast up and their output back down, which is the arithmetic the mixed kernels do inside.
CAST_NORMS = (nn.LayerNorm, nn.GroupNorm)
FP32_NORMS = (nn.modules.batchnorm._NormBase, *CAST_NORMS)


def opt_level(recipe) -> str:
    """O0..O3 for a recipe (report labels)."""
    return "O0" if recipe.precision == "fp32" else OPT_LEVELS[recipe.precision_level]


def level_note(recipe) -> str | None:
    """A warning for the report, for the levels that are risky by construction."""
    if recipe.precision != "fp32" and recipe.precision_level == "pure":
        note = (f"risky (O3): weights, gradients and optimizer state all in {recipe.precision} with no fp32 master "
                f"copy; updates smaller than {recipe.precision}'s spacing are lost. Kept for comparison with O2.")
        if recipe.precision == "fp16" and recipe.optimizer == "adamw":
            # Measured: one AdamW step on fp16 parameters turns a 1e-4 gradient into -inf and a zero one into NaN.
            note += (" With AdamW in fp16, eps=1e-8 and squared gradients below ~2.4e-4 underflow to 0, so the first "
                     "update divides by zero (inf/NaN): expect this rung to stop at step 1.")
        return note
    return None


class Precision:
    """fp32 (O0): every hook is the plain PyTorch call, so an fp32 run is bit-identical to a plain loop."""

    name = "fp32"
    level = "O0"
    dtype = torch.float32

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Build time, after the model is on its device and in its memory format, before the optimizer."""
        return model

    def optimizer_params(self, model: nn.Module) -> list[torch.Tensor]:
        """The tensors the optimizer updates and the clipper clips (O2: the fp32 masters): one per trainable
        parameter, in `model.parameters()` order (session/ maps a user's optimizer onto them by position)."""
        return [p for p in model.parameters() if p.requires_grad]

    def forward_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def cast_outputs(self, outputs: Any) -> Any:
        """What the model hands the loss. The identity except under O1 (see Autocast)."""
        return outputs

    @property
    def scales_loss(self) -> bool:
        """True when gradients must come from `backward` (fp16's loss scaling): a plain loss.backward() would
        leave them unscaled and the scaler would then divide them by the scale."""
        return False

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the optimizer's gradients to their true scale (before clipping). No-op without a scaler."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def effect(self, device: torch.device) -> Effect:
        return ACTS


class SkipTracker:
    """Counts skipped steps and the longest run of consecutive skips on the device (no sync per step), and
    reads the run length once every `collapse_after` steps to warn, once, that the scale keeps collapsing."""

    def __init__(self, device: torch.device, collapse_after: int = COLLAPSE_AFTER) -> None:
        self.collapse_after = collapse_after
        self.skipped = torch.zeros((), dtype=torch.long, device=device)
        self.run = torch.zeros((), dtype=torch.long, device=device)
        self.longest = torch.zeros((), dtype=torch.long, device=device)
        self.steps = 0
        self.warned = False

    def record(self, skipped_now: torch.Tensor, scale: torch.Tensor) -> None:
        skipped_now = skipped_now.reshape(()).long()
        self.skipped += skipped_now
        self.run.mul_(skipped_now).add_(skipped_now)        # +1 on a skip, back to 0 on a good step
        torch.maximum(self.longest, self.run, out=self.longest)
        self.steps += 1
        if not self.warned and self.steps % self.collapse_after == 0 and int(self.longest) >= self.collapse_after:
            self.warned = True
            warnings.warn(
                f"fp16 loss scale collapsed: {int(self.longest)} consecutive optimizer steps were skipped on inf/NaN "
                f"gradients (scale now {float(scale):g}); the model is not training. Look for non-finite values in "
                f"the inputs or the forward pass, lower the learning rate, or use bf16.", RuntimeWarning, stacklevel=3)

    def metrics(self) -> dict[str, int]:
        return {"skipped_steps": int(self.skipped), "longest_skip_run": int(self.longest)}

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": int(self.skipped), "skip_run": int(self.run), "longest_skip_run": int(self.longest)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped.fill_(int(state.get("skipped_steps", 0)))
        self.run.fill_(int(state.get("skip_run", 0)))
        self.longest.fill_(int(state.get("longest_skip_run", 0)))


class Scaled(Precision):
    """Reporting and checkpointing shared by the levels that carry a loss scaler (`self.scaler`, GradScaler or
    DynamicLossScaler: the same is_enabled/get_scale/state_dict API) and a SkipTracker (`self.skips`)."""

    scaler: Any
    skips: SkipTracker

    @property
    def scales_loss(self) -> bool:
        return self.scaler.is_enabled()

    def metrics(self) -> dict[str, float]:
        if not self.scaler.is_enabled():
            return {}
        return {"loss_scale": float(self.scaler.get_scale()), **self.skips.metrics()}

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), **self.skips.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.skips.load_state_dict(state)


class Autocast(Scaled):
    """O1: torch.autocast in bf16 or fp16. fp16 gradients underflow without loss scaling, so fp16 carries a
    torch.amp.GradScaler: scale the loss, unscale before clipping, skip steps with inf/NaN grads."""

    level = "O1"

    def __init__(self, device: torch.device, dtype: torch.dtype, **scaler_args: Any) -> None:
        super().__init__(device)
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16, **scaler_args)
        self.skips = SkipTracker(device)

    def forward_context(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype)

    def cast_outputs(self, outputs: Any) -> Any:
        """Half outputs to fp32, so a loss computed outside autocast (a user's loop) sees what autocast's fp32
        ops (cross_entropy, softmax, norms...) would give it inside: they upcast their inputs the same way.
        Costs one cast of the outputs (Accelerate's convert_to_fp32 does the same)."""
        return cast_floats(outputs, torch.float32)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        # scaler.step skips optimizer.step when it found inf/NaN; update() then backs the scale off, so a
        # drop of the (device-side) scale marks a skipped step without reading anything on the host.
        if not self.scaler.is_enabled():
            optimizer.step()
            return
        scale_before = self.scaler._scale.clone()
        self.scaler.step(optimizer)
        self.scaler.update()
        self.skips.record(self.scaler._scale < scale_before, self.scaler._scale)


class DynamicLossScaler:
    """GradScaler's dynamics on any list of gradients, fp16 ones included: the loss is multiplied by `scale`;
    unscaling multiplies the gradients by 1/scale and flags inf/NaN; update() halves the scale on a flagged step
    and doubles it after `growth_interval` clean steps in a row. Uses the same aten kernels as GradScaler
    (device-side, one kernel per list). Disabled (bf16): scale 1, nothing is checked, nothing costs."""

    def __init__(self, device: torch.device, enabled: bool = True, init_scale: float = 2.0**16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.enabled = enabled
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.scale = torch.full((), init_scale if enabled else 1.0, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)

    def is_enabled(self) -> bool:
        return self.enabled

    def get_scale(self) -> float:
        return float(self.scale) if self.enabled else 1.0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """Unscale in place; returns the device-side found-inf flag (None when disabled)."""
        if not self.enabled:
            return None
        found_inf = torch.zeros(1, dtype=torch.float32, device=self.scale.device)
        inv_scale = self.scale.double().reciprocal().float().reshape(1)
        by_device_dtype: dict[tuple, list[torch.Tensor]] = {}
        for g in grads:
            by_device_dtype.setdefault((g.device, g.dtype), []).append(g)
        for group in by_device_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
        return found_inf

    def update(self, found_inf: torch.Tensor) -> None:
        scale, tracker = self.scale.reshape(1), self.growth_tracker.reshape(1)   # views: updated in place
        torch._amp_update_scale_(scale, tracker, found_inf, self.growth_factor, self.backoff_factor,
                                 self.growth_interval)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": float(self.scale), "growth_tracker": int(self.growth_tracker), "enabled": self.enabled,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale.fill_(state["scale"])
        self.growth_tracker.fill_(state["growth_tracker"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval = state["growth_interval"]


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """Cast the floating-point tensors of a (nested) tensor/tuple/list/dict; everything else passes through."""
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, obj)


def cast_around(module: nn.Module, inside: torch.dtype, outside: torch.dtype) -> None:
    """Forward hooks that cast `module`'s floating inputs to `inside` and its outputs to `outside` (hooks, so
    training, evaluation and torch.compile all see them)."""
    module.register_forward_pre_hook(lambda _m, args: cast_floats(args, inside))
    module.register_forward_hook(lambda _m, _args, out: cast_floats(out, outside))


class HalfWeights(Scaled):
    """O2 and O3 share this: the model's weights are half; inputs are cast to half on the way in and outputs
    to fp32 on the way out (Apex's patched forward, here as module hooks so training, evaluation and
    torch.compile all see it), so the loss and its scaling are computed in fp32."""

    keep_norms_fp32 = False

    def __init__(self, device: torch.device, dtype: torch.dtype, **scaler_args: Any) -> None:
        super().__init__(device)
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"
        self.scaler = DynamicLossScaler(device, enabled=dtype == torch.float16, **scaler_args)
        self.skips = SkipTracker(device)
        self._found_inf: torch.Tensor | None = None
        self._unscaled = False

    def prepare_model(self, model: nn.Module) -> nn.Module:
        model.to(self.dtype)
        if self.keep_norms_fp32:
            for module in model.modules():
                if isinstance(module, FP32_NORMS):
                    module.float()
                if isinstance(module, CAST_NORMS):
                    cast_around(module, inside=torch.float32, outside=self.dtype)
        cast_around(model, inside=self.dtype, outside=torch.float32)
        return model

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale_loss(loss).backward()

    def _gather_grads(self) -> None:
        """O2 copies the half gradients into the fp32 masters; O3 has nothing to move."""

    def _after_step(self) -> None:
        """O2 copies the updated masters back into the half weights."""

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if self._unscaled:
            return
        self._gather_grads()
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._found_inf = self.scaler.unscale_(grads)
        self._unscaled = True

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.unscale_(optimizer)
        found_inf, self._found_inf, self._unscaled = self._found_inf, None, False
        if found_inf is None:                       # bf16: no scaler, always step
            optimizer.step()
            self._after_step()
            return
        # The skip decision needs the flag on the host: one sync per step, the same one GradScaler.step makes.
        if not found_inf.item():
            optimizer.step()
            self._after_step()
        self.scaler.update(found_inf)
        self.skips.record(found_inf, self.scaler.scale)


class PureHalf(HalfWeights):
    """O3: the optimizer steps the half weights themselves (its state is half too)."""

    level = "O3"


class MasterWeights(HalfWeights):
    """O2: fp32 master copies of the half weights, owned here and stepped by the optimizer. Norm layers stay
    fp32 and are their own masters. Costs one fp32 copy of the half weights plus their fp32 gradients."""

    level = "O2"
    keep_norms_fp32 = True

    def __init__(self, device: torch.device, dtype: torch.dtype, **scaler_args: Any) -> None:
        super().__init__(device, dtype, **scaler_args)
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []     # (half model weight, its fp32 master)

    def optimizer_params(self, model: nn.Module) -> list[torch.Tensor]:
        params = []
        for p in model.parameters():
            if not p.requires_grad:
                continue
            if p.dtype == torch.float32:
                params.append(p)
                continue
            master = nn.Parameter(p.detach().float())
            self.pairs.append((p, master))
            params.append(master)
        return params

    @torch.no_grad()
    def _gather_grads(self) -> None:
        for p, master in self.pairs:
            if p.grad is None:
                continue
            if master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad.copy_(p.grad)
            p.grad = None       # optimizer.zero_grad only sees the masters: free the half gradient here

    @torch.no_grad()
    def _after_step(self) -> None:
        for p, master in self.pairs:
            p.copy_(master)

    def state_dict(self) -> dict[str, Any]:
        # The half weights cannot restore the masters (rounding), so a checkpoint carries them.
        return {**super().state_dict(), "masters": [m.detach().clone() for _, m in self.pairs]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        masters = state.get("masters", [])
        if masters and len(masters) != len(self.pairs):
            raise ValueError(f"precision state holds {len(masters)} master weights, the model has {len(self.pairs)}")
        for (p, master), saved in zip(self.pairs, masters):
            master.copy_(saved)
            p.copy_(saved)


def build_precision(name: str, device: torch.device, level: str = "autocast", **scaler_args: Any) -> Precision:
    """`name` is the dtype (fp32 | bf16 | fp16), `level` the Recipe's precision_level (ignored for fp32).
    `scaler_args` (init_scale, growth_factor, backoff_factor, growth_interval) tune fp16's loss scaler."""
    if name == "fp32":
        return Precision(device)
    slow = slow_half_reason(device, name)
    if slow:        # asked for explicitly: it runs, but the user hears why every step is slower
        warnings.warn(SlowPrecisionWarning(f"trainfast: precision {name}: {slow.split(' (measure', 1)[0]}"),
                      stacklevel=2)
    classes = {"autocast": Autocast, "master": MasterWeights, "pure": PureHalf}
    return classes[level](device, DTYPES[name], **scaler_args)


def has_fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls have hardware support: AMX/AVX512-BF16 on CPU, Ampere+ on CUDA."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return False


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class SlowPrecisionWarning(UserWarning):
    """Half precision asked for on a device where it is measured to be much slower than fp32."""


SLOW_HALF = "slower here"        # Effect label of a precision rung left out because its dtype is slow on the device
SLOW_HALF_RATIO = 2.0           # half-precision matmuls this many times slower than fp32: not worth a run


@functools.lru_cache(maxsize=None)
def slow_half_reason(device: torch.device, name: str) -> str | None:
    """Why mixed precision in `name` (bf16 | fp16) cannot pay on this device, measured; None when it may.
    A CPU without bf16/fp16 hardware (AVX2 only: no AVX512-BF16, AMX or AVX512-FP16) computes half-precision
    matmuls and convolutions in slow generic kernels: ~1 GFLOP/s against ~100 in fp32 on an AMD EPYC (Zen 3),
    so an autocast rung would take an hour where the fp32 baseline takes minutes. Measured, not guessed from
    the flags: 256^3 products in each dtype on one thread (under 0.2 s even where the half type is slow)."""
    if device.type != "cpu" or (name == "bf16" and has_fast_bf16(device)):
        return None
    if name == "fp16" and cpu_flags() & {"amx_fp16", "avx512_fp16"}:
        return None
    from ..measure import measure_ceiling

    # One thread: the ratio of the kernels is what matters, and a multi-threaded product on a busy machine
    # (every core taken by another process) can lose 30x to waiting threads. The probe's random matrices leave
    # the run's RNG alone.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            fp32 = measure_ceiling(device, torch.float32, n=256, repeats=10)
            half = measure_ceiling(device, DTYPES[name], n=256, repeats=3)
    finally:
        torch.set_num_threads(threads)
    if fp32 / half < SLOW_HALF_RATIO:
        return None
    hardware = "AVX512-BF16 or AMX" if name == "bf16" else "AVX512-FP16 or AMX-FP16"
    return (f"{name} matmuls run at {half / 1e9:.1f} GFLOP/s on one core of this CPU against {fp32 / 1e9:.0f} in "
            f"fp32 ({fp32 / half:.0f}x slower, measured; no {hardware} here), so mixed precision would make every "
            f"step slower (measure it anyway with --amp-dtype {name} or --switches autocast-{name})")


def not_run_text(reason: str) -> str:
    """A table cell for a rung slow_half_reason ruled out: the measurement, without the why and the how-to."""
    return "not run: " + reason.split(" (", 1)[0]


def auto_amp_dtype(device: torch.device) -> str:
    """The AMP rung's dtype when the user asks for 'auto': bf16 where it is fast, else fp16 + scaler."""
    return "bf16" if has_fast_bf16(device) else "fp16"


# Two declarations: the precision (the amp rung, in every default ladder) and how it is applied, whose rungs (the
# O1/O2/O3 levels, each in bf16 and fp16) sit right after amp and are opt-in; in a cumulative ladder a level
# replaces the previous one. The frameworks' bf16/fp16 settings are autocast (O1) only.
SWITCHES = (
    Switch(("precision",),
           rungs=(RungSpec("amp", {"precision": AMP}, place=10, default_in=("classification", "detection", "lm")),),
           observed="precision",
           frameworks={"transformers": "TrainingArguments.bf16 / .fp16",
                       "lightning": "Trainer(precision='bf16-mixed' / '16-mixed' / '32-true')",
                       "accelerate": "Accelerator(mixed_precision='bf16' / 'fp16' / 'no')"}),
    Switch(("precision_level",),
           rungs=tuple(RungSpec(name, changes, place=11 + i / 10)
                       for i, (name, changes) in enumerate(LEVEL_RUNGS.items())),
           served_value="autocast",
           changes_math=True,              # O2/O3 round the weights and the update themselves to half
           shrinks={"gradients": "precision_level master/pure (half-precision gradients)",
                    "parameters": "precision_level pure (half-precision weights), or a smaller model"},
           unreachable={"transformers": "the Trainer's bf16/fp16 are autocast (O1) only",
                        "lightning": "the Trainer's *-mixed precisions are autocast (O1); master weights and pure "
                                     "half are not switched",
                        "accelerate": "Accelerate's mixed_precision is autocast (O1) only"}),
)
