"""The names of the models trainfast builds itself, and the checks of a name against them, importable without
torch: the CLI refuses a plainly unknown detection or language-model name before torch loads (a timm name needs
timm to be judged, so a classification name is checked later, by models.py). The modules that build the models
(detection/models.py, text/models.py) take their names from here, so the two cannot drift."""
from __future__ import annotations

import difflib


class ModelError(ValueError):
    """An unknown model name or bad model arguments; the message names the model."""


# torchvision detectors, random weights, sized for the CPU (detection/models.py: CPU_DEFAULTS, one per name)
DETECTION_MODELS = ("fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_mobilenet_v3_large_fpn",
                    "ssdlite320_mobilenet_v3_large")
# The default, measured on the built-in data (192 training images, AdamW lr 1e-3, batch 4, 1 CPU thread on
# the shared 2-core machine): Faster R-CNN's held-out mAP@0.5 went 0.0003 (untrained) -> 0.22 -> 0.38 after
# its 2nd and 3rd epochs (mAP@[.5:.95] 0.16), about 100 s per epoch; SSDlite (batch 8) stayed under 0.003
# for 8 epochs while its loss fell from 9.8 to 1.4: from scratch it needs far more steps than minutes give.
DEFAULT_DETECTION_MODEL = "fasterrcnn_mobilenet_v3_large_320_fpn"

# Decoder language models (text/models.py builds them): name -> (hidden size, layers, heads, MLP size); llama's
# MLP is SwiGLU (three matrices), hence its smaller width (text/models.py: LLAMA_MLP)
LM_SIZES = {"tiny": (128, 4, 4, 512), "small": (384, 6, 6, 1536), "125m": (768, 12, 12, 3072),
            "350m": (1024, 24, 16, 4096)}
LM_FAMILIES = ("llama", "gpt2")
LM_MODELS = tuple(f"{family}-{size}" for family in LM_FAMILIES for size in LM_SIZES)
DEFAULT_LM_MODEL = "llama-tiny"


def check_detection_model_name(name: str) -> None:
    """Refuse an unknown name before any work starts, listing the supported ones."""
    if name not in DETECTION_MODELS:
        raise ModelError(f"--model {name!r} is not a supported detection model; choose one of "
                         f"{', '.join(DETECTION_MODELS)}")


def check_lm_model_name(name: str) -> None:
    if name in LM_MODELS:
        return
    close = difflib.get_close_matches(name, LM_MODELS, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ModelError(f"--model {name!r} is not a language model trainfast defines ({', '.join(LM_MODELS)}){hint}")
