#!/usr/bin/env python3
"""Writes tests/golden/keyframe_resize.safetensors: Pillow's LANCZOS resize of 8-bit RGB images, the keyframe
canvas the reference pipeline resolves from an image size, and its stretch / cover-crop onto that canvas:

    PYTHONPATH=.ref python3 tools/golden/make_keyframe_resize_golden.py --out tests/golden

`in.image.<k>` (U8 [H, W, 3]) are random images; `resize.<k>.<h>x<w>` is Image.resize((w, h), LANCZOS) of image k;
`canvas` (I64 [n, 4]) rows are (source width, source height, canvas height, canvas width) from the pipeline's
resolve_canvas_size (multiple 32, short edge 768, 768 * 1344 pixels); `fit.<k>.first` / `fit.<k>.last` are image k
prepared as MiniMaxH3ResizeStep prepares the first keyframe (stretched) and a following one (cover-cropped: scale
by the larger axis ratio, Python-rounded sizes at least the canvas, centred crop) for canvas `fit_canvas` (I64 [2]:
height, width). Metadata: the Pillow version.
"""

import argparse
import os

import numpy as np
import PIL
import torch
from PIL import Image
from safetensors.torch import save_file

from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

IMAGES = [(97, 131), (300, 200), (48, 64)]  # (height, width)
RESIZES = [(64, 96), (200, 320), (150, 90), (97, 200), (13, 17)]
CANVAS_SOURCES = [(1920, 1080), (1080, 1920), (1000, 1000), (4000, 3000), (640, 480), (2000, 600), (1366, 768),
                  (731, 1299), (513, 2048)]
FIT_CANVAS = (96, 128)


def fit_last(image, height, width):
    """A following keyframe: cover the canvas, then crop its centre."""
    scale = max(width / image.size[0], height / image.size[1])
    size = (max(width, round(image.size[0] * scale)), max(height, round(image.size[1] * scale)))
    left = max(0, (size[0] - width) // 2)
    top = max(0, (size[1] - height) // 2)
    return image.resize(size, Image.Resampling.LANCZOS).crop((left, top, left + width, top + height))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(2026)
    tensors = {}
    for k, (h, w) in enumerate(IMAGES):
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        # Smooth structure as well as noise, so both the ringing and the averaging of the filter show.
        yy, xx = np.mgrid[0:h, 0:w]
        pixels[..., 0] = ((np.sin(xx / 5.0) + np.cos(yy / 7.0)) * 60 + 128).clip(0, 255).astype(np.uint8)
        tensors[f"in.image.{k}"] = torch.from_numpy(pixels.copy())
        image = Image.fromarray(pixels, mode="RGB")
        for rh, rw in RESIZES:
            out = np.asarray(image.resize((rw, rh), Image.Resampling.LANCZOS))
            tensors[f"resize.{k}.{rh}x{rw}"] = torch.from_numpy(out.copy())
        height, width = FIT_CANVAS
        first = image if image.size == (width, height) else image.resize((width, height), Image.Resampling.LANCZOS)
        tensors[f"fit.{k}.first"] = torch.from_numpy(np.asarray(first).copy())
        last = image if image.size == (width, height) else fit_last(image, height, width)
        tensors[f"fit.{k}.last"] = torch.from_numpy(np.asarray(last).copy())
    rows = []
    for sw, sh in CANVAS_SOURCES:
        ch, cw = resolve_canvas_size(sw, sh, 32, 768, 768 * 1344)
        rows.append([sw, sh, ch, cw])
    tensors["canvas"] = torch.tensor(rows, dtype=torch.int64)
    tensors["fit_canvas"] = torch.tensor(FIT_CANVAS, dtype=torch.int64)
    path = os.path.join(args.out, "keyframe_resize.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"pillow": PIL.__version__})
    print(f"{path}: {os.path.getsize(path)} bytes, Pillow {PIL.__version__}")


if __name__ == "__main__":
    main()
