#!/usr/bin/env python3
"""Writes tests/golden/layout_ref2va.safetensors: the reference pipeline's ref2va packed layouts and row-timestep
plans, made by diffusers' own MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence and
MiniMaxH3SetTimestepsStep.build_row_timesteps (CPU, no model):

    PYTHONPATH=.ref python3 tools/golden/make_h3_ref2va_layout_golden.py --out tests/golden

Cases (`<case>.` prefixes), each `[text | reference blocks | target audio | target video]`; a reference is
(kind, latent frames, latent height, latent width, soundtrack latents per channel):
  images  10 text rows (rows 2..5 tagged video), two images of their own sizes; 7 target frames of 6 x 8, 12 audio
  mixed   24 text rows (rows 3..10 tagged video): an image, an audio reference, a video with a soundtrack longer than
          its frames' span, a silent 22-frame video (its span is Python's sum(), compensated from Python 3.12 on,
          which a plain loop misses in the last bit), a video whose frames outlast its soundtrack, an image; 12
          target frames of 8 x 12, 20 audio
Made with Python 3.12 (the GPU machine's): the clock past a video reference depends on the Python version.
Each holds position_ids [rows, 3] (F64), token_tags (I64), video_indices / audio_indices (I64), num_condition and
num_condition_audio (I64 [1]), and for the plans `plan<k>.timesteps` (F32) / `plan<k>.inverse` (I64) at (video,
audio) timesteps PLANS[k], the conditioning video rows at max(video, 0.999) and the soundtracks at 1.0, as the
pipeline passes them. The cases are also in the `cases` metadata key (JSON).
"""

import argparse
import json
import os
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3Ref2VAPrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
)

KEYFRAME_NOISE_AUG = 0.999
PLANS = [(0.25, 0.5), (0.9995, 0.75), (0.5, 0.5)]
CASES = {
    "images": dict(
        text=10, vision=(2, 6), frames=7, height=6, width=8, audio=12,
        references=[("image", 1, 4, 10, 0), ("image", 1, 8, 6, 0)],
    ),
    "mixed": dict(
        text=24, vision=(3, 11), frames=12, height=8, width=12, audio=20,
        references=[
            ("image", 1, 6, 4, 0),
            ("audio", 0, 0, 0, 9),
            ("video", 2, 4, 6, 30),
            ("video", 22, 2, 4, 0),
            ("video", 7, 6, 6, 3),
            ("image", 1, 10, 8, 0),
        ],
    ),
}
LATENT_CHANNELS, AUDIO_CHANNELS = 4, 3  # the layout reads shapes only


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tensors = {}
    for name, case in CASES.items():
        tags = torch.ones(case["text"], dtype=torch.long)
        tags[case["vision"][0] : case["vision"][1]] = 0
        references, condition, audio_condition = [], [], []
        for kind, frames, height, width, audio in case["references"]:
            references.append(SimpleNamespace(kind=kind, has_audio=audio > 0))
            if kind != "audio":
                condition.append(torch.zeros(1, LATENT_CHANNELS, frames, height, width))
            if audio > 0:
                audio_condition.append(torch.zeros(2 * audio, AUDIO_CHANNELS))
        positions, token_tags, video_indices, audio_indices, text_indices, num_video, num_audio = (
            MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
                tags, references, condition, audio_condition, case["frames"], case["height"], case["width"],
                case["audio"], (1, 2, 2), audio_channels=2, audio_tag=2, video_tag=0,
            )
        )
        tensors[f"{name}.position_ids"] = positions.contiguous()
        tensors[f"{name}.token_tags"] = token_tags.contiguous()
        tensors[f"{name}.video_indices"] = video_indices.contiguous()
        tensors[f"{name}.audio_indices"] = audio_indices.contiguous()
        tensors[f"{name}.num_condition"] = torch.tensor([num_video], dtype=torch.long)
        tensors[f"{name}.num_condition_audio"] = torch.tensor([num_audio], dtype=torch.long)
        for k, (video_t, audio_t) in enumerate(PLANS):
            video_t32 = float(torch.tensor(video_t, dtype=torch.float32))
            audio_t32 = float(torch.tensor(audio_t, dtype=torch.float32))
            timesteps, inverse = MiniMaxH3SetTimestepsStep.build_row_timesteps(
                video_indices, audio_indices, num_video, num_audio, text_indices.numel(), video_t32, audio_t32,
                max(video_t32, KEYFRAME_NOISE_AUG), 1.0,
            )
            tensors[f"{name}.plan{k}.timesteps"] = timesteps.contiguous()
            tensors[f"{name}.plan{k}.inverse"] = inverse.to(torch.long).contiguous()
        print(f"{name}: {positions.shape[0]} rows, {num_video} reference video rows, {num_audio} reference audio rows")
    path = os.path.join(args.out, "layout_ref2va.safetensors")
    metadata = {
        "plans": json.dumps(PLANS),
        "cases": json.dumps({name: case for name, case in CASES.items()}),
    }
    save_file(tensors, path, metadata=metadata)
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
