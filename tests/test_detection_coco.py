"""`coco:PATH` folders: what loads, what is refused (with which message), what is skipped and counted."""
import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import save_png

from trainfast.data.datasets import DataError, Skipped
from trainfast.detection import load_detection_data
from trainfast.detection.coco import load_coco

W, H = 60, 40


def instances(n_images: int = 5, per_image: int = 2) -> dict:
    """A valid COCO instances dict: category ids 5 and 9 (not 1..C, as in real COCO)."""
    images = [{"id": 100 + i, "file_name": f"img{i}.png", "width": W, "height": H} for i in range(n_images)]
    annotations = []
    for i in range(n_images):
        for k in range(per_image):
            annotations.append({"id": len(annotations) + 1, "image_id": 100 + i, "category_id": (5, 9)[k % 2],
                                "bbox": [2 + 10 * k, 3, 8, 12], "iscrowd": 0, "area": 96})
    return {"images": images, "annotations": annotations,
            "categories": [{"id": 9, "name": "dog"}, {"id": 5, "name": "cat"}]}


def write_folder(root: Path, data: dict, json_name: str = "instances.json", image_dir: str = "images") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / image_dir).mkdir(parents=True, exist_ok=True)
    for image in data["images"]:
        save_png(torch.full((3, image["height"], image["width"]), 90, dtype=torch.uint8),
                  str(root / image_dir / image["file_name"]))
    (root / json_name).parent.mkdir(parents=True, exist_ok=True)
    (root / json_name).write_text(json.dumps(data))
    return root


def test_valid_folder_loads_with_labels_from_category_order(tmp_path):
    split = load_detection_data(f"coco:{write_folder(tmp_path / 'c', instances(10))}")
    assert split.categories == ("cat", "dog") and split.num_classes == 3     # sorted by id: 5 -> 1, 9 -> 2
    assert len(split.train) == 8 and len(split.val) == 2 and not split.skipped
    image, target = split.train[0]
    assert image.shape == (3, H, W) and image.dtype == torch.uint8
    assert target["labels"].tolist() == [1, 2]
    assert target["boxes"].tolist() == [[2.0, 3.0, 10.0, 15.0], [12.0, 3.0, 20.0, 15.0]]    # xywh -> xyxy
    assert target["image_id"] >= 100 and split.train.sizes[0] == (H, W)


def test_train_and_val_jsons_and_coco_layout(tmp_path):
    root = tmp_path / "coco"
    data = instances(3)
    val = copy.deepcopy(data)
    for image in val["images"]:
        image["file_name"] = "v" + image["file_name"]
    write_folder(root, data, "annotations/instances_train2017.json", "train2017")
    write_folder(root, val, "annotations/instances_val2017.json", "val2017")
    split = load_coco(root)
    assert len(split.train) == 3 and len(split.val) == 3
    assert split.val.records[0].path == root / "val2017" / "vimg0.png"


def refused(tmp_path, data, *fragments, json_text=None):
    root = write_folder(tmp_path / "c", data)
    if json_text is not None:
        (root / "instances.json").write_text(json_text)
    with pytest.raises(DataError) as info:
        load_coco(root)
    message = str(info.value)
    assert "instances.json" in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_zero_size_box_refused_when_not_a_stray_one(tmp_path):
    data = instances(2)
    data["annotations"][1]["bbox"] = [5, 5, 0, 10]
    refused(tmp_path, data, "annotation id 2 (image id 100)", "[5, 5, 0, 10]", "zero width or height",
            "1 of 4 boxes have zero size")


def test_a_few_zero_size_boxes_are_dropped_and_counted(tmp_path):
    data = instances(50, per_image=3)                 # 150 annotations: one zero-size box is under 1%
    data["annotations"][4]["bbox"] = [5, 5, 7, 0]
    split = load_coco(write_folder(tmp_path / "c", data))
    assert split.skipped == {"zero-size box": 1}
    assert sum(len(r.boxes) for r in split.train.records + split.val.records) == 149


def test_negative_width_refused(tmp_path):
    data = instances(2)
    data["annotations"][2]["bbox"] = [30, 5, -10, 10]
    refused(tmp_path, data, "annotation id 3 (image id 101)", "[30, 5, -10, 10]", "negative width or height")


def test_box_outside_image_refused(tmp_path):
    data = instances(2)
    data["annotations"][0]["bbox"] = [50, 30, 20, 5]          # x2 = 70 > width 60
    refused(tmp_path, data, "annotation id 1 (image id 100)", "[50, 30, 20, 5]", "outside its 60x40 image img0.png")


def test_box_just_past_the_edge_is_clamped_and_counted(tmp_path):
    data = instances(5)
    data["annotations"][0]["bbox"] = [-0.5, 30, 20, 10.5]     # half a pixel past the left and bottom edges
    split = load_coco(write_folder(tmp_path / "c", data))
    assert split.skipped == {"box clamped to its image": 1}
    record = next(r for r in split.train.records + split.val.records if r.image_id == 100)
    assert record.boxes[0] == [0.0, 30.0, 19.5, 40.0]


def test_image_without_file_refused(tmp_path):
    data = instances(3)
    root = write_folder(tmp_path / "c", data)
    (root / "images" / "img1.png").unlink()
    with pytest.raises(DataError, match=r"instances.json.*image id 101: file 'img1.png' not found in .*images"):
        load_coco(root)


def test_unknown_category_refused(tmp_path):
    data = instances(2)
    data["annotations"][3]["category_id"] = 99
    refused(tmp_path, data, "annotation id 4 (image id 101)", "category id 99 is not in 'categories'", "[5, 9]")


def test_annotation_on_unknown_image_refused(tmp_path):
    data = instances(2)
    data["annotations"][0]["image_id"] = 7
    refused(tmp_path, data, "annotation id 1: image id 7 is not in 'images'")


@pytest.mark.parametrize("text, fragment", [
    ("", "the annotation file is empty"),
    ("  \n", "the annotation file is empty"),
    ('{"images": [', "not valid JSON (line 1 column"),
    ("[1, 2]", "expected a JSON object"),
    ('{"images": [], "categories": []}', "no 'annotations' list"),
])
def test_empty_or_invalid_json_refused(tmp_path, text, fragment):
    refused(tmp_path, instances(1), fragment, json_text=text)


def test_no_images_or_categories_refused(tmp_path):
    refused(tmp_path, {"images": [], "annotations": [], "categories": []}, "no categories", "no images")


def test_several_problems_listed_together(tmp_path):
    data = instances(3)
    data["annotations"][0]["category_id"] = 1
    data["annotations"][1]["bbox"] = [0, 0, -1, 1]
    data["images"].append({"id": 100, "file_name": "dup.png", "width": W, "height": H})
    message = refused(tmp_path, data, "3 problem(s)", "image id 100 is listed twice", "category id 1 ",
                      "negative width")
    assert message.count(";") == 2


def test_crowd_and_unannotated_training_images_skipped_and_counted(tmp_path):
    data = instances(10)
    data["annotations"][0]["iscrowd"] = 1
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] != 105]   # image 105: no annotation
    split = load_coco(write_folder(tmp_path / "c", data))
    in_val = any(r.image_id == 105 for r in split.val.records)
    assert split.skipped["crowd annotation"] == 1
    assert split.skipped["training image without annotations"] == (0 if in_val else 1)
    assert len(split.train) + len(split.val) == 10 - (0 if in_val else 1)


def test_unreadable_or_mis_sized_image_is_skipped_at_read_time(tmp_path):
    data = instances(5)
    root = write_folder(tmp_path / "c", data)
    (root / "images" / "img0.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    save_png(torch.zeros(3, 10, 10, dtype=torch.uint8), str(root / "images" / "img1.png"))
    split = load_coco(root)
    items = {r.image_id: ds[i] for ds in (split.train, split.val) for i, r in enumerate(ds.records)}
    assert isinstance(items[100], Skipped) and "img0.png" in items[100].path
    assert isinstance(items[101], Skipped) and "decoded 10x10, the annotations say 60x40" in items[101].reason
    assert not isinstance(items[102], Skipped)


def test_missing_folder_and_ambiguous_jsons(tmp_path):
    with pytest.raises(DataError, match="folder does not exist"):
        load_coco(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no instances\\*.json"):
        load_coco(tmp_path / "empty")
    root = write_folder(tmp_path / "two", instances(2), "instances_a.json")
    (root / "instances_b.json").write_text("{}")
    with pytest.raises(DataError, match="instances_a.json, instances_b.json; expected one"):
        load_coco(root)
