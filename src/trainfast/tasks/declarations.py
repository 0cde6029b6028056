"""Every task's declaration, registered by name, in a module that imports no torch: the command line reads a task's
defaults and refuses what the task cannot run (a switch on data it does not offer, a strategy it cannot train with, a
flag it has no use for) in a fraction of a second, before torch loads. The implementations (classification.py,
detection.py, lm.py) import torch, and are imported only when build_task makes a task object.

A new task is its declaration here (registered with `register`) and its implementation module.
"""
from __future__ import annotations

import importlib.util

from ..dataspecs import parse_data_spec, parse_detection_spec, parse_text_spec
from ..modelnames import (DEFAULT_DETECTION_MODEL, DEFAULT_LM_MODEL, DETECTION_MODELS, LM_MODELS,
                          check_detection_model_name, check_lm_model_name)
from ..recipe import Recipe, RecipeError
from .base import Metric, TaskDeclaration

REGISTRY: dict[str, TaskDeclaration] = {}


def register(declaration: TaskDeclaration) -> TaskDeclaration:
    """Add a task under its name (the order of registration is the order --task lists them)."""
    if declaration.name in REGISTRY:
        raise LookupError(f"the task {declaration.name!r} is registered twice")
    REGISTRY[declaration.name] = declaration
    return declaration


def declared(name: str) -> TaskDeclaration:
    """The declaration of the task called `name`; an unknown name is refused, naming the choices."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise RecipeError(f"--task {name!r} is not one of {', '.join(REGISTRY)}") from None


def no_dp(what: str):
    """strategy=dp computes a classification loss inside each replica: refused for a task whose model computes its
    own loss."""
    def refuse(recipe: Recipe) -> str | None:
        if recipe.strategy == "dp":
            return (f"strategy=dp computes a classification loss inside each replica; for {what} use strategy=ddp "
                    "under torchrun")
        return None
    return refuse


def autocast_only(recipe: Recipe) -> str | None:
    """A detector cast whole to a half type: its anchors, box coding, RoIAlign sampling and losses need fp32
    coordinates."""
    if recipe.precision != "fp32" and recipe.precision_level != "autocast":
        return (f"precision_level={recipe.precision_level!r} casts the whole detector to {recipe.precision}; its "
                "anchors, box coding, RoIAlign sampling and losses need fp32 coordinates, so detection uses "
                "autocast only: --precision bf16 (or fp16) with --precision-level autocast (O1)")
    return None


INSTALL_HINT = "the language-model task needs transformers and tokenizers: pip install 'trainfast[hf]'"


def require_text_packages() -> None:
    """The language-model task's packages, looked for without importing them."""
    missing = [name for name in ("transformers", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise RecipeError(f"{INSTALL_HINT} (missing here: {', '.join(missing)})")


def check_lm_model(name: str) -> None:
    require_text_packages()
    check_lm_model_name(name)


CLASSIFICATION = register(TaskDeclaration(
    name="classification",
    metric=Metric("accuracy", "val acc", "max"),
    rate_unit="samples",
    # Stacked batches of one shape, image batches as the built-in data has them (a user's own tensors too: the
    # model's judge says whether channels_last has convolutions to act on), image folders as --data gives them.
    offers=frozenset({"", "images", "stacked", "image_folder"}),
    batches="samples stacked at one shape",
    implementation="trainfast.tasks.classification:Classification",
    default_model="resnet9",
    default_data="digits",
    folders=("imagefolder", "cifar10"),
    parse_data=parse_data_spec,
))

DETECTION = register(TaskDeclaration(
    name="detection",
    metric=Metric("mAP", "mAP", "max"),
    rate_unit="images",
    # Lists of images of different sizes (not stacked), padded per batch by the model: no image-folder decoding
    # (its data is synthetic or a coco:PATH folder, decoded by its own dataset).
    offers=frozenset({"", "images", "padded_sizes"}),
    batches="lists of images of different sizes (each copied as uint8 and converted on the device)",
    implementation="trainfast.tasks.detection:Detection",
    default_model=DEFAULT_DETECTION_MODEL,
    default_data="synthetic",
    # The settings the detection defaults were measured with (modelnames.py: AdamW lr 1e-3, batch 4), weight
    # decay as torchvision's detection reference, and 3 epochs, a few minutes on 2 cores for Faster R-CNN on the
    # built-in data. The warm-up is the detection reference's first-epoch warm-up (Detection.apply_schedule), so
    # warmup_steps stays 0.
    default_recipe=Recipe(epochs=3, batch_size=4, lr=1e-3, weight_decay=1e-4, log_every=8),
    loss_terms=True,                     # per-term logging, key sets compared across ranks
    models=DETECTION_MODELS,
    split_class="trainfast.detection.data:DetectionSplit",
    check_name=check_detection_model_name,
    folders=("coco",),
    parse_data=parse_detection_spec,
    image_size="detection models resize their images themselves (Faster R-CNN: short side 320, long side at most "
               "480; SSDlite: 320x320)",
    commands=("ablate", "train"),
    refusals=(autocast_only, no_dp("detection")),
    # Why, at more length: Faster R-CNN pads every batch to a new canvas (a recompile per shape), and every
    # torchvision detector's anchor matching, proposal sampling and NMS have data-dependent sizes (graph breaks): the
    # compile time would be most of a short run and the steady state never reached.
    not_run={"compile": "torch.compile is not run on a detector: new shapes every batch (recompiles) and "
                        "data-dependent sizes in matching and NMS (graph breaks)"},
))

LM = register(TaskDeclaration(
    name="lm",
    # Validation loss in nats per predicted token: lower is better (its perplexity is recorded beside it).
    metric=Metric("validation loss", "val loss", "min"),
    rate_unit="tokens",                  # real tokens, never padding (TokenBatch.rate_count)
    offers=frozenset({"", "documents"}),
    batches="token ids of documents of different lengths",
    implementation="trainfast.tasks.lm:LanguageModel",
    default_model=DEFAULT_LM_MODEL,
    # 512 of the standard library's documents (32 steps of 16), so the default ablation's every run is seconds on 2
    # cores; --data stdlib is all 13,000-odd of them.
    default_data="stdlib:512",
    # AdamW at 1e-3 with a short warm-up, batches of 16 documents, one epoch over the training documents.
    default_recipe=Recipe(epochs=1, batch_size=16, lr=1e-3, weight_decay=0.01, warmup_steps=20, log_every=10),
    models=LM_MODELS,
    split_class="trainfast.text.batching:TextSplit",
    check_name=check_lm_model,
    folders=("text",),
    parse_data=parse_text_spec,
    image_size="the language-model task reads documents, not images",
    refusals=(no_dp("a language model"),),
))
