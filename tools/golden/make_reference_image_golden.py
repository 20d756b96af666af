#!/usr/bin/env python3
"""Writes tests/golden/reference_image.safetensors: image references normalised by the reference pipeline's own
MiniMaxH3Ref2VASetupStep (diffusers, Pillow; CPU):

    PYTHONPATH=.ref python3 tools/golden/make_reference_image_golden.py --out tests/golden

An image reference is encoded at a short edge of its own (the checkpoint's `reference_image_short_edge`, 2048 for the
release), both sides rounded to the canvas multiple, resized with LANCZOS unless it is already at that size.
Holds:
  sizes.source [N, 2] (width, height) and sizes.normalized [N, 2] (height, width) at short edge 2048, for source
  images of every shape in SIZES (uint8 zeros: only the geometry is kept)
  image.<k>.source [H, W, 3] U8 random RGB and image.<k>.normalized at short edge 96, for k in 0..2 (the last
  already at its target size, which passes through untouched)
"""

import argparse
import os
from types import SimpleNamespace

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers.image_processor import VaeImageProcessor
from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference
from diffusers.modular_pipelines.modular_pipeline import PipelineState

SIZES = [(1, 1), (3, 2), (1000, 1001), (1920, 1080), (1080, 1920), (4000, 1000), (1000, 4000), (1023, 767),
         (333, 1000), (2048, 1152), (2000, 500), (31, 97)]
IMAGES = [(50, 37), (37, 120), (160, 96)]  # (width, height); 160 x 96 is its own target at short edge 96


def normalize(images, short_edge):
    components = SimpleNamespace(
        config=SimpleNamespace(canvas_short_edge=768, canvas_max_pixels=768 * 1344,
                               reference_image_short_edge=short_edge),
        canvas_multiple=32, image_processor=VaeImageProcessor(vae_scale_factor=16), fps=24, vae_frames_per_chunk=17,
        vae_latents_per_chunk=5, min_duration=5.0, max_duration=15.0, audio_sampling_rate=32000,
    )
    state = PipelineState()
    state.set("references", [MiniMaxH3ImageReference(image=image) for image in images])
    state.set("num_frames", 121)
    # More images than a request may carry: the limits are the step's own validation, raised here.
    MiniMaxH3Ref2VASetupStep(max_images=len(images), max_references=len(images))(components, state)
    return [np.asarray(reference.image.convert("RGB")) for reference in state.get("normalized_references")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tensors = {}
    normalized = normalize([np.zeros((h, w, 3), dtype=np.uint8) for w, h in SIZES], 2048)
    tensors["sizes.source"] = torch.tensor(SIZES, dtype=torch.long)
    tensors["sizes.normalized"] = torch.tensor([image.shape[:2] for image in normalized], dtype=torch.long)
    rng = np.random.default_rng(31)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for w, h in IMAGES]
    for k, (source, image) in enumerate(zip(images, normalize(images, 96))):
        tensors[f"image.{k}.source"] = torch.from_numpy(source.copy())
        tensors[f"image.{k}.normalized"] = torch.from_numpy(image.copy())
        print(f"image {k}: {source.shape[1]}x{source.shape[0]} -> {image.shape[1]}x{image.shape[0]}")
    for (w, h), size in zip(SIZES, tensors["sizes.normalized"].tolist()):
        print(f"{w}x{h} -> {size[1]}x{size[0]}")
    path = os.path.join(args.out, "reference_image.safetensors")
    save_file(tensors, path)
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
