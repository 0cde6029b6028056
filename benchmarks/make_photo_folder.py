"""Write an ImageFolder of real photos at ImageNet-like size from the two photos that ship inside
scikit-learn (sklearn.datasets.load_sample_images: china.jpg and flower.jpg, 640x427): nothing is downloaded.

Each image is a random crop (40-100% of the side) of one of the two photos, resized to 500x375 (or 375x500)
and saved as a quality-90 JPEG: real photographic content, so decode cost matches real photos.

    python benchmarks/make_photo_folder.py OUT_DIR [--images 400] [--classes 4]
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path


def make_photo_folder(root: str | Path, images: int = 400, classes: int = 4, size: tuple[int, int] = (500, 375),
                      seed: int = 0) -> Path:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    root = Path(root)
    photos = [Image.fromarray(a) for a in load_sample_images().images]
    rng = random.Random(seed)
    for i in range(images):
        photo = photos[i % len(photos)]
        w, h = photo.size
        frac = rng.uniform(0.4, 1.0)
        cw, ch = int(w * frac), int(h * frac)
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        out_size = size if rng.random() < 0.75 else size[::-1]    # a quarter in portrait, as in real folders
        image = photo.crop((x, y, x + cw, y + ch)).resize(out_size, Image.BICUBIC)
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"img{i:05d}.jpg", quality=90)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=4)
    args = parser.parse_args()
    root = make_photo_folder(args.out, args.images, args.classes)
    print(f"wrote {args.images} JPEGs in {args.classes} class folders under {root}")


if __name__ == "__main__":
    main()
