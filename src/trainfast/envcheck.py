"""The doctor's environment facts: library versions, the devices and what they
support, the CPU flags that decide bf16 speed, thread counts, and a tiny convolution and matmul actually run
on every device, with a failure explained in words (which build, which driver, which devices are visible)
instead of a raw stack trace."""
from __future__ import annotations

import os
import platform
import time
from typing import Any

import torch

from .techniques.precision import cpu_flags

# The CPU features that decide a CPU run's speed: vector width and fused multiply-add for fp32, and the
# instructions that make bf16 (and int8) matmuls fast rather than emulated.
CPU_FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile",
                         "amx_int8")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_environment() -> dict[str, Any]:
    import warnings

    import psutil

    flags = cpu_flags()
    with warnings.catch_warnings(record=True) as caught:     # torch says why CUDA failed to start only here
        warnings.simplefilter("always")
        cuda = torch.cuda.is_available()
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,                 # the CUDA the wheel was built with (None: CPU wheel)
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version(),
        "driver": _driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_available": cuda,
        "devices": [_cuda_device(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_flags": [f for f in CPU_FLAGS_THAT_MATTER if f in flags],
        "cpu_bf16": bool({"amx_bf16", "avx512_bf16"} & flags),     # fast bf16 matmuls on this CPU
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "memory_total_bytes": psutil.virtual_memory().total,
        "memory_available_bytes": psutil.virtual_memory().available,
    }
    env["smoke"] = [smoke_test(torch.device("cpu"))]
    env["smoke"] += [smoke_test(torch.device("cuda", i)) for i in range(len(env["devices"]))]
    env["cuda_init_warning"] = next((str(w.message).splitlines()[0] for w in caught
                                     if "cuda" in str(w.message).lower()), None)
    if not cuda:
        env["no_gpu_reason"] = no_gpu_reason(env)
    return env


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except Exception:        # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else (str(version) if version else None)


def _driver_version() -> str | None:
    """The NVIDIA driver, from the kernel module (no nvidia-smi process): None without one."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return None
    words = first.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), first.strip())


def _cuda_device(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {"index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory, "bf16": props.major >= 8, "fp16": props.major >= 6}


def smoke_test(device: torch.device) -> dict[str, Any]:
    """A 3x3 convolution (cuDNN on CUDA) and a matmul, run and checked against the CPU's answer."""
    torch.manual_seed(0)
    x, w, a = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(16, 16)
    result: dict[str, Any] = {"device": str(device)}
    for name, fn, args in (("conv", torch.nn.functional.conv2d, (x, w)), ("matmul", torch.mm, (a, a))):
        try:
            out = fn(*(t.to(device) for t in args)).cpu()
            ok = torch.allclose(out, fn(*args), rtol=1e-2, atol=1e-2)
            result[name] = "ok" if ok else "wrong result"
        except Exception as exc:           # explained, not a raw stack trace
            result[name] = "failed"
            result[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            result[f"{name}_explained"] = explain_failure(exc, device)
    return result


def explain_failure(exc: BaseException, device: torch.device) -> str:
    """What a failed device op most likely means, in words."""
    text = str(exc).lower()
    build, driver = torch.version.cuda, _driver_version()
    if "cudnn" in text:
        return (f"cuDNN failed: torch was built with CUDA {build} and cuDNN "
                f"{torch.backends.cudnn.version()}; the driver is {driver or 'unknown'}. A driver older than the "
                "build's CUDA, or a second cuDNN found first on LD_LIBRARY_PATH, gives this: update the driver or "
                "install the torch wheel for your CUDA, and unset LD_LIBRARY_PATH entries with other cuDNNs")
    if "driver" in text or "no kernel image" in text or "unsupported" in text:
        return (f"the driver ({driver or 'not found'}) does not support this build (CUDA {build}) or this GPU's "
                "compute capability: install the torch wheel built for your driver's CUDA version")
    if "out of memory" in text:
        return f"{device} is out of memory: another process holds it (nvidia-smi lists them)"
    return f"the operation failed on {device}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def no_gpu_reason(env: dict[str, Any]) -> str:
    """Why torch sees no GPU, in the order worth checking."""
    visible = env.get("cuda_visible_devices")
    if env.get("cuda_init_warning"):
        return f"torch could not start CUDA: {env['cuda_init_warning']}"
    if env.get("cuda_build") is None:
        return "this torch is a CPU-only build (torch.version.cuda is None)"
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    if env.get("driver") is None:
        return "no NVIDIA driver is loaded (/proc/driver/nvidia/version is missing): no GPU visible"
    return (f"torch (CUDA {env.get('cuda_build')}) cannot use the driver {env.get('driver')}: a driver older than the "
            "build's CUDA, or the GPU is held in another mode")


def summary(env: dict[str, Any]) -> str:
    devices = ", ".join(f"{d['name']} (sm {d['capability']}, {d['memory_bytes'] / 2**30:.0f} GiB, "
                        f"bf16 {'yes' if d['bf16'] else 'no'})" for d in env["devices"]) or "no GPU"
    flags = ", ".join(env["cpu_flags"]) or "none of note"
    return (f"torch {env['torch']}, CUDA build {env['cuda_build'] or 'none'}, cuDNN {env['cudnn'] or 'none'}, "
            f"NCCL {env['nccl'] or 'none'}, driver {env['driver'] or 'none'}; {devices}"
            + (f" ({env['no_gpu_reason']})" if env.get("no_gpu_reason") else "")
            + f"; CPU {env['cpu']} ({env['cpu_cores']} cores, flags {flags}, bf16 "
            f"{'fast' if env['cpu_bf16'] else 'emulated'}); torch threads {env['torch_threads']} "
            f"(interop {env['torch_interop_threads']}, OMP_NUM_THREADS {env['omp_num_threads'] or 'unset'})")


def cpu_seconds() -> tuple[float, float, float] | None:
    """(a wall clock, the CPU seconds the machine's processes have been busy, the CPU seconds of this process
    and its children: the loop's threads and its loader workers), for other_cores between two reads; None
    without the system's counters. Time the hypervisor gave another guest (steal) is left out: no process here
    can be stopped for it."""
    try:
        import psutil

        system = psutil.cpu_times()
        busy = sum(getattr(system, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq"))
        me = psutil.Process()
        own = sum(me.cpu_times()[:4])           # user, system, and the reaped children's
        for child in me.children(recursive=True):
            try:
                own += sum(child.cpu_times()[:2])
            except psutil.Error:                # a worker that exited meanwhile
                pass
    except Exception:                           # noqa: BLE001 - no /proc, no psutil: not measured
        return None
    return time.perf_counter(), busy, own


def other_cores(before: tuple | None, after: tuple | None) -> float | None:
    """Cores' worth of CPU other processes used between two cpu_seconds() reads."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / (after[0] - before[0]))


LOAD_WINDOW_S = 1.0     # the counters tick every 10 ms: over a shorter window the estimate is mostly rounding


def other_cores_since(before: tuple | None) -> float | None:
    """other_cores from `before` until now, the window stretched to LOAD_WINDOW_S by waiting (a short loop's
    timed steps may last 50 ms; while the loop is held, the others run as they would have)."""
    if before is None:
        return None
    wait = before[0] + LOAD_WINDOW_S - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
    return other_cores(before, cpu_seconds())


def smoke_failures(env: dict[str, Any]) -> list[str]:
    return [f"{s['device']} {op}: {s.get(op + '_explained') or s[op]}" for s in env.get("smoke", [])
            for op in ("conv", "matmul") if s.get(op) != "ok"]
