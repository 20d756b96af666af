#!/usr/bin/env python3
"""Writes tests/golden/soundtrack_resample.safetensors: reference soundtracks normalised by the reference pipeline's
own MiniMaxH3Ref2VASetupStep._normalize_audio_condition (diffusers + torchaudio, fp32, CPU, one thread):

    PYTHONPATH=.ref python3 tools/golden/make_soundtrack_resample_golden.py --out tests/golden

A soundtrack is truncated at its own rate to int(max_duration * rate) samples, a mono one repeated onto both
channels, then resampled once by torchaudio's default band-limited sinc (Hann window, 6 zero crossings, rolloff
0.99) onto the audio VAE's rate. Holds, for each case k of CASES:
  case.<k>.in [channels, samples]   random 0.5 * N(0, 1)
  case.<k>.out [2, resampled]       the normalised waveform
  case.<k>.rates I64 [3]            (source rate, target rate, max_duration in microseconds)
"""

import argparse
import os

import torch
from safetensors.torch import save_file

from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep

# (source rate, target rate, channels, samples, max_duration seconds): the usual file rates onto the release's
# 32 kHz, up and down, exact and awkward ratios, a truncation, and one target other than 32 kHz.
CASES = [
    (44100, 32000, 2, 3001, 10.0),
    (48000, 32000, 1, 2900, 0.05),
    (22050, 32000, 2, 1501, 10.0),
    (16000, 32000, 1, 999, 10.0),
    (8000, 32000, 2, 400, 10.0),
    (96000, 32000, 2, 4001, 10.0),
    (11025, 32000, 1, 777, 0.0371),
    (32000, 44100, 2, 1200, 10.0),
    (44100, 32000, 1, 5, 10.0),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1234)
    tensors = {}
    for k, (rate, target, channels, samples, max_duration) in enumerate(CASES):
        waveform = 0.5 * torch.randn(channels, samples, generator=generator)
        out = MiniMaxH3Ref2VASetupStep._normalize_audio_condition(waveform.clone(), rate, target, max_duration)
        tensors[f"case.{k}.in"] = waveform.contiguous()
        tensors[f"case.{k}.out"] = out.contiguous()
        tensors[f"case.{k}.rates"] = torch.tensor([rate, target, round(max_duration * 1e6)], dtype=torch.int64)
    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "soundtrack_resample.safetensors"))


if __name__ == "__main__":
    main()
