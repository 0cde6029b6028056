#!/usr/bin/env bash
# The input on one GPU, in one command (one H100 or H200 with 16 cores; about 50 minutes, most of it the peers):
#
#     benchmarks/gpu_input.sh TIMM_TRAIN_PY [OUT_DIR]     # TIMM_TRAIN_PY: train.py of a pytorch-image-models
#                                                         # checkout; PYTHON=... picks the interpreter
#
# The workload: ResNet-50 at 224, batch 256, 12 loader workers, 19,200 generated 320x256 JPEGs in 10 classes
# (make_jpeg_folder.py). With bf16, channels_last and torch.compile the step outruns 12 CPU workers decoding
# JPEGs, so the epoch is the loader's; the input switches are what can move it.
# 1. the ablation of the input switches, each alone on that fast recipe (benchmarks/recipes/r50-224-gpu.yaml less
#    its device_decode): the decode cache and decoding on the device, with each rung's step alone, so the report
#    says how close each epoch came to its step;
# 2. the tune on the same workload (bf16 base): once its recipe outruns the 12 workers (held by its input), its
#    stage 3 tries the input switches on top of it (decoding on the device, the decode cache, 16 workers), and
#    writes best.yaml;
# 3. the peers: timm's train.py with --channels-last, and with --torchcompile --channels-last (bf16 AMP,
#    --pin-mem, 12 workers), beside trainfast with the recipe of 1 and with the tune's best.yaml, in interleaved
#    rounds; per-epoch cost from whole processes (3 epochs minus 1) and from the steady epochs inside each run.
# Everything lands flat in OUT_DIR (reports, results.json, peers.json, log.txt). Each step has its own time limit.
set -u
cd "$(dirname "$0")/.."
TIMM_TRAIN=${1:?usage: benchmarks/gpu_input.sh TIMM_TRAIN_PY [OUT_DIR]}
OUT=$(realpath -m "${2:-runs/gpu-input-$(date +%Y%m%d-%H%M%S)}")
IMAGES=${IMAGES:-19200}
source benchmarks/gpu_steps.sh       # PY, WORK, LOG; step NAME SECONDS COMMAND..., keep SRC DEST
COMMON=(--model resnet50 --data "imagefolder:$WORK/jpegs" --image-size 224 --batch-size 256 --num-workers 12
        --persistent-workers)

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
  "$PY" -c "import torchcodec.decoders; print('torchcodec loads')" || echo "torchcodec does not load: torchvision.io decodes"
  nproc; } 2>&1 | tee -a "$LOG"

step jpegs 120 "$PY" benchmarks/make_jpeg_folder.py "$WORK/jpegs" --train "$IMAGES" --val 640
grep -v '^device_decode' benchmarks/recipes/r50-224-gpu.yaml > "$WORK/fast.yaml"
step input-ablation 1500 "$PY" -m trainfast ablate "${COMMON[@]}" --recipe "$WORK/fast.yaml" --mode each \
    --switches decode_cache,device_decode --epochs 2 --repeats 2 --noise-seeds 1 --out "$WORK/input"
keep "$WORK/input/report.md" input-report.md
keep "$WORK/input/results.json" input-results.json

step tune 1500 "$PY" -m trainfast tune "${COMMON[@]}" --precision bf16 --budget 20m --out "$WORK/tune"
keep "$WORK/tune/tune.md" tune.md
keep "$WORK/tune/best.yaml" tune-best.yaml

step peers-recipe 3000 "$PY" benchmarks/peers.py --device cuda --workers 12 --workloads r50-224 \
    --images "$IMAGES" --jpeg-folder "$WORK/jpegs" --tools timm-cl,timm-tc-cl --timm-train "$TIMM_TRAIN" \
    --tuned-recipe benchmarks/recipes/r50-224-gpu.yaml --precision bf16 --epochs 1,3 --repeats 2 --out "$WORK/peers"
keep "$WORK/peers/peers.json" peers.json
if [ -f "$WORK/tune/best.yaml" ]; then
    step peers-tuned 1500 "$PY" benchmarks/peers.py --device cuda --workers 12 --workloads r50-224 \
        --images "$IMAGES" --jpeg-folder "$WORK/jpegs" --tools timm-tc-cl --timm-train "$TIMM_TRAIN" \
        --tuned-recipe "$WORK/tune/best.yaml" --precision bf16 --epochs 1,3 --repeats 2 --out "$WORK/peers-tuned"
    keep "$WORK/peers-tuned/peers.json" peers-tuned.json
fi
echo "results: $OUT" | tee -a "$LOG"
