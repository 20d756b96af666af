#!/usr/bin/env python3
"""Writes the MiniMax-H3 video VAE encoder parity golden under tests/golden/video_vae_encoder_test/ by running the
diffusers reference.

Runs where PyTorch lives (the GPU machine), with the reference implementation brought as a git-ignored copy of
diffusers' `src/diffusers` (never committed):

    PYTHONPATH=.ref python3 tools/golden/make_video_vae_encoder_golden.py --out tests/golden

The reference runs in fp32 on the CPU, one thread (the pipeline encodes in fp32: the encoder is pinned there). The
config is small but has every structure of the release's encoder: three levels of widths 32 / 64 / 64 with two
resnets each (a 1x1x1 shortcut where the width changes), a spatial-only downsampler, a spatio-temporal one and a level
without one; clip_length 9 and token_drop 2 (a 9-frame clip gives 5 latents). The weights are not stored: they are the
pure function of (name, element, seed) that vortex::vae::synthetic_video_vae_encoder_tensors computes (the decoder
golden's rule, conv weights scaled by 1/sqrt of their fan-in), rebuilt here with exact integer and fp32 arithmetic.

io_fp32.safetensors holds
  in.keyframe_rgb8 [96, 128, 3] (U8)     a keyframe's RGB pixels, as an image decoder gives them
  out.keyframe.pixels [3, 1, 96, 128]    the pipeline's ImageNet-normalised encoder input
  out.keyframe.encoder.conv_in, out.keyframe.encoder.down_blocks.<i>, out.keyframe.encoder.conv_out,
  out.keyframe.quant_conv                the first encoder call (tile (0, 0)), batch dim dropped
  out.keyframe.moments [48, 1, 24, 32]   the stitched moments of 2 x 3 tiles (64-pixel tiles, 16-pixel minimum
                                         overlap, widened by the reference to 32)
  out.keyframe.eps [24, 1, 24, 32]       the posterior's draw: a CPU generator seeded 42
  out.keyframe.condition [24, 1, 24, 32] encode_vae_condition's normalised latents
  in.clip [3, 12, 64, 96]                normalised pixels of a 12-frame clip (padded by the reference to 18)
  out.clip.moments [48, 8, 16, 24]       two 9-frame clips, 2 tiles each, the last 2 latent frames dropped
and the metadata keys `config` (diffusers config JSON), `seed` and `tiling` (the enable_tiling arguments).
"""

import argparse
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers import AutoencoderKLMiniMaxH3
from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition
from make_video_vae_golden import MASK, PIXEL_MEAN, PIXEL_STD, fnv1a64, splitmix64

CONFIG = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 24,
    "block_out_channels": [32, 64, 64],
    "layers_per_block": 2,
    "spatial_downsample_factors": [2, 2, 1],
    "temporal_downsample_factors": [1, 2, 1],
    "norm_num_groups": 32,
    "norm_eps": 1e-06,
    "spatial_padding_mode": "reflect",
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 4,
    "decoder_attention_head_dim": 32,
    "decoder_num_register_tokens": 4,
    "decoder_ffn_mult": 4,
    "decoder_rope_theta": 100.0,
    "decoder_rope_dim_ratio": 0.75,
    "decoder_norm_eps": 1e-05,
    "clip_length": 9,
    "token_drop": 2,
}
TILING = {
    "tile_sample_min_height": 64,
    "tile_sample_min_width": 64,
    "tile_sample_min_overlap_height": 16,
    "tile_sample_min_overlap_width": 16,
}
SEED = 4321
KEYFRAME_HW = (96, 128)
CLIP_SHAPE = (3, 12, 64, 96)


def synthetic(name, shape, seed):
    """The C++ rule: see vortex::vae::synthetic_video_vae_encoder_tensors."""
    numel = int(np.prod(shape))
    key = (fnv1a64(name) + seed * 0x9E3779B97F4A7C15) & MASK
    with np.errstate(over="ignore"):
        h = splitmix64(np.uint64(key) + np.arange(numel, dtype=np.uint64))
    v = ((h >> np.uint64(40)).astype(np.float64) / 8388608.0 - 1.0).astype(np.float32)
    if name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
        out = np.float32(1.0) + np.float32(0.25) * v
    elif name.endswith(".weight"):
        out = v * np.float32(1.0 / np.sqrt(float(numel // shape[0])))
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
    config = dict(CONFIG)
    config["latents_mean"] = (torch.randn(24, generator=generator) * 0.5).tolist()
    config["latents_std"] = (torch.rand(24, generator=generator) + 0.5).tolist()
    model = AutoencoderKLMiniMaxH3(**config).eval()

    with torch.no_grad():
        filled = 0
        for name, param in model.state_dict().items():
            if not (name.startswith("encoder.") or name.startswith("quant_conv.")):
                continue
            model.state_dict()[name].copy_(synthetic(name, tuple(param.shape), SEED))
            filled += 1
    print(f"{filled} encoder tensors filled")
    model.enable_tiling(**TILING)

    records = {}
    prefix = ["keyframe"]

    def hook(name):
        def fn(_module, _inputs, output):
            key = f"{prefix[0]}.{name}"
            if key not in records:
                records[key] = output.detach()[0].clone()
        return fn

    model.encoder.conv_in.register_forward_hook(hook("encoder.conv_in"))
    for i, block in enumerate(model.encoder.down_blocks):
        block.register_forward_hook(hook(f"encoder.down_blocks.{i}"))
    model.encoder.conv_out.register_forward_hook(hook("encoder.conv_out"))
    model.quant_conv.register_forward_hook(hook("quant_conv"))

    height, width = KEYFRAME_HW
    rgb8 = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    pixels_u8 = rgb8.permute(2, 0, 1).reshape(1, 3, 1, height, width)
    with torch.no_grad():
        mean = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
        std = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
        pixels = (pixels_u8.to(torch.float32).div(255.0) - mean) / std
        moments = model.encode(pixels, return_dict=False)[0].parameters
        latent_shape = (1, 24) + tuple(moments.shape[2:])
        eps = torch.randn(latent_shape, generator=torch.Generator().manual_seed(42), dtype=torch.float32)
        condition = encode_vae_condition(model, pixels_u8, PIXEL_MEAN, PIXEL_STD, encode_seed=42)

        prefix[0] = "clip"
        clip = torch.randn(CLIP_SHAPE, generator=generator)
        clip_moments = model.encode(clip[None], return_dict=False)[0].parameters

    io = {
        "in.keyframe_rgb8": rgb8.contiguous(),
        "out.keyframe.pixels": pixels[0].contiguous(),
        "out.keyframe.moments": moments[0].contiguous(),
        "out.keyframe.eps": eps[0].contiguous(),
        "out.keyframe.condition": condition[0].contiguous(),
        "in.clip": clip.contiguous(),
        "out.clip.moments": clip_moments[0].contiguous(),
    }
    for name, value in records.items():
        if name.startswith("keyframe."):
            io[f"out.{name}"] = value.contiguous()
    folder = os.path.join(args.out, "video_vae_encoder_test")
    os.makedirs(folder, exist_ok=True)
    full_config = {"_class_name": "AutoencoderKLMiniMaxH3", **config}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(full_config, f, indent=2)
    metadata = {"config": json.dumps(full_config), "seed": str(SEED), "tiling": json.dumps(TILING)}
    path = os.path.join(folder, "io_fp32.safetensors")
    save_file(io, path, metadata=metadata)
    print(f"{path}: {os.path.getsize(path)} bytes, keyframe moments {tuple(moments.shape)}, "
          f"clip moments {tuple(clip_moments.shape)}")


if __name__ == "__main__":
    main()
