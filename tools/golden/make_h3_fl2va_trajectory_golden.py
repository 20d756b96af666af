#!/usr/bin/env python3
"""Writes tests/golden/h3_small/trajectory_fl2va.safetensors: a 4-point (3-evaluation) keyframe (fl2va) denoise of
the h3_small transformer, with the reference pipeline's own layout, row-timestep plan, conditioning noise and
scheduler steps (fp32, CPU):

    PYTHONPATH=.ref python3 tools/golden/make_h3_fl2va_trajectory_golden.py --golden tests/golden

The request: 12 text rows whose rows 3..8 are a keyframe's picture tokens (tagged video), 22 frames (7 latent
frames) on a 128 x 192 canvas (8 x 12 latents, 24 rows per frame), 37 audio latents, two keyframes anchored first and
last. The keyframes' normalised latents are random (the encoder has its own golden); each is noised once to
t = 0.999 with its own draw (MiniMaxH3PrepareConditionLatentsStep's scale_noise), patchified and put before the
generated rows (MiniMaxH3FL2VAPrepareLatentsStep); the loop steps only the generated rows
(MiniMaxH3LoopSchedulerStep).

Holds in.text_tags (I64), in.encoder_hidden_states [12, text_dim], in.keyframe.<k> [24, 1, 8, 12] and
in.keyframe_noise.<k> (k = 0 first, 1 last), in.video_noise [168, 96] (generated rows), in.audio_noise [74, 32],
out.condition_rows [48, 96], step_<i>.timestep, step_<i>.video_velocity, out.video_latents [216, 96] (conditioning
rows first, unchanged) and out.audio_latents; metadata `steps`.
"""

import argparse
import json
import os

import torch
from safetensors.torch import load_file, save_file

from diffusers import MiniMaxH3Transformer3DModel
from diffusers.schedulers import MiniMaxH3Scheduler
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)

STEPS = 4
KEYFRAME_NOISE_AUG = 0.999
TEXT, VISION = 12, (3, 9)
FRAMES, HEIGHT, WIDTH, AUDIO = 7, 8, 12, 37


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--golden", default="tests/golden")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    folder = os.path.join(args.golden, "h3_small")
    with open(os.path.join(folder, "config.json")) as f:
        config = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    model = MiniMaxH3Transformer3DModel(**config)
    model.load_state_dict(load_file(os.path.join(folder, "diffusers.safetensors")))
    model.eval()

    tags = torch.ones(TEXT, dtype=torch.long)
    tags[VISION[0] : VISION[1]] = 0
    positions, token_tags, video_indices, audio_indices, text_indices, num_condition, _ = (
        MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            tags, FRAMES, HEIGHT, WIDTH, AUDIO, (1, 2, 2), audio_channels=2, audio_tag=2, video_tag=0,
            keyframe_anchors=("first", "last"),
        )
    )
    g = torch.Generator().manual_seed(17)
    text = torch.randn(TEXT, config["text_dim"], generator=g)
    scheduler = MiniMaxH3Scheduler(shift=12.0)
    record = {"in.text_tags": tags, "in.encoder_hidden_states": text.clone()}
    packed = []
    for k in range(2):
        keyframe = torch.randn(1, config["in_channels"], 1, HEIGHT, WIDTH, generator=g)
        noise = torch.randn(keyframe.shape, generator=g)
        record[f"in.keyframe.{k}"] = keyframe[0].clone()
        record[f"in.keyframe_noise.{k}"] = noise[0].clone()
        packed.append(patchify_video_latents(scheduler.scale_noise(keyframe, KEYFRAME_NOISE_AUG, noise), (1, 2, 2)))
    condition_rows = torch.cat(packed)
    assert condition_rows.shape[0] == num_condition
    record["out.condition_rows"] = condition_rows.clone()
    n_generated = video_indices.numel() - num_condition
    latents = torch.randn(n_generated, config["in_channels"] * 4, generator=g)
    audio = torch.randn(audio_indices.numel(), config["audio_in_channels"], generator=g)
    record["in.video_noise"] = latents.clone()
    record["in.audio_noise"] = audio.clone()
    video_rows = torch.cat([condition_rows, latents])

    video_sched, audio_sched = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video_sched.set_timesteps(STEPS)
    audio_sched.set_timesteps(STEPS)
    for i, (t, ta) in enumerate(zip(video_sched.timesteps, audio_sched.timesteps)):
        timestep, t_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_indices, audio_indices, num_condition, 0, text_indices.numel(), float(t), float(ta),
            max(float(t), KEYFRAME_NOISE_AUG), 1.0)
        inputs = {
            "hidden_states": video_rows[None],
            "audio_hidden_states": audio[None],
            "encoder_hidden_states": text[None],
            "timestep": timestep,
            "timestep_indices": t_idx,
            "token_tags": token_tags,
            "position_ids": positions,
            "video_indices": video_indices,
            "audio_indices": audio_indices,
            "text_indices": text_indices,
        }
        with torch.no_grad():
            v, a = model(**inputs, return_dict=False)
        record[f"step_{i}.timestep"] = timestep.clone()
        record[f"step_{i}.video_velocity"] = v[0].clone()
        generated = video_sched.step(v[0, num_condition:].float(), t, video_rows[num_condition:], return_dict=False)[0]
        video_rows = torch.cat([video_rows[:num_condition], generated])
        audio = audio_sched.step(a[0].float(), ta, audio, return_dict=False)[0]
    record["out.video_latents"] = video_rows
    record["out.audio_latents"] = audio
    path = os.path.join(folder, "trajectory_fl2va.safetensors")
    save_file({k: v.contiguous() for k, v in record.items()}, path, metadata={"steps": str(STEPS)})
    print(f"{path}: {os.path.getsize(path)} bytes, {video_rows.shape[0]} video rows ({num_condition} conditioning)")


if __name__ == "__main__":
    main()
