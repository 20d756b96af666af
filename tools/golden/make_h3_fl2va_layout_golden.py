#!/usr/bin/env python3
"""Writes tests/golden/layout_fl2va.safetensors: the reference pipeline's keyframe (fl2va) packed layouts and
row-timestep plans, made by diffusers' own MiniMaxH3PrepareLayoutStep.build_packed_sequence and
MiniMaxH3SetTimestepsStep.build_row_timesteps (CPU, no model):

    PYTHONPATH=.ref python3 tools/golden/make_h3_fl2va_layout_golden.py --out tests/golden

Cases (`<case>.` prefixes), each `[text | keyframe rows | audio | video]`:
  first       12 text rows (rows 3..8 tagged video, as a keyframe's vision block is), 7 latent frames of 6 x 8
              latents, 12 audio latents, anchors ("first",)
  last        the same geometry, anchors ("last",)
  first_last  100 text rows, 37 latent frames (124 pixel frames) of 8 x 12 latents, 207 audio latents, anchors
              ("first", "last"): the last anchor's time is numpy's pairwise sum over 37 frame spans
Each holds position_ids [rows, 3] (F64), token_tags (I64), video_indices / audio_indices (I64), num_condition (I64
[1]), and for the plans `plan<k>.timesteps` (F32) / `plan<k>.inverse` (I64) at (video, audio) timesteps
PLANS[k], the conditioning rows at max(video, 0.999) as the pipeline passes them.
"""

import argparse
import os

import torch
from safetensors.torch import save_file

from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
)

KEYFRAME_NOISE_AUG = 0.999
PLANS = [(0.25, 0.5), (0.9995, 0.75), (0.5, 0.5)]
CASES = {
    "first": dict(text=12, vision=(3, 9), frames=7, height=6, width=8, audio=12, anchors=("first",)),
    "last": dict(text=12, vision=(3, 9), frames=7, height=6, width=8, audio=12, anchors=("last",)),
    "first_last": dict(text=100, vision=(0, 0), frames=37, height=8, width=12, audio=207, anchors=("first", "last")),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tensors = {}
    for name, case in CASES.items():
        tags = torch.ones(case["text"], dtype=torch.long)
        tags[case["vision"][0] : case["vision"][1]] = 0
        positions, token_tags, video_indices, audio_indices, text_indices, num_condition, _ = (
            MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                tags,
                case["frames"],
                case["height"],
                case["width"],
                case["audio"],
                (1, 2, 2),
                audio_channels=2,
                audio_tag=2,
                video_tag=0,
                keyframe_anchors=case["anchors"],
            )
        )
        tensors[f"{name}.position_ids"] = positions.contiguous()
        tensors[f"{name}.token_tags"] = token_tags.contiguous()
        tensors[f"{name}.video_indices"] = video_indices.contiguous()
        tensors[f"{name}.audio_indices"] = audio_indices.contiguous()
        tensors[f"{name}.num_condition"] = torch.tensor([num_condition], dtype=torch.long)
        for k, (video_t, audio_t) in enumerate(PLANS):
            video_t32 = float(torch.tensor(video_t, dtype=torch.float32))
            audio_t32 = float(torch.tensor(audio_t, dtype=torch.float32))
            timesteps, inverse = MiniMaxH3SetTimestepsStep.build_row_timesteps(
                video_indices,
                audio_indices,
                num_condition,
                0,
                text_indices.numel(),
                video_t32,
                audio_t32,
                max(video_t32, KEYFRAME_NOISE_AUG),
                1.0,
            )
            tensors[f"{name}.plan{k}.timesteps"] = timesteps.contiguous()
            tensors[f"{name}.plan{k}.inverse"] = inverse.to(torch.long).contiguous()
        print(f"{name}: {positions.shape[0]} rows, {num_condition} conditioning rows")
    path = os.path.join(args.out, "layout_fl2va.safetensors")
    save_file(tensors, path, metadata={"plans": repr(PLANS), "keyframe_noise_aug": str(KEYFRAME_NOISE_AUG)})
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
