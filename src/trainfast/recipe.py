"""Recipe: every speed technique is one documented field; validation refuses what cannot work.

A Recipe is frozen so a run's configuration cannot drift after it is validated, and so it can be
written verbatim next to every measured number (results.json, the run folder).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:                 # torch is imported where it is used: `trainfast --help` reads the Recipe
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_LEVELS = ("autocast", "master", "pure")   # Apex's O1, O2, O3 (fp32 is O0)
OPTIMIZERS = ("sgd", "adamw")
OPTIMIZER_IMPLS = ("default", "for-loop", "foreach", "fused")
OPTIMIZER_STATES = ("full", "8bit", "4bit")    # Adam's moments in fp32, or block-quantized (torchao)
NONFINITE_POLICIES = ("stop", "skip")
STRATEGIES = ("ddp", "fsdp", "dp")
ATTENTION = ("model", "eager", "sdpa", "flex", "flash")   # the attention backends (techniques/attention.py)
LR_SCALINGS = ("linear", "sqrt", "none")       # how the learning rate follows batch_scale (techniques/batch_scale.py)
SCALE_BY = ("batch", "accumulation")           # what batch_scale multiplies: the micro-batch, or the accumulation
COMM_HOOKS = ("bf16_compress_hook", "fp16_compress_hook", "powersgd_rank")   # DDP communication hooks: one at a time
# The string fields that take one of a fixed set of values: validate_fields checks them, the CLI lists them.
FIELD_CHOICES = {"precision": PRECISIONS, "precision_level": PRECISION_LEVELS, "optimizer": OPTIMIZERS,
                 "optimizer_impl": OPTIMIZER_IMPLS,
                 "optimizer_state": OPTIMIZER_STATES, "nonfinite": NONFINITE_POLICIES, "strategy": STRATEGIES,
                 "attention": ATTENTION, "lr_scaling": LR_SCALINGS, "scale_by": SCALE_BY}


def field_sections() -> dict[str, list[str]]:
    """The Recipe's fields by section, as the class groups them under its `# --- section ---` lines: the CLI's
    help and the docs show the same groups (empty when the source is not available)."""
    import inspect
    import re

    try:
        source = inspect.getsource(Recipe)
    except (OSError, TypeError):
        return {}
    sections: dict[str, list[str]] = {}
    current = None
    for line in source.splitlines():
        if (head := re.match(r"^    # --- (.+?) -+$", line)):
            current = sections.setdefault(head.group(1), [])
        elif (name := re.match(r"^    (\w+): ", line)) and current is not None:
            current.append(name.group(1))
    return sections


def field_docs() -> dict[str, str]:
    """Each Recipe field's trailing comment in this file: the one description, used for the CLI's --help.
    Fields documented above their line instead get none (empty when the source is not available)."""
    import inspect
    import re

    try:
        source = inspect.getsource(Recipe)
    except (OSError, TypeError):
        return {}
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^    (\w+): [^#\n]*#\s*(.+)$", source, flags=re.MULTILINE)}


class RecipeError(ValueError):
    """A recipe (or a flag / config key that builds one) that cannot work; the message names it."""


@dataclass(frozen=True)
class Recipe:
    # --- what is trained --------------------------------------------------------------------------------------
    epochs: int = 1                   # passes over the training data
    batch_size: int = 64              # samples per micro-batch (per rank under torchrun)
    optimizer: str = "adamw"          # "sgd" (momentum 0.9) or "adamw"
    lr: float = 2e-3                  # peak learning rate
    weight_decay: float = 0.05        # decoupled for adamw, L2 for sgd
    warmup_steps: int = 0             # linear LR warm-up from lr/warmup_steps to lr
    seed: int = 0                     # one seed drives init, data order and per-worker streams
    grad_accum_steps: int = 1         # micro-batches per optimizer step (loss / k; DDP syncs on the k-th only)

    # --- precision --------------------------------------------------------------------------------------------
    precision: str = "fp32"           # "fp32" | "bf16" | "fp16": autocast dtype; fp16 adds a GradScaler
    # How a bf16/fp16 `precision` is applied: "autocast" (O1: fp32 weights, autocast), "master" (O2:
    # half weights, fp32 master copy in the optimizer, norms fp32), "pure" (O3: all half, risky). fp32 = O0.
    precision_level: str = "autocast"  # with bf16/fp16: "autocast" (O1), "master" (O2), "pure" (O3, risky)
    fast_fp32_matmul: bool = False    # fp32 matmuls with bf16 (CPU with native bf16) or TF32 (GPU) inputs, fp32 out

    # --- the input pipeline -----------------------------------------------------------------------------------
    num_workers: int | str = 0        # DataLoader worker processes, or "auto": the fastest of a short measurement
    persistent_workers: bool = False  # keep workers alive across epochs (needs num_workers > 0)
    prefetch_factor: int | None = None  # batches each worker loads ahead (needs num_workers > 0)
    non_blocking: bool = False        # host->device copies do not block the host (CUDA only)
    pin_memory: bool = False          # page-locked host batches, required for async copies (CUDA only)
    prefetch: bool = False            # uint8 transport + side-stream copy + normalize on the device
    decode_cache: bool = False        # image folders: decode every file once to a uint8 cache on disk
    device_decode: bool = False       # CUDA image folders: nvJPEG decode, crop, normalize on device; workers read bytes
    passive_threads: bool = False     # OMP_WAIT_POLICY=PASSIVE at start: idle OpenMP threads sleep, cores go to workers
    group_aspect_ratio: bool = False  # detection: batch images of similar aspect ratio together (less padding)

    # --- language-model batches and attention -----------------------------------------------------------------
    padding_free: bool = False        # language models: pack each batch's documents into rows with no padding
    group_by_length: bool = False     # language models: batches of documents of similar length (less padding)
    pad_to_multiple: int = 0          # language models: padded batches' length rounded up to a multiple (0: off)
    batch_tokens: int = 0             # language models: batches sized by tokens, up to N each with padding (0: off)
    attention: str = "model"          # transformers attention backend: "model" (its own) | eager | sdpa | flex | flash
    chunked_loss: bool = False        # language models: next-token loss over chunks of rows, logits never whole

    # --- the model and the step -------------------------------------------------------------------------------
    set_to_none: bool = False         # force zero_grad(set_to_none=True) in a loop that zeroes in place (torch's frees)
    channels_last: bool = False       # NHWC memory format for model and inputs (conv nets)
    compile: bool = False             # torch.compile the model
    optimizer_impl: str = "default"   # "default" (torch picks) | "for-loop" | "foreach" | "fused"
    compile_optimizer: bool = False   # torch.compile the optimizer's step (its many small update kernels fused)
    cudnn_benchmark: bool = False     # let cuDNN autotune conv algorithms (CUDA only)
    grad_clip: float | None = None    # clip the global grad norm to this value (after unscaling)
    deterministic: bool = False       # torch.use_deterministic_algorithms(True), may be slower

    # --- memory -----------------------------------------------------------------------------------------------
    activation_checkpointing: bool = False  # recompute activations in backward: less memory, slower (timm/transformers)
    optimizer_state: str = "full"     # Adam's moments: "full" (fp32) | "8bit" | "4bit" (torchao, block-quantized)
    reuse_memory: bool = False        # freed host memory stays mapped (glibc: no mmap/trim): no CPU page faults anew

    # --- batch size (changes the math: judged on time to target) ----------------------------------------------
    # A bigger effective batch (techniques/batch_scale.py): fewer, larger steps, so the math changes and the switch
    # is judged on time to target. The learning rate follows it: "linear" (lr x k, the rule for SGD), "sqrt"
    # (lr x sqrt(k), the rule for Adam-family optimizers; the default, as the built-in runs use AdamW) or "none";
    # the warm-up is divided by k so it covers the same samples. "accumulation" keeps the micro-batch and
    # accumulates k times more of them: the same effective batch and math, less memory, slower steps.
    batch_scale: int = 1              # effective batch = this many times the recipe's (lr and warm-up follow)
    lr_scaling: str = "sqrt"          # how lr follows batch_scale: "linear" (SGD) | "sqrt" (Adam-family) | "none"
    scale_by: str = "batch"           # batch_scale multiplies "batch" (batch_size) or "accumulation" (grad_accum_steps)

    # --- reliability ------------------------------------------------------------------------------------------
    nonfinite: str = "stop"           # non-finite loss: "stop" with a message naming the step, or "skip" the step
    log_every: int = 10               # steps between reads of device-side metrics (each read syncs)
    max_bad_fraction: float = 0.01    # unreadable images are skipped and counted; stop above this fraction
    max_consecutive_skips: int = 10   # nonfinite=skip: abort after this many non-finite steps in a row
    save_every: int = 0               # checkpoint every N steps (0: only at each epoch end); needs a run folder
    keep_checkpoints: int = 2         # newest checkpoints kept in the run folder (older ones pruned after a save)
    async_checkpoint: bool = False    # write checkpoints in a background thread while training runs (same atomic files)

    # --- distributed (under torchrun; a single process ignores strategy=ddp) ----------------------------------
    strategy: str = "ddp"             # "ddp" | "fsdp" (FSDP2 fully_shard) | "dp" (legacy DataParallel, CUDA)
    find_unused_parameters: bool = False  # DDP: traverse the graph every step for unused params (costly)
    ddp_bucket_mb: float | None = None  # DDP's gradient bucket size in MiB (unset: DDP's 25): bigger, fewer all-reduces
    gradient_as_bucket_view: bool = False  # DDP: gradients as views into its buckets (one gradient-sized copy less)
    static_graph: bool = False        # DDP: the same parameters in the same graph every step (no per-step search)
    bf16_compress_hook: bool = False  # DDP: gradients all-reduced in bf16 (half the bytes; rounds them)
    fp16_compress_hook: bool = False  # DDP: gradients all-reduced in fp16 (half the bytes; rounds them less than bf16)
    powersgd_rank: int = 0            # DDP: gradients all-reduced as PowerSGD's low-rank factors of this rank (0: off)
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after each block's forward (off: ZeRO-2)
    dist_timeout_s: int = 300         # a rank silent this long is reported by rank and the run stops

    def __post_init__(self) -> None:
        validate_fields(self)

    def replace(self, **changes: Any) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "recipe") -> "Recipe":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecipeError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except RecipeError as exc:
            raise RecipeError(f"{source}: {exc}") from exc

    @classmethod
    def from_file(cls, path: str | Path) -> "Recipe":
        """Read a YAML (or JSON, a YAML subset) recipe with the safe loader: no python object tags."""
        return cls.from_dict(read_recipe_file(path), source=f"config file {path}")


def recipe_loader():
    """yaml.SafeLoader (no Python object tags) with two changes a recipe needs: numbers in exponent form without
    a dot (`lr: 1e-3`) are floats, as in YAML 1.2 and JSON, not the strings PyYAML's YAML 1.1 rules make them;
    and a key given twice is refused (the safe loader keeps the last one silently)."""
    import re

    import yaml

    class RecipeLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    RecipeLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))
    return RecipeLoader


def read_recipe_file(path: str | Path, source: str = "config file") -> dict[str, Any]:
    """The mapping of recipe fields in a YAML (or JSON) file, read with the safe loader (recipe_loader)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{source} {path} does not exist")
    try:
        data = yaml.load(path.read_text(), Loader=recipe_loader())  # noqa: S506  (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source} {path}: not valid safe YAML ({exc})") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{source} {path}: expected a mapping of recipe fields, got {type(data).__name__}")
    return data


# The environment variable through which a launcher (the ablation, a scheduler) sets recipe fields for a script
# that builds its own Recipe: it wins over the script (defaults < the script's Recipe < this variable).
RECIPE_ENV = "TRAINFAST_RECIPE"


def env_recipe_fields(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fields TRAINFAST_RECIPE sets: inline JSON (a value starting with "{") or the path of a YAML/JSON
    file, either one a mapping of some or all recipe fields. Unset or empty: none. Anything that does not
    parse, or names an unknown field, is a RecipeError naming the variable."""
    import json

    value = (os.environ if environ is None else environ).get(RECIPE_ENV, "").strip()
    if not value:
        return {}
    if value.startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RecipeError(f"{RECIPE_ENV}: inline value is not valid JSON ({exc}): {value[:200]!r}") from exc
    else:
        data = read_recipe_file(value, source=f"{RECIPE_ENV}: file")
    if not isinstance(data, dict):
        raise RecipeError(f"{RECIPE_ENV}: expected a mapping of recipe fields, got {type(data).__name__}")
    unknown = sorted(set(data) - set(RECIPE_FIELDS))
    if unknown:
        raise RecipeError(f"{RECIPE_ENV}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(RECIPE_FIELDS)}")
    return data


def apply_env_recipe(recipe: Recipe, environ: Mapping[str, str] | None = None) -> tuple[Recipe, dict[str, tuple]]:
    """`recipe` with TRAINFAST_RECIPE's fields on top, and what the variable changed:
    {field: (the script's value, the environment's value)} for every field whose value it changed."""
    fields_set = env_recipe_fields(environ)
    try:
        merged = recipe.replace(**fields_set) if fields_set else recipe
    except (RecipeError, TypeError) as exc:
        raise RecipeError(f"{RECIPE_ENV}: {exc}") from exc
    overridden = {name: (getattr(recipe, name), value) for name, value in fields_set.items()
                  if getattr(recipe, name) != value}
    return merged, overridden


POSITIVE_INTS = ("epochs", "batch_size", "log_every", "max_consecutive_skips", "keep_checkpoints", "grad_accum_steps",
                 "dist_timeout_s", "batch_scale")
NON_NEGATIVE_INTS = ("warmup_steps", "seed", "save_every", "pad_to_multiple", "batch_tokens", "powersgd_rank")


def field_problem(name: str, value: Any) -> str | None:
    """What is wrong with one field's value on its own ("must be a positive integer"), or None. validate_fields
    names the field with it; the CLI names the flag, refusing it while it parses, before torch loads."""
    declared = FIELD_TYPES[name]
    kind = declared.removesuffix(" | None")
    if value is None and kind != declared:              # an optional field left unset
        return None
    if kind == "bool" and not isinstance(value, bool):
        # a string "false" is truthy: taken as given it would switch the technique on
        return "must be true or false"
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return "must be a number"
    if declared == "int | None" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer (or unset)"
    if name in FIELD_CHOICES and value not in FIELD_CHOICES[name]:
        return f"is not one of {', '.join(FIELD_CHOICES[name])}"
    whole = isinstance(value, int) and not isinstance(value, bool)
    if name in POSITIVE_INTS and not (whole and value >= 1):
        return "must be a positive integer"
    if name in NON_NEGATIVE_INTS and not (whole and value >= 0):
        return "must be a non-negative integer"
    if name == "num_workers" and value != "auto" and not (whole and value >= 0):
        return "must be a non-negative integer or 'auto'"
    if name in ("lr", "grad_clip", "ddp_bucket_mb") and not value > 0:
        return "must be positive" + (" (or unset)" if name != "lr" else "")
    if name == "weight_decay" and value < 0:
        return "must be >= 0"
    if name == "max_bad_fraction" and not 0 <= value < 1:
        return "must be in [0, 1)"
    if name == "prefetch_factor" and value < 1:
        return "must be >= 1"
    return None


def validate_fields(r: Recipe) -> None:
    """Checks that need no device: each field's type and range (field_problem), then the switches that need
    another switch."""
    for f in fields(r):
        problem = field_problem(f.name, getattr(r, f.name))
        if problem is not None:
            raise RecipeError(f"{f.name}={getattr(r, f.name)!r} {problem}")
    if r.precision == "fp32" and r.precision_level != "autocast":
        raise RecipeError(f"precision_level={r.precision_level!r} needs precision=bf16 or fp16 "
                          "(fp32 is O0, it has no levels)")
    if r.num_workers == 0 and r.persistent_workers:
        raise RecipeError("persistent_workers=True needs num_workers > 0 (there are no workers to keep)")
    if r.prefetch_factor is not None and r.num_workers == 0:
        raise RecipeError("prefetch_factor needs num_workers > 0 (the main process does not prefetch)")
    if r.optimizer_state != "full" and r.optimizer != "adamw":
        raise RecipeError(f"optimizer_state={r.optimizer_state!r} quantizes Adam's moments: it needs optimizer=adamw")
    hooks = [name for name in COMM_HOOKS if getattr(r, name)]
    if len(hooks) > 1:
        raise RecipeError(f"{' and '.join(hooks)}: DDP takes one communication hook; turn all but one off")
    if r.non_blocking and not r.pin_memory and not r.prefetch:
        # An async copy from pageable memory is silently synchronous on CUDA: refuse the illusion.
        raise RecipeError("non_blocking=True needs pin_memory=True (copies from pageable memory are synchronous)")


def validate_for_device(r: Recipe, device: torch.device) -> None:
    """Checks that depend on where the run happens; called before any data or model is built."""
    import torch

    if r.precision == "fp16" and device.type == "cpu" and not _cpu_supports_fp16_autocast():
        raise RecipeError("precision=fp16 is not supported by autocast on this CPU build of torch; use bf16")
    if r.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RecipeError(f"precision=bf16 is not supported on {device} (needs Ampere or newer); use fp16")
    if r.precision == "fp16" and device.type == "mps" and r.optimizer_impl == "fused":
        raise RecipeError("optimizer_impl=fused with fp16 is not supported on mps")
    if r.optimizer_impl == "fused" and device.type not in ("cuda", "cpu", "mps", "xpu"):
        raise RecipeError(f"optimizer_impl=fused is not available on device {device.type}")
    if r.strategy == "fsdp" and r.precision == "fp16":
        raise RecipeError("strategy=fsdp with precision=fp16 is not supported (no loss scaler for FSDP2 here); "
                          "use bf16")
    if r.strategy == "dp" and (device.type != "cuda" or torch.cuda.device_count() < 2):
        raise RecipeError("strategy=dp (nn.DataParallel) needs 2 or more CUDA devices; use torchrun with strategy=ddp")
    if r.compile and r.deterministic and device.type == "cuda":
        raise RecipeError("compile=True with deterministic=True is not supported on CUDA "
                          "(nondeterministic Triton kernels)")


def _cpu_supports_fp16_autocast() -> bool:
    import torch

    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        return True
    except (RuntimeError, ValueError):
        return False


def resolve_device(name: str = "auto") -> torch.device:
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise RecipeError(f"--device {name!r} is not a torch device ({exc})") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RecipeError(f"--device {name!r}: CUDA is not available on this machine")
    if device.type == "meta":
        raise RecipeError(f"--device {name!r}: meta tensors hold no data, nothing can train there")
    if device.type != "cpu":
        available = next((m.is_available for m in (getattr(torch.backends, device.type, None),
                                                   getattr(torch, device.type, None))
                          if callable(getattr(m, "is_available", None))), None)
        if available is not None and not available():
            raise RecipeError(f"--device {name!r}: {device.type} is not available on this machine or in this "
                              "torch build")
        try:                    # a tensor there, once: a device this torch or machine lacks fails here, not mid-run
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:160]
            raise RecipeError(f"--device {name!r} cannot be used here ({reason})") from None
    return device


def preset(name: str) -> Recipe:
    """Named starting points. 'fast' turns on everything that is safe on any device."""
    presets = {
        "baseline": Recipe(),
        "fast": Recipe(precision="bf16", set_to_none=True, prefetch=True, optimizer_impl="foreach"),
    }
    if name not in presets:
        raise RecipeError(f"--recipe {name!r} is not a preset ({', '.join(presets)}) or an existing YAML file")
    return presets[name]


RECIPE_FIELDS = tuple(f.name for f in fields(Recipe))
FIELD_TYPES = {f.name: f.type for f in fields(Recipe)}   # as written (annotations are strings here)
