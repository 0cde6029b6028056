"""Write an ImageFolder of real photos at ImageNet-like size from the two photos that ship inside
scikit-learn (sklearn.datasets.load_sample_images: china.jpg and flower.jpg, 640x427): nothing is downloaded.

Each image is a random crop (40-100% of the side) of one of the two photos, resized to 500x375 (or 375x500)
and saved as a quality-90 JPEG: real photographic content, so decode cost matches real photos.

Larger sizes (--size 2000x1500, phone-camera-like) are mosaics of crops at the photos' native resolution:
upscaling a 640x427 photo would give smooth images that compress, and decode, unrealistically well.

    python benchmarks/make_photo_folder.py OUT_DIR [--images 400] [--classes 4] [--size 500x375]
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
        if out_size[0] > w or out_size[1] > h:
            image = mosaic(photos, out_size, rng)
        else:
            image = photo.crop((x, y, x + cw, y + ch)).resize(out_size, Image.BICUBIC)
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"img{i:05d}.jpg", quality=90)
    return root


def mosaic(photos, size: tuple[int, int], rng: random.Random):
    """A size[0] x size[1] image tiled with native-resolution crops of the photos (no upscaling)."""
    from PIL import Image

    out = Image.new("RGB", size)
    tile_w, tile_h = 320, 240
    for top in range(0, size[1], tile_h):
        for left in range(0, size[0], tile_w):
            photo = rng.choice(photos)
            x, y = rng.randint(0, photo.size[0] - tile_w), rng.randint(0, photo.size[1] - tile_h)
            out.paste(photo.crop((x, y, x + tile_w, y + tile_h)), (left, top))
    return out


def parse_size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    return int(w), int(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--size", type=parse_size, default=(500, 375), help="WxH, default 500x375 (ImageNet-like)")
    args = parser.parse_args()
    root = make_photo_folder(args.out, args.images, args.classes, args.size)
    print(f"wrote {args.images} JPEGs of {args.size[0]}x{args.size[1]} in {args.classes} class folders under {root}")


if __name__ == "__main__":
    main()
