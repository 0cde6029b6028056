"""Every check the selfcheck knows, in the order it runs them: its name, what it verifies, what it needs, and
where its code is ("module:function", imported only when it runs, so listing the checks imports no torch:
`trainfast --help` stays fast and `--only` is validated before anything starts)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Check:
    name: str
    what: str                                   # one line: what passing proves
    runner: str                                 # "module:function" in this package; function(ctx) -> Verdict
    needs: dict[str, Any] = field(default_factory=dict)    # cuda, gpus, bf16, compiler (judges.applicable)

    @property
    def cpu(self) -> bool:
        """In the --cpu-subset: the check needs no CUDA."""
        return not self.needs.get("cuda")

    def resolve(self) -> Callable:
        module, function = self.runner.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)


CUDA = {"cuda": True}
CHECKS: list[Check] = [
    Check("fp16_scaler", "O1 fp16: a forced inf skips the step and halves the scale, which grows back",
          "precision_checks:check_fp16_scaler"),
    Check("fp16_o1_parity", "O1 fp16 autocast + GradScaler within tolerance of fp32 on a short run",
          "precision_checks:check_fp16_o1_parity"),
    Check("fp16_o2_master", "O2 fp16: half weights, fp32 master weights copied back exactly, parity with fp32",
          "precision_checks:check_fp16_o2_master"),
    Check("bf16_o1_parity", "O1 bf16 autocast within tolerance of fp32 on a short run",
          "precision_checks:check_bf16_o1_parity", {"bf16": True}),
    Check("non_blocking", "non_blocking copies from pinned memory leave the host free while they run",
          "device_checks:check_non_blocking", CUDA),
    Check("prefetch_overlap", "the prefetcher's side-stream copy overlaps the compute on the main stream",
          "device_checks:check_prefetch", CUDA),
    Check("wait_pageable", "a compute-bound step fed from pageable memory is not called input-bound (device timeline)",
          "device_checks:check_wait_pageable", CUDA),
    Check("wait_slow_loader", "a planted slow loader (a sleep in the dataset) is called input-bound",
          "device_checks:check_wait_slow_loader", CUDA),
    Check("channels_last", "channels_last under mixed precision speeds up a conv net",
          "device_checks:check_channels_last", CUDA),
    Check("cudnn_benchmark_fixed", "cudnn.benchmark with fixed shapes is not slower", "device_checks:check_cudnn_fixed",
          CUDA),
    Check("cudnn_benchmark_varying", "the doctor warns on cudnn.benchmark with changing input shapes (and the cost)",
          "tool_checks:check_cudnn_varying", CUDA),
    Check("compile", "torch.compile trains like eager, without graph breaks or recompiles",
          "device_checks:check_compile", {"compiler": True}),
    Check("fused_adamw", "fused AdamW updates the weights as the for-loop AdamW does",
          "device_checks:check_fused_adamw"),
    Check("nvjpeg", "JPEG decoding on the GPU (nvJPEG) matches the CPU decode", "device_checks:check_nvjpeg", CUDA),
    Check("ddp_nccl", "DDP over NCCL on every GPU: disjoint shards reshuffled by set_epoch, metrics reduced over ranks",
          "parallel_checks:check_ddp", {"cuda": True, "gpus": 2}),
    Check("ddp_nonfinite_stop", "a NaN on one rank stops every rank at the same step",
          "parallel_checks:check_ddp_nonfinite", {"cuda": True, "gpus": 2}),
    Check("data_parallel", "DataParallel with the loss in the replicas trains as one device does",
          "parallel_checks:check_data_parallel", {"cuda": True, "gpus": 2}),
    Check("doctor_syncs", "the doctor counts a host read every step (a problem on a GPU), and not in a clean loop",
          "tool_checks:check_doctor_syncs"),
    Check("doctor_launch_bound", "the doctor flags a launch-bound model, and not a compute-bound one",
          "tool_checks:check_doctor_launch_bound", CUDA),
    Check("doctor_host_copies", "the doctor flags a tensor made on the host every step, and not a clean model",
          "tool_checks:check_doctor_host_copies", CUDA),
    Check("ablation_non_blocking", "the default ablation on CUDA measures the non_blocking rung (not 'no effect')",
          "tool_checks:check_ablation_non_blocking", CUDA),
    Check("ablation_peak_memory", "the ablation reports the allocator's own peak for every rung",
          "tool_checks:check_ablation_peaks", CUDA),
]
NAMES = [c.name for c in CHECKS]


def select(only: list[str] | None) -> list[Check]:
    """The checks named in `only` (all when None), in catalog order; an unknown name is refused with the list."""
    if not only:
        return list(CHECKS)
    unknown = [n for n in only if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    return [c for c in CHECKS if c.name in only]
