#!/usr/bin/env python3
"""Writes the MiniMax-H3 video VAE decoder parity golden under tests/golden/video_vae_test/ by running the diffusers
reference.

Runs where PyTorch lives (the GPU machine), with the reference implementation brought as a git-ignored copy of
diffusers' `src/diffusers` (never committed):

    PYTHONPATH=.ref python3 tools/golden/make_video_vae_golden.py --out tests/golden

The reference runs in fp32 on the CPU, one thread: the same bytes on every run (no autocast: the pipeline only
autocasts to fp16 on CUDA). The config is the conversion script's MINIMAX_H3_TEST_VIDEO_VAE_CONFIG with random
latent statistics. The weights are not stored: they are the pure function of (name, element, seed) that
vortex::vae::synthetic_video_vae_tensors computes (splitmix64 of fnv1a64(name) + seed * golden-ratio + element),
rebuilt here with exact integer and fp32 arithmetic. The latents [24, 12, 6, 6] exercise two temporal chunks
(12 = 5 * 2 + 2 latents -> 39 frames) and, with 16-pixel tiles and a 4-pixel minimum overlap, 2 x 2 spatial tiles
whose overlap the reference widens to 8 pixels.

io_fp32.safetensors holds
  in.latents [C, T, H, W]                 normalised latents, as the transformer emits them
  out.post_quant_conv, out.decoder.proj_in, out.decoder.transformer_blocks.<i>, out.decoder.norm_out,
  out.decoder.proj_out, out.decoder       the first decoder call (chunk 0, tile (0, 0)), batch dim dropped
  out.clip.0 [3, F, H, W]                 chunk 0's stitched tiles
  out.frames [3, 39, 24, 24]              de-normalised, clamped frames
and the metadata keys `config` (diffusers config JSON), `seed` and `tiling` (the enable_tiling arguments).
"""

import argparse
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers import AutoencoderKLMiniMaxH3

TEST_CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 24,
    "block_out_channels": [32, 64],
    "layers_per_block": 1,
    "spatial_downsample_factors": [2, 2],
    "temporal_downsample_factors": [2, 2],
    "norm_num_groups": 32,
    "norm_eps": 1e-06,
    "spatial_padding_mode": "reflect",
    "decoder_num_layers": 4,
    "decoder_num_attention_heads": 4,
    "decoder_attention_head_dim": 32,
    "decoder_num_register_tokens": 4,
    "decoder_ffn_mult": 4,
    "decoder_rope_theta": 100.0,
    "decoder_rope_dim_ratio": 0.75,
    "decoder_norm_eps": 1e-05,
    "clip_length": 17,
    "token_drop": 3,
}
TILING = {
    "tile_sample_min_height": 16,
    "tile_sample_min_width": 16,
    "tile_sample_min_overlap_height": 4,
    "tile_sample_min_overlap_width": 4,
}
SEED = 1234
LATENT_SHAPE = (24, 12, 6, 6)
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
MASK = (1 << 64) - 1


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h ^= byte
        h = (h * 0x100000001B3) & MASK
    return h


def splitmix64(x):  # x: uint64 array
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def synthetic(name, shape, seed):
    """The C++ rule: see vortex::vae::synthetic_video_vae_tensors."""
    numel = int(np.prod(shape))
    key = (fnv1a64(name) + seed * 0x9E3779B97F4A7C15) & MASK
    with np.errstate(over="ignore"):
        h = splitmix64(np.uint64(key) + np.arange(numel, dtype=np.uint64))
    v = ((h >> np.uint64(40)).astype(np.float64) / 8388608.0 - 1.0).astype(np.float32)
    norm_weight = name.endswith(("norm1.weight", "norm2.weight")) or name == "decoder.norm_out.weight"
    if norm_weight:
        out = np.float32(1.0) + np.float32(0.25) * v
    elif name.endswith(".weight"):
        out = v * np.float32(1.0 / np.sqrt(float(shape[1])))
    else:
        out = v * np.float32(0.5)
    return torch.from_numpy(out.reshape(shape).astype(np.float32))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)

    generator = torch.Generator().manual_seed(SEED)
    config = dict(TEST_CONFIG)
    config["latents_mean"] = (torch.randn(24, generator=generator) * 0.5).tolist()
    config["latents_std"] = (torch.rand(24, generator=generator) + 0.5).tolist()
    model = AutoencoderKLMiniMaxH3(**config).eval()

    with torch.no_grad():
        decoder_names = 0
        for name, param in model.state_dict().items():
            if not (name.startswith("decoder.") or name.startswith("post_quant_conv.")):
                continue
            # The C++ schema holds post_quant_conv as [C, C, 1, 1, 1] with fan-in C; so does torch.
            model.state_dict()[name].copy_(synthetic(name, tuple(param.shape), SEED))
            decoder_names += 1
    print(f"{decoder_names} decoder tensors filled")
    model.enable_tiling(**TILING)

    records = {}

    def hook(name):
        def fn(_module, _inputs, output):
            if name not in records:
                records[name] = output.detach()[0].clone()
        return fn

    model.post_quant_conv.register_forward_hook(hook("post_quant_conv"))
    model.decoder.proj_in.register_forward_hook(hook("decoder.proj_in"))
    for i, block in enumerate(model.decoder.transformer_blocks):
        block.register_forward_hook(hook(f"decoder.transformer_blocks.{i}"))
    model.decoder.norm_out.register_forward_hook(hook("decoder.norm_out"))
    model.decoder.proj_out.register_forward_hook(hook("decoder.proj_out"))
    model.decoder.register_forward_hook(hook("decoder"))
    original_decode_clip = model._decode_clip
    clip_index = [0]

    def decode_clip(z):
        out = original_decode_clip(z)
        records.setdefault(f"clip.{clip_index[0]}", out.detach()[0].clone())
        clip_index[0] += 1
        return out

    model._decode_clip = decode_clip

    latents = torch.randn(LATENT_SHAPE, generator=generator)
    with torch.no_grad():
        # MiniMaxH3VideoDecodeStep's math (its autocast is CUDA-only).
        mean = torch.tensor(config["latents_mean"]).view(1, -1, 1, 1, 1)
        std = torch.tensor(config["latents_std"]).view(1, -1, 1, 1, 1)
        z = latents[None] * std + mean
        video = model.decode(z, return_dict=False)[0]
        pixel_mean = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
        pixel_std = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
        frames = (video.float() * pixel_std + pixel_mean).clamp(0, 1)[0]

    io = {"in.latents": latents.contiguous()}
    for name, value in records.items():
        if name.startswith("clip.") and name != "clip.0":
            continue
        io[f"out.{name}"] = value.contiguous()
    io["out.frames"] = frames.contiguous()
    folder = os.path.join(args.out, "video_vae_test")
    os.makedirs(folder, exist_ok=True)
    full_config = {"_class_name": "AutoencoderKLMiniMaxH3", **config}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(full_config, f, indent=2)
    metadata = {"config": json.dumps(full_config), "seed": str(SEED), "tiling": json.dumps(TILING)}
    path = os.path.join(folder, "io_fp32.safetensors")
    save_file(io, path, metadata=metadata)
    print(f"{path}: {os.path.getsize(path)} bytes, frames {tuple(frames.shape)}")


if __name__ == "__main__":
    main()
