#!/usr/bin/env bash
# The input on one GPU in one call of under 8 minutes, data generation included (one H100 or H200, 16 cores):
#
#     benchmarks/gpu_quick.sh TIMM_TRAIN_PY [OUT_DIR]      # TIMM_TRAIN_PY: train.py of a pytorch-image-models
#                                                          # checkout; PYTHON=... picks the interpreter
#     SMOKE=1 benchmarks/gpu_quick.sh [TIMM_TRAIN_PY|-] [OUT_DIR]   # every step on the CPU, small: under 2 minutes
#
# The workload of gpu_input.sh (ResNet-50 at 224, batch 256, 12 loader workers, generated 320x256 JPEGs in 10
# classes), on 7,680 images instead of 19,200, and the figures in their order of value, each step under its own
# time limit (a step that is stopped keeps what it has: an interrupted ablation writes its partial report):
# 1. decode: decoding on the device against decoding in the workers, on the fast recipe without compile (bf16,
#    channels_last, prefetch, pinned copies: benchmarks/recipes/r50-224-gpu.yaml less compile and device_decode),
#    each rung with its step alone, so the table says how close each epoch came to its floor;
# 2. peers: timm's train.py with --torchcompile --channels-last and bf16 AMP, beside trainfast's best of 1 with
#    compile, the same folder and workers, one 3-epoch process each: the whole process (start-up and compile
#    included) and the steady epochs inside it;
# 3. decode-compiled: the pair of 1 with compile on, if the time is left;
# then one table, OUT_DIR/summary.md, with the GPU named. gpu_input.sh (about 50 minutes: the tune, two rounds of
# peers, the decode cache) stays the full measurement for a GPU of one's own.
# SMOKE=1: the same steps on the CPU on 64 small JPEGs (one repeat each, timed over 4 steps: a bf16 step of this
# resnet18 at 32 px takes a second or more on 2 cores; the peers 2 epochs), without compile (its CPU build would
# take the whole time, and without it step 3 would repeat step 1: its recipe is written and read, the pair not
# run); without a timm checkout (`-`) the peer is benchmarks/peers/plain_timm_style.py.
set -u
cd "$(dirname "$0")/.."
TIMM_TRAIN=${1:-}
OUT=$(realpath -m "${2:-runs/gpu-quick-$(date +%Y%m%d-%H%M%S)}")
source benchmarks/gpu_steps.sh       # PY, WORK, LOG; step NAME SECONDS COMMAND..., keep SRC DEST

if [ "${SMOKE:-0}" = 1 ]; then
    DEVICE=cpu; WORKLOAD=r18-32; IMAGES=64; VAL=32; HEIGHT=64; WORKERS=2; REPEATS=1; SLACK=3   # a shared CPU: the limits are the GPU's, tripled
    TIMING=(--timing-steps 4)   # the steps are read, not their rate
    PEER_EPOCHS=2               # a bf16 ResNet-18 step of 32 images at 64 px took seconds on 2 cores: at 32 px, 2 epochs
    COMMON=(--model resnet18 --image-size 32 --batch-size 32 --num-workers 2 --device cpu)
    PEER=timm-cl; COMPILE=false
    "$PY" -c "import torch; print('CPU smoke mode, torch', torch.__version__)" | tee -a "$LOG"
else
    DEVICE=cuda; WORKLOAD=r50-224; IMAGES=7680; VAL=512; HEIGHT=256; WORKERS=12; REPEATS=2; SLACK=1
    TIMING=()
    PEER_EPOCHS=3
    COMMON=(--model resnet50 --image-size 224 --batch-size 256 --num-workers 12 --persistent-workers)
    PEER=timm-tc-cl; COMPILE=true
    [ -f "$TIMM_TRAIN" ] || { echo "usage: benchmarks/gpu_quick.sh TIMM_TRAIN_PY [OUT_DIR]" >&2; exit 2; }
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      "$PY" -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
      "$PY" -c "import torchcodec.decoders; print('torchcodec loads')" || echo "torchcodec does not load: torchvision.io decodes"
      nproc; } 2>&1 | tee -a "$LOG"
fi
if [ -f "$TIMM_TRAIN" ]; then PEER_ARGS=(--tools "$PEER" --timm-train "$TIMM_TRAIN"); else PEER_ARGS=(--tools plain); fi

step jpegs $((45 * SLACK)) "$PY" benchmarks/make_jpeg_folder.py "$WORK/jpegs" --train "$IMAGES" --val "$VAL" --height "$HEIGHT"

# The fast recipe without compile and without device decoding (the pair's two sides differ in device_decode alone).
grep -v -e '^device_decode' -e '^compile' benchmarks/recipes/r50-224-gpu.yaml > "$WORK/fast.yaml"
step decode $((100 * SLACK)) "$PY" -m trainfast ablate "${COMMON[@]}" --data "imagefolder:$WORK/jpegs" --recipe "$WORK/fast.yaml" \
    --mode each --switches device_decode --epochs 1 --repeats "$REPEATS" --noise-seeds 1 --settle-within 0 "${TIMING[@]}" \
    --out "$WORK/decode"
keep "$WORK/decode/report.md" decode-report.md
keep "$WORK/decode/results.json" decode-results.json

# trainfast's best of step 1 (device decoding where it was found faster), with compile: the recipe the peers get.
"$PY" benchmarks/gpu_summary.py --best-recipe "$WORK/decode" "$WORK/fast.yaml" "$COMPILE" "$WORK/best.yaml" \
    | tee -a "$LOG"
keep "$WORK/best.yaml" best.yaml
step peers $((190 * SLACK)) "$PY" benchmarks/peers.py --device "$DEVICE" --workers "$WORKERS" --workloads "$WORKLOAD" \
    --images "$IMAGES" --jpeg-folder "$WORK/jpegs" "${PEER_ARGS[@]}" --tuned-recipe "$WORK/best.yaml" \
    --precision bf16 --epochs "$PEER_EPOCHS" --repeats 1 --out "$WORK/peers"
keep "$WORK/peers/peers.json" peers.json

grep -v '^device_decode' "$WORK/best.yaml" > "$WORK/compiled.yaml"
if [ "$COMPILE" = true ]; then
    step decode-compiled $((110 * SLACK)) "$PY" -m trainfast ablate "${COMMON[@]}" --data "imagefolder:$WORK/jpegs" \
        --recipe "$WORK/compiled.yaml" --mode each --switches device_decode --epochs 1 --repeats 1 --noise-seeds 1 \
        --settle-within 0 --out "$WORK/decode-compiled"
else    # SMOKE: without compile this pair is step 1's ablation again; its recipe is checked, the pair not rerun
    step decode-compiled 60 "$PY" -c "import sys; from trainfast.recipe import Recipe; r = Recipe.from_file(sys.argv[1]); \
print('decode-compiled: the pair of step 1 again without compile, not rerun; its recipe:', r.compile, r.device_decode)" \
        "$WORK/compiled.yaml"
fi
keep "$WORK/decode-compiled/report.md" decode-compiled-report.md
keep "$WORK/decode-compiled/results.json" decode-compiled-results.json

"$PY" benchmarks/gpu_summary.py "$OUT/summary.md" "$WORK/decode:1. device decoding on the fast recipe" \
    "$WORK/decode-compiled:3. device decoding on the fast recipe with compile" --peers "$WORK/peers/peers.json" \
    --title "Feeding a compiled ResNet-50: device decoding and timm --torchcompile" "${WALLS[@]}" | tee -a "$LOG"
echo "summary: $OUT/summary.md"
