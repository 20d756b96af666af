#!/usr/bin/env python3
"""Writes tests/golden/h3_small/trajectory_ref2va.safetensors: a 4-point (3-evaluation) reference (ref2va) denoise of
the h3_small transformer, with the reference pipeline's own layout, row-timestep plan, conditioning noise and
scheduler steps (fp32, CPU):

    PYTHONPATH=.ref python3 tools/golden/make_h3_ref2va_trajectory_golden.py --golden tests/golden

The request: 14 text rows whose rows 2..9 are the image references' vision tokens (tagged video), 22 frames (7 latent
frames) on a 128 x 192 canvas (8 x 12 latents), 37 audio latents, and four references in this order: an image of
4 x 10 latents, an audio reference of 9 latents, a video of 2 latent frames of 6 x 4 latents with a 5-latent
soundtrack, an image of 6 x 6. h3_small's transformer stands in for the transformer_ref partition (the same
architecture). The references' normalised latents and soundtrack rows are random (their encoders have their own
goldens); each video latent tensor is noised once to t = 0.999 with its own draw, in packed order
(MiniMaxH3PrepareConditionLatentsStep), the soundtracks ride clean at t = 1 (MiniMaxH3Ref2VAPrepareLatentsStep), and
the loop steps only the generated rows (MiniMaxH3LoopSchedulerStep).

Holds in.text_tags (I64), in.encoder_hidden_states [14, text_dim], in.reference.<k> (the video latents [C, F, h, w]
of the k-th image or video reference) and in.reference_noise.<k>, in.reference_audio.<j> (the j-th soundtrack's rows
[2 A, 32]), in.video_noise (generated rows), in.audio_noise (generated rows), out.condition_rows,
step_<i>.timestep, step_<i>.video_velocity, step_<i>.audio_velocity, out.video_latents and out.audio_latents (the
reference rows first, unchanged); metadata `steps`.
"""

import argparse
import json
import os
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

from diffusers import MiniMaxH3Transformer3DModel
from diffusers.schedulers import MiniMaxH3Scheduler
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3Ref2VAPrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)

STEPS = 4
KEYFRAME_NOISE_AUG = 0.999
TEXT, VISION = 14, (2, 10)
FRAMES, HEIGHT, WIDTH, AUDIO = 7, 8, 12, 37
# (kind, latent frames, latent height, latent width, soundtrack latents per channel)
REFERENCES = [("image", 1, 4, 10, 0), ("audio", 0, 0, 0, 9), ("video", 2, 6, 4, 5), ("image", 1, 6, 6, 0)]


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

    g = torch.Generator().manual_seed(23)
    tags = torch.ones(TEXT, dtype=torch.long)
    tags[VISION[0] : VISION[1]] = 0
    text = torch.randn(TEXT, config["text_dim"], generator=g)
    record = {"in.text_tags": tags, "in.encoder_hidden_states": text.clone()}
    references, condition, soundtracks = [], [], []
    for kind, frames, height, width, audio in REFERENCES:
        references.append(SimpleNamespace(kind=kind, has_audio=audio > 0))
        if audio > 0:
            rows = torch.randn(2 * audio, config["audio_in_channels"], generator=g)
            record[f"in.reference_audio.{len(soundtracks)}"] = rows.clone()
            soundtracks.append(rows)
        if kind != "audio":
            latents = torch.randn(1, config["in_channels"], frames, height, width, generator=g)
            record[f"in.reference.{len(condition)}"] = latents[0].clone()
            condition.append(latents)
    positions, token_tags, video_indices, audio_indices, text_indices, num_video, num_audio = (
        MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
            tags, references, condition, soundtracks, FRAMES, HEIGHT, WIDTH, AUDIO, (1, 2, 2),
            audio_channels=2, audio_tag=2, video_tag=0,
        )
    )
    scheduler = MiniMaxH3Scheduler(shift=12.0)
    packed = []
    for k, latents in enumerate(condition):
        noise = torch.randn(latents.shape, generator=g)
        record[f"in.reference_noise.{k}"] = noise[0].clone()
        packed.append(patchify_video_latents(scheduler.scale_noise(latents, KEYFRAME_NOISE_AUG, noise), (1, 2, 2)))
    condition_rows = torch.cat(packed)
    assert condition_rows.shape[0] == num_video
    record["out.condition_rows"] = condition_rows.clone()
    latents = torch.randn(video_indices.numel() - num_video, config["in_channels"] * 4, generator=g)
    audio = torch.randn(audio_indices.numel() - num_audio, config["audio_in_channels"], generator=g)
    record["in.video_noise"] = latents.clone()
    record["in.audio_noise"] = audio.clone()
    video_rows = torch.cat([condition_rows, latents])
    audio_rows = torch.cat(soundtracks + [audio])

    video_sched, audio_sched = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video_sched.set_timesteps(STEPS)
    audio_sched.set_timesteps(STEPS)
    for i, (t, ta) in enumerate(zip(video_sched.timesteps, audio_sched.timesteps)):
        timestep, t_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_indices, audio_indices, num_video, num_audio, text_indices.numel(), float(t), float(ta),
            max(float(t), KEYFRAME_NOISE_AUG), 1.0)
        inputs = {
            "hidden_states": video_rows[None],
            "audio_hidden_states": audio_rows[None],
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
        record[f"step_{i}.audio_velocity"] = a[0].clone()
        generated = video_sched.step(v[0, num_video:].float(), t, video_rows[num_video:], return_dict=False)[0]
        video_rows = torch.cat([video_rows[:num_video], generated])
        generated = audio_sched.step(a[0, num_audio:].float(), ta, audio_rows[num_audio:], return_dict=False)[0]
        audio_rows = torch.cat([audio_rows[:num_audio], generated])
    record["out.video_latents"] = video_rows
    record["out.audio_latents"] = audio_rows
    path = os.path.join(folder, "trajectory_ref2va.safetensors")
    save_file({k: v.contiguous() for k, v in record.items()}, path, metadata={"steps": str(STEPS)})
    print(f"{path}: {os.path.getsize(path)} bytes, {video_rows.shape[0]} video rows ({num_video} references), "
          f"{audio_rows.shape[0]} audio rows ({num_audio} references)")


if __name__ == "__main__":
    main()
