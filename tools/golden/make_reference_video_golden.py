#!/usr/bin/env python3
"""Writes tests/golden/reference_video.safetensors: how the reference pipeline puts a video reference on MiniMax-H3's
24 fps clock and which of its frames the conditioner reads (diffusers, numpy; CPU):

    PYTHONPATH=.ref python3 tools/golden/make_reference_video_golden.py --out tests/golden

Holds, from the pipeline's own static methods:
  clock.<k>.case    f64 [3]: the source frame rate, its frame count and the generated frame count
  clock.<k>.sources i64 [F]: per normalised frame, the source frame it shows
                    (MiniMaxH3Ref2VASetupStep._normalize_video_condition on frames that are already their own canvas,
                    768 x 768, each carrying its index in its first pixel, so the LANCZOS pass leaves them alone)
  sampling.<k>.frames  i64 [1]: a normalised video's frame count (24 fps)
  sampling.<k>.blocks  i64 [B, 2]: the frames of each vision block, the tail padded with the last one
  sampling.<k>.seconds f64 [B]: each block's timestamp
                    (MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames, 2 fps, temporal patch 2)
and in the metadata `presentation`: the text segments MiniMaxH3Ref2VATextEncoderStep._build_presentation emits for an
image, a silent video and a video with sound (sampling cases 0 and 1; a vision block's special tokens recorded by
name, its pad token once), and
`too_short`: its error for a 12-frame video.
"""

import argparse
import json
import os
from types import SimpleNamespace

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep

CLOCK = [(24.0, 130, 121), (30.0, 160, 121), (25.0, 130, 121), (24000 / 1001, 125, 121), (60.0, 300, 121),
         (12.0, 70, 121), (15.0, 40, 121), (30000 / 1001, 100, 189), (7.5, 20, 121), (50.0, 7, 121)]
SAMPLING = [121, 37, 13, 14, 24, 25, 189, 360]


def clock_sources(fps, count, num_frames):
    frames = np.zeros((count, 768, 768, 3), dtype=np.uint8)
    frames[:, 0, 0, 0] = np.arange(count) % 256
    frames[:, 0, 0, 1] = np.arange(count) // 256
    out = MiniMaxH3Ref2VASetupStep._normalize_video_condition(frames, fps, num_frames, 32, 768, 768 * 1344, 24.0)
    assert out.shape[1:] == (768, 768, 3)
    return out[:, 0, 0, 0].astype(np.int64) + 256 * out[:, 0, 0, 1].astype(np.int64)


class RecordingTokenizer:
    """Stands in for the conditioner's tokenizer: every text segment becomes one id, recorded in order."""

    def __init__(self):
        self.segments = []

    def __call__(self, value, add_special_tokens=False):
        self.segments.append(value)
        return {"input_ids": [len(self.segments)]}

    def convert_tokens_to_ids(self, token):
        self.segments.append(token)
        return -1


def presentation(sampled):
    tokenizer = RecordingTokenizer()
    references = [SimpleNamespace(kind="image", has_audio=False), SimpleNamespace(kind="video", has_audio=False),
                  SimpleNamespace(kind="video", has_audio=True)]
    _, seconds = zip(*sampled[:2])
    MiniMaxH3Ref2VATextEncoderStep._build_presentation(tokenizer, "A cat.", references, [6], [3, 3],
                                                               list(seconds))
    return tokenizer.segments


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tensors = {}
    for k, (fps, count, num_frames) in enumerate(CLOCK):
        tensors[f"clock.{k}.case"] = torch.tensor([fps, count, num_frames], dtype=torch.float64)
        tensors[f"clock.{k}.sources"] = torch.from_numpy(clock_sources(fps, count, num_frames))
    sampled = []
    for k, count in enumerate(SAMPLING):
        frames = np.arange(count).reshape(count, 1, 1, 1)
        picked, seconds = MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames(frames, 24.0, 2.0, 2)
        picked = [int(f.reshape(-1)[0]) for f in picked]
        padded = picked + [picked[-1]] * (-len(picked) % 2)
        tensors[f"sampling.{k}.frames"] = torch.tensor([count], dtype=torch.int64)
        tensors[f"sampling.{k}.blocks"] = torch.tensor(padded, dtype=torch.int64).reshape(-1, 2)
        tensors[f"sampling.{k}.seconds"] = torch.tensor(seconds, dtype=torch.float64)
        sampled.append((picked, seconds))
    try:
        MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames(np.zeros((12, 1, 1, 3)), 24.0, 2.0, 2)
        raise AssertionError("a 12-frame video was accepted")
    except ValueError as e:
        too_short = str(e)
    metadata = {"presentation": json.dumps(presentation(sampled)), "too_short": too_short}
    path = os.path.join(args.out, "reference_video.safetensors")
    save_file(tensors, path, metadata=metadata)
    print(json.dumps(metadata, indent=1))
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
