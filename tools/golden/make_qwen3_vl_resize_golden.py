#!/usr/bin/env python3
"""Writes tests/golden/qwen3_vl_small/resize.safetensors: what the Qwen3-VL image and video processors
make of pictures and videos whose sides they resize (bicubic), for the port of that resize.

Runs on the GPU machine's CPU (transformers, torchvision, PyTorch and Pillow are installed there; no
model is loaded):

    python3 tools/golden/make_qwen3_vl_resize_golden.py --out tests/golden/qwen3_vl_small

Run on the GPU machine in session 49 (transformers 5.17.0, torch 2.11.0, torchvision 0.26.0; the committed
file is that run's output less the candidates and pixel values the script no longer writes):
the processors reproduce torchvision's uint8 resize exactly in every case (the `stats` below).

The C++ processors resize an image or video whose size smart_resize changes with
cpu::resize_bicubic_rgb8 (src/cpu/image_resize.h), the port these cases check. H3's keyframe
canvas and its reference images are multiples of 32 and within the released budgets, so those never
resize; a video reference whose sampled frames exceed the video processor's pixel budget does. Each case below
forces a resize: sides rounded to multiples of 32, a picture over max_pixels (downscaled), one under
min_pixels (upscaled), and videos whose frames together exceed the budget.

For every case the file holds the input (`image.<i>`: uint8 [H, W, 3]; `video.<i>`: uint8
[frames, H, W, 3]), the processor's grid (`image.<i>.grid`, `video.<i>.grid`: int64 [3]) and the
resize that reproduces the processor (`<case>.resized.uint8`: torchvision's F.resize of the uint8
tensor, bicubic, antialias; uint8 [.., h, w, 3]). One small case keeps the processor's whole output
(`image.2.pixel_values`, f32) as an end-to-end check; the others' would add 6 MB to what the
patching tests already prove.

Two other candidates were tried against the processor in every case and are recorded only in the
`stats` metadata: F.resize of the float32 tensor, then round-half-even and clamp to uint8; and
Pillow's Image.resize(BICUBIC) frame by frame. `max_abs_difference` names, for each case and
candidate, the largest difference between the processor's pixel values and the same processor fed
that candidate (already at the target size, so the processor does not resize it again); the port
reproduces the candidate whose difference is 0. The metadata also records the versions.
"""

import argparse
import json

import numpy as np
import torch
import torchvision
import transformers
from PIL import Image
from safetensors.torch import save_file
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

# (height, width) of the pictures, and where smart_resize takes them under IMAGE_SIZE: sides rounded to
# 32s (130 x 200 -> 128 x 192), over max_pixels (300 x 517 -> 192 x 320), under min_pixels
# (40 x 45 -> 96 x 96) and a wide one over max_pixels (97 x 1210 -> 64 x 896).
PICTURES = [(130, 200), (300, 517), (40, 45), (97, 1210)]
# (frames, height, width) of the videos under VIDEO_SIZE: four frames over the budget
# (200 x 333 -> 96 x 192), and six within it but with a side rounded (130 x 96 -> 128 x 96).
VIDEOS = [(4, 200, 333), (6, 130, 96)]
MEAN_STD = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
IMAGE_SIZE = {"shortest_edge": 8 * 32 * 32, "longest_edge": 64 * 32 * 32}
VIDEO_SIZE = {"shortest_edge": 8 * 32 * 32, "longest_edge": 96 * 32 * 32}
WRITTEN_CANDIDATE = "uint8"  # the candidate the processors reproduce (stats); the others are not written
WHOLE_OUTPUT = {"image.2"}   # the cases whose pixel values are written


def pattern(shape, seed):
    """Smooth gradients plus noise: a resize of pure noise would hide a wrong filter's shape."""
    g = np.random.default_rng(seed)
    *lead, h, w, c = shape
    y = np.linspace(0.0, 1.0, h)[:, None, None]
    x = np.linspace(0.0, 1.0, w)[None, :, None]
    base = 255.0 * (0.5 + 0.4 * np.sin(6.0 * x + 4.0 * y + np.arange(c)[None, None, :]))
    noisy = base + g.normal(0.0, 20.0, size=tuple(lead) + (h, w, c))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def candidates(frames, size):
    """The three candidate resizes of uint8 [T, H, W, 3] frames to size (h, w), as uint8 [T, h, w, 3]."""
    chw = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
    as_uint8 = F.resize(chw, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    as_float = F.resize(chw.float(), list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    as_float = torch.round(as_float).clamp(0, 255).to(torch.uint8)
    pil = np.stack([np.asarray(Image.fromarray(f).resize((size[1], size[0]), Image.BICUBIC)) for f in frames])
    return {
        "uint8": as_uint8.permute(0, 2, 3, 1).contiguous().numpy(),
        "float": as_float.permute(0, 2, 3, 1).contiguous().numpy(),
        "pil": pil,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    image_processor = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, size=IMAGE_SIZE,
                                            **MEAN_STD)
    video_processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, size=VIDEO_SIZE,
                                            **MEAN_STD)
    tensors, stats = {}, {"transformers": transformers.__version__, "torch": torch.__version__,
                          "torchvision": torchvision.__version__, "image_size": IMAGE_SIZE,
                          "video_size": VIDEO_SIZE, "cases": {}}

    def record(name, frames, pixels, grid, run):
        """frames: uint8 [T, H, W, 3]; run(candidate frames) -> the processor's pixel values for them."""
        h, w = int(grid[1]) * 16, int(grid[2]) * 16
        assert (h, w) != frames.shape[1:3], f"{name}: the processor did not resize it"
        tensors[f"{name}.grid"] = torch.tensor([int(v) for v in grid], dtype=torch.int64)
        differences = {}
        for kind, resized in candidates(frames, (h, w)).items():
            if kind == WRITTEN_CANDIDATE:
                tensors[f"{name}.resized.{kind}"] = torch.from_numpy(resized)
            again = run(resized)
            differences[kind] = float((again - pixels).abs().max())
        stats["cases"][name] = {"from": list(frames.shape[1:3]), "to": [h, w], "max_abs_difference": differences}

    for i, (h, w) in enumerate(PICTURES):
        picture = pattern((h, w, 3), 100 + i)
        out = image_processor(images=[picture], return_tensors="pt")
        tensors[f"image.{i}"] = torch.from_numpy(picture)
        if f"image.{i}" in WHOLE_OUTPUT:
            tensors[f"image.{i}.pixel_values"] = out["pixel_values"]
        record(f"image.{i}", picture[None], out["pixel_values"], out["image_grid_thw"][0],
               lambda r: image_processor(images=[r[0]], return_tensors="pt")["pixel_values"])
    for i, shape in enumerate(VIDEOS):
        frames = pattern(shape + (3,), 200 + i)
        out = video_processor(videos=[frames], do_sample_frames=False, return_tensors="pt")
        tensors[f"video.{i}"] = torch.from_numpy(frames)
        if f"video.{i}" in WHOLE_OUTPUT:
            tensors[f"video.{i}.pixel_values"] = out["pixel_values_videos"]
        record(f"video.{i}", frames, out["pixel_values_videos"], out["video_grid_thw"][0],
               lambda r: video_processor(videos=[r], do_sample_frames=False,
                                         return_tensors="pt")["pixel_values_videos"])
    path = f"{args.out}/resize.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"stats": json.dumps(stats)})
    print(json.dumps(stats, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
