"""`--data coco:PATH`: a COCO-format folder (an instances*.json plus its images), checked before training.

Layout: PATH/instances_train*.json and PATH/instances_val*.json (or the same under PATH/annotations/) give
the two splits; a single PATH/instances*.json is split 80/20 by image, with the fixed split of the
classification data (datasets.split_indices), so every run is scored on the same images. An image's
`file_name` is looked up in PATH, PATH/images, PATH/<split> and PATH/images/<split>, <split> being what
follows "instances_" in the json's name (train2017 for instances_train2017.json, COCO's own layout).

Refused, before any training starts (DataError naming the json, the image or annotation id and the value;
all problems are collected and the first few listed, so one run shows what to fix):
  - a json that cannot be read, is empty, is not valid JSON, or lacks "images", "annotations" or
    "categories"; a category, image or annotation without its required fields; a duplicate id;
  - an image whose file is in none of the places above;
  - an annotation on an image id the json does not list, or with a category id it does not list;
  - a box with a negative width or height (a malformed annotation, e.g. xyxy written where COCO's
    [x, y, width, height] belongs), or one reaching more than EDGE_TOLERANCE pixels outside its image;
  - boxes with zero width or height above MAX_DEGENERATE_FRACTION of the annotations (then it is the
    annotation pipeline that is broken, not a few clicks).
Skipped or changed, and counted in DetectionSplit.skipped (shown with the metrics, never silent):
  - crowd annotations (iscrowd=1): COCO's evaluation ignores crowd regions rather than scoring them,
    and torchvision's references drop them from training targets; we drop them from both;
  - a few boxes of zero width or height (a stray click): dropped;
  - boxes past an edge by at most EDGE_TOLERANCE pixels (COCO's own boxes come from rounded polygons):
    clamped to the image;
  - training images left without any annotation: nothing for the loss to match, as in torchvision's
    references; they stay in the validation split, where any detection on them is a false positive.
Unreadable image files are found while training: skipped and counted like classification's
(data/badfiles.py). A decoded size differing from the json's width/height counts as unreadable too: its
boxes would be in the wrong place.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..data.datasets import Skipped, split_indices
from ..errors import DataError
from .data import DetectionSplit

EDGE_TOLERANCE = 1.0             # pixels a box may pass its image's edge before it is an error
MAX_DEGENERATE_FRACTION = 0.01   # zero-size boxes dropped (and counted) up to this share of the annotations
MAX_LISTED = 5                   # problems spelled out in one error message


@dataclass
class ImageRecord:
    path: Path
    image_id: int
    height: int
    width: int
    boxes: list            # xyxy, pixels
    labels: list           # 1..C


class CocoImages(Dataset):
    """item -> (uint8 [3, H, W], {"boxes", "labels", "image_id"}), or Skipped for an unreadable file."""

    def __init__(self, records: list[ImageRecord]) -> None:
        self.records = records
        self.sizes = [(r.height, r.width) for r in records]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        from ..data.imagefolder import decode_bytes, describe_error, read_bytes

        record = self.records[index]
        try:
            image = decode_bytes(read_bytes(record.path), record.path)
        except (RuntimeError, OSError, ValueError) as exc:
            return Skipped(str(record.path), f"{type(exc).__name__}: {describe_error(exc)}")
        if tuple(image.shape[-2:]) != (record.height, record.width):
            return Skipped(str(record.path), f"decoded {image.shape[-1]}x{image.shape[-2]}, the annotations say "
                                             f"{record.width}x{record.height} (image id {record.image_id})")
        target = {"boxes": torch.tensor(record.boxes, dtype=torch.float32).reshape(-1, 4),
                  "labels": torch.tensor(record.labels, dtype=torch.int64), "image_id": record.image_id}
        return image, target


class Problems:
    """Refusals collected while checking one json: raised together, the first few spelled out."""

    def __init__(self, source: Path) -> None:
        self.source, self.items = source, []

    def add(self, message: str) -> None:
        self.items.append(message)

    def raise_if_any(self) -> None:
        if self.items:
            listed = "; ".join(self.items[:MAX_LISTED])
            more = f" (and {len(self.items) - MAX_LISTED} more)" if len(self.items) > MAX_LISTED else ""
            raise DataError(f"{self.source}: {len(self.items)} problem(s): {listed}{more}")


def read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the annotation file ({exc})") from exc
    if not text.strip():
        raise DataError(f"{path}: the annotation file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object with images, annotations and categories, "
                        f"got {type(data).__name__}")
    missing = [key for key in ("images", "annotations", "categories") if not isinstance(data.get(key), list)]
    if missing:
        raise DataError(f"{path}: no {', '.join(repr(k) for k in missing)} list (a COCO instances file has "
                        f"'images', 'annotations' and 'categories')")
    return data


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_categories(data: dict, problems: Problems) -> dict[int, str]:
    categories: dict[int, str] = {}
    for position, category in enumerate(data["categories"]):
        cid = category.get("id") if isinstance(category, dict) else None
        if not is_int(cid) or not isinstance(category.get("name"), str):
            problems.add(f"category #{position} needs an integer 'id' and a 'name', got {category!r}"[:200])
        elif cid in categories:
            problems.add(f"category id {cid} is listed twice")
        else:
            categories[cid] = category["name"]
    if not data["categories"]:
        problems.add("no categories")
    return categories


def image_folders(root: Path, json_path: Path) -> list[Path]:
    split = json_path.stem.partition("instances_")[2] or None
    folders = [root, root / "images"]
    if split:
        folders += [root / split, root / "images" / split]
    return folders


def read_images(data: dict, root: Path, json_path: Path, problems: Problems) -> dict[int, ImageRecord]:
    images: dict[int, ImageRecord] = {}
    folders = image_folders(root, json_path)
    for position, image in enumerate(data["images"]):
        if not isinstance(image, dict):
            problems.add(f"image #{position} is not an object: {image!r}"[:200])
            continue
        iid, name, width, height = (image.get(k) for k in ("id", "file_name", "width", "height"))
        if not is_int(iid):
            problems.add(f"image #{position} ({name!r}) has no integer 'id' (got {iid!r})")
            continue
        if iid in images:
            problems.add(f"image id {iid} is listed twice")
            continue
        if not isinstance(name, str) or not name:
            problems.add(f"image id {iid}: 'file_name' is {name!r}")
            continue
        if not (is_int(width) and is_int(height) and width > 0 and height > 0):
            problems.add(f"image id {iid} ({name}): width/height must be positive integers, got {width!r}x{height!r}")
            continue
        path = next((folder / name for folder in folders if (folder / name).is_file()), None)
        if path is None:
            places = ", ".join(str(f) for f in folders)
            problems.add(f"image id {iid}: file {name!r} not found in {places}")
            continue
        images[iid] = ImageRecord(path, iid, height, width, [], [])
    if not data["images"]:
        problems.add("no images")
    return images


def read_annotations(data: dict, images: dict[int, ImageRecord], label_of: dict[int, int],
                     problems: Problems, skipped: Counter, all_image_ids: set) -> None:
    """Adds each usable box to its image's record; refusals to `problems`, drops to `skipped`."""
    degenerate = []
    for position, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict):
            problems.add(f"annotation #{position} is not an object: {ann!r}"[:200])
            continue
        aid, iid, cid, bbox = (ann.get(k) for k in ("id", "image_id", "category_id", "bbox"))
        where = f"annotation id {aid} (image id {iid})"
        if iid not in all_image_ids:
            problems.add(f"annotation id {aid}: image id {iid!r} is not in 'images'")
            continue
        if cid not in label_of:
            known = sorted(label_of)
            problems.add(f"{where}: category id {cid!r} is not in 'categories' (known: {known[:20]})")
            continue
        if not (isinstance(bbox, list) and len(bbox) == 4
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)):
            problems.add(f"{where}: 'bbox' must be 4 finite numbers [x, y, width, height], got {bbox!r}"[:200])
            continue
        if iid not in images:            # the image itself was refused above: its problem is already listed
            continue
        if ann.get("iscrowd", 0):
            skipped["crowd annotation"] += 1
            continue
        x, y, w, h = (float(v) for v in bbox)
        if w < 0 or h < 0:
            problems.add(f"{where}: bbox {bbox} has a negative width or height (COCO boxes are [x, y, width, height])")
            continue
        if w == 0 or h == 0:
            degenerate.append(f"{where}: bbox {bbox} has zero width or height")
            continue
        record = images[iid]
        x1, y1, x2, y2 = x, y, x + w, y + h
        t = EDGE_TOLERANCE
        if x1 < -t or y1 < -t or x2 > record.width + t or y2 > record.height + t:
            problems.add(f"{where}: bbox {bbox} (xyxy {x1:g},{y1:g},{x2:g},{y2:g}) lies outside its "
                         f"{record.width}x{record.height} image {record.path.name}")
            continue
        clamped = (max(x1, 0.0), max(y1, 0.0), min(x2, float(record.width)), min(y2, float(record.height)))
        if clamped != (x1, y1, x2, y2):
            skipped["box clamped to its image"] += 1
        if clamped[2] <= clamped[0] or clamped[3] <= clamped[1]:
            degenerate.append(f"{where}: bbox {bbox} is empty inside its image")
            continue
        record.boxes.append(list(clamped))
        record.labels.append(label_of[cid])
    if len(degenerate) > MAX_DEGENERATE_FRACTION * max(1, len(data["annotations"])):
        for message in degenerate:
            problems.add(message)
        problems.add(f"{len(degenerate)} of {len(data['annotations'])} boxes have zero size, above the "
                     f"{MAX_DEGENERATE_FRACTION:.0%} that are dropped and counted")
    elif degenerate:
        skipped["zero-size box"] += len(degenerate)


def read_instances(json_path: Path, root: Path, categories: dict[int, str] | None = None):
    """(records, categories, skipped) of one instances json, or DataError listing what is wrong with it.
    `categories`: the train json's, which a val json must match (the labels are the category positions)."""
    data = read_json(json_path)
    problems = Problems(json_path)
    own = read_categories(data, problems)
    if categories is not None and own and own != categories:
        problems.add(f"its categories {sorted(own.items())[:10]} differ from the training json's "
                     f"{sorted(categories.items())[:10]}")
    categories = own if categories is None else categories
    label_of = {cid: position + 1 for position, cid in enumerate(sorted(categories))}
    images = read_images(data, root, json_path, problems)
    all_ids = {image.get("id") for image in data["images"] if isinstance(image, dict)}
    skipped: Counter = Counter()
    read_annotations(data, images, label_of, problems, skipped, all_ids)
    problems.raise_if_any()
    return list(images.values()), categories, skipped


def find_instances(root: Path) -> tuple[Path, Path | None]:
    """(train json, val json or None) under root or root/annotations."""
    if not root.is_dir():
        raise DataError(f"--data coco:{root}: folder does not exist")
    found = sorted(root.glob("instances*.json")) or sorted((root / "annotations").glob("instances*.json"))
    if not found:
        raise DataError(f"--data coco:{root}: no instances*.json in {root} or {root / 'annotations'}")
    train = [p for p in found if p.stem.startswith("instances_train")]
    val = [p for p in found if p.stem.startswith("instances_val")]
    if len(train) == 1 and len(val) == 1:
        return train[0], val[0]
    if len(found) == 1:
        return found[0], None
    raise DataError(f"--data coco:{root}: found {', '.join(p.name for p in found)}; expected one instances*.json, "
                    f"or one instances_train*.json and one instances_val*.json")


def without_empty(records: list[ImageRecord], skipped: Counter) -> list[ImageRecord]:
    kept = [r for r in records if r.boxes]
    if len(kept) < len(records):
        skipped["training image without annotations"] += len(records) - len(kept)
    return kept


def load_coco(path: str | Path) -> DetectionSplit:
    root = Path(path)
    train_json, val_json = find_instances(root)
    records, categories, skipped = read_instances(train_json, root)
    if val_json is None:
        train_idx, val_idx = split_indices(len(records), 0.2)
        train_records = [records[i] for i in train_idx.tolist()]
        val_records = [records[i] for i in val_idx.tolist()]
    else:
        train_records = records
        val_records, _, val_skipped = read_instances(val_json, root, categories)
        skipped.update(val_skipped)
    train_records = without_empty(train_records, skipped)
    if not train_records:
        raise DataError(f"{train_json}: no training image has a usable annotation")
    if not any(r.boxes for r in val_records):
        raise DataError(f"{val_json or train_json}: the validation images hold no usable annotation, so mAP "
                        f"would be undefined")
    names = tuple(categories[cid] for cid in sorted(categories))
    return DetectionSplit(CocoImages(train_records), CocoImages(val_records), names, f"coco:{root}", skipped)
