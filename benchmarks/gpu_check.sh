#!/usr/bin/env bash
# The first thing to run on a GPU machine (one H100 or H200 with 16 cores: about 8 minutes), from the checkout:
#
#     benchmarks/gpu_check.sh [OUT_DIR]          # default runs/gpu-check-<time>; PYTHON=... picks the interpreter
#
# 1. the selfcheck's input and device checks (the wait on the device's timeline against a compute-bound step fed
#    from pageable memory and against a planted slow loader, non_blocking, the prefetcher, channels_last, nvJPEG);
# 2. ResNet-50 at 224, batch 256, 12 loader workers, on a generated folder of 6,400 320x256 JPEGs: the ladder
#    amp, non_blocking, prefetch, channels_last, each rung with its step alone;
# 3. the default ablation (`trainfast ablate` with no flags: on a GPU, ResNet-50 at 160 px on the built-in
#    digits), its wall time against the 3-minute line;
# 4. the doctor on that workload (is the GPU busy, or launch-bound);
# then one table (OUT_DIR/summary.md) with the machine named. Each step has its own time limit and writes what it
# has when stopped (an interrupted ablation writes its partial report), so a slow step costs only itself.
# trainfast runs from this checkout (PYTHONPATH=src): nothing is installed.
set -u
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}")
source benchmarks/gpu_steps.sh       # PY, WORK, LOG; step NAME SECONDS COMMAND..., keep SRC DEST

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
  nproc; } 2>&1 | tee -a "$LOG"

step selfcheck 100 "$PY" -m trainfast selfcheck --out "$WORK/selfcheck" \
    --only wait_pageable,wait_slow_loader,non_blocking,prefetch_overlap,channels_last,nvjpeg
keep "$WORK/selfcheck/selfcheck.json" selfcheck.json

step jpegs 40 "$PY" benchmarks/make_jpeg_folder.py "$WORK/photos" --train 6400 --val 640
step resnet50-224 190 "$PY" -m trainfast ablate --model resnet50 --data "imagefolder:$WORK/photos" --image-size 224 \
    --batch-size 256 --num-workers 12 --repeats 2 --noise-seeds 1 --settle-within 0 \
    --switches amp,non_blocking,prefetch,channels_last --out "$WORK/r50"
keep "$WORK/r50/report.md" r50-report.md
keep "$WORK/r50/results.json" r50-results.json

step default-ablation 185 "$PY" -m trainfast ablate --out "$WORK/default"
keep "$WORK/default/report.md" default-report.md
keep "$WORK/default/results.json" default-results.json

step doctor 50 "$PY" -m trainfast doctor --model resnet50 --image-size 160 --batch-size 256 --out "$WORK/doctor"

"$PY" benchmarks/gpu_summary.py "$OUT/summary.md" "$WORK/r50:ResNet-50 224 on JPEGs" \
    "$WORK/default:the default ablation (trainfast ablate, no flags)" --selfcheck "$WORK/selfcheck" "${WALLS[@]}" \
    | tee -a "$LOG"
echo "summary: $OUT/summary.md"
