#!/usr/bin/env python3
"""Writes tests/golden/audio_vae_<name>/encode.safetensors: the audio VAE encoder of the reference implementation on
the committed random weights of tests/golden/audio_vae_tiny and audio_vae_small, as ref2va encodes a reference
soundtrack (fp32, CPU, one thread):

    PYTHONPATH=.ref python3 tools/golden/make_audio_vae_encoder_golden.py --golden tests/golden

The stereo waveform goes through the pipeline's own MiniMaxH3Ref2VAReferenceEncoderStep (an audio reference at the
VAE's sample rate): each channel a batch item of the mono encoder, right-padded to a multiple of the hop, the
posterior mean taken, normalised by latents_mean / latents_std and packed channel-major. Holds
  in.waveform [2, samples]            random, 0.5 * N(0, 1), samples = 7 hops - 3 (the padding is exercised)
  out.encoder.block.<i> [2, C, T]     every stage of the DAC encoder (first conv, blocks, snake, last conv)
  out.pre_block [2, T, latent]        the causal-attention projection's output (time-major, as it runs)
  out.mean [2, latent, T]             mean_proj's output (the posterior mean)
  out.rows [2 T, latent]              the normalised channel-major rows the transformer reads
"""

import argparse
import json
import os
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

from diffusers import AutoencoderKLMiniMaxH3Audio
from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VAReferenceEncoderStep
from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference
from diffusers.modular_pipelines.modular_pipeline import PipelineState


def encode_folder(folder):
    with open(os.path.join(folder, "config.json")) as f:
        config = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    model = AutoencoderKLMiniMaxH3Audio(**config)
    model.load_state_dict(load_file(os.path.join(folder, "diffusers.safetensors")))
    model.eval()
    generator = torch.Generator().manual_seed(41)
    waveform = 0.5 * torch.randn(2, 7 * model.hop_length - 3, generator=generator)

    records = {}
    hooks = []
    for i, module in enumerate(model.encoder.block):
        hooks.append(module.register_forward_hook(
            lambda _m, _i, out, i=i: records.__setitem__(f"out.encoder.block.{i}", out.detach().clone())))
    hooks.append(model.pre_block.register_forward_hook(
        lambda _m, _i, out: records.__setitem__("out.pre_block", out.detach().clone())))
    hooks.append(model.mean_proj.register_forward_hook(
        lambda _m, _i, out: records.__setitem__("out.mean", out.detach().clone())))

    components = SimpleNamespace(
        audio_vae=model, vae=None, _execution_device=torch.device("cpu"), audio_latent_channels=config["latent_channels"],
        pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225), keyframe_encode_seed=42,
    )
    state = PipelineState()
    state.set("normalized_references", [MiniMaxH3AudioReference(audio=waveform.clone(), sample_rate=config["sampling_rate"])])
    with torch.no_grad():
        MiniMaxH3Ref2VAReferenceEncoderStep()(components, state)
    for hook in hooks:
        hook.remove()
    records["in.waveform"] = waveform
    records["out.rows"] = state.get("audio_condition_latents")[0]
    path = os.path.join(folder, "encode.safetensors")
    save_file({k: v.contiguous() for k, v in records.items()}, path)
    print(f"{path}: {os.path.getsize(path)} bytes, rows {tuple(records['out.rows'].shape)}, "
          f"{sum(k.startswith('out.encoder.block') for k in records)} encoder stages")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--golden", default="tests/golden")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for name in ("audio_vae_tiny", "audio_vae_small"):
        encode_folder(os.path.join(args.golden, name))


if __name__ == "__main__":
    main()
