#!/usr/bin/env python3
"""Writes tests/golden/qwen3_vl_small/video.safetensors and video_preprocessor_config.json with transformers.

Runs on the GPU machine after make_qwen3_vl_golden.py made the folder (it loads that model):

    python3 tools/golden/make_qwen3_vl_video_golden.py --out tests/golden/qwen3_vl_small

A ref2va presentation with a picture and two video references, encoded the way diffusers'
MiniMaxH3Ref2VATextEncoderStep does: each video's frames sampled by the pipeline's own
_sample_video_condition_frames (2 fps of 24), the sampled frames through Qwen3VLVideoProcessor
(do_sample_frames=False), one vision block per merged frame pair after its timestamp label; the
conditioner called once with pixel_values, pixel_values_videos and both grids. Label and prompt ids
are arbitrary in-vocabulary ids (the presentation's text is tested on its own). Holds
  image.0 / video.<v> (uint8 [frames, H, W, 3], the sampled frames), pixel_values_videos (f32),
  video_grid_thw, input_ids, position_ids (int64 [3, N]), video.<v>.merged and
  video.<v>.deepstack.<j> (the tower on each video, its blocks batched as the reference runs them)
  and hidden_states.<l> for every l, bf16, from the CPU run; the `stats` metadata holds the CUDA
  run's rel-L2 against it.
Video 0 has 37 frames (4 sampled, two blocks); video 1 has 25 (3 sampled, the last repeated).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Qwen3VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor  # noqa: E402

from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VATextEncoderStep  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_qwen3_vl_golden import TOKENS, images, rel_l2  # noqa: E402

VIDEO_FRAMES = [37, 25]
HEIGHT, WIDTH = 64, 96
PICTURE_LABEL = [11, 12, 13]
VIDEO_LABELS = [[21, 22], [23]]
PROMPT = [(41 * i + 7) % 300 for i in range(12)]


def video(count, seed):
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    frames = []
    for f in range(count):  # a moving smooth field plus noise: neighbouring frames differ
        base = np.stack([128 + 90 * np.sin((xx + 3 * f) / (7 + c) + yy / (11 + 2 * c) + c) for c in range(3)], -1)
        frames.append(np.clip(base + g.normal(0, 20, base.shape), 0, 255).astype(np.uint8))
    return np.stack(frames)


def token_ids(image_tokens, video_blocks, merge):
    ids = PICTURE_LABEL + [TOKENS["vision_start_token_id"]] + [TOKENS["image_token_id"]] * image_tokens
    ids += [TOKENS["vision_end_token_id"]]
    for label, (grid, seconds) in zip(VIDEO_LABELS, video_blocks):
        ids += label
        for b, _ in enumerate(seconds):
            ids += [31 + b]  # the timestamp label
            ids += [TOKENS["vision_start_token_id"]] + [TOKENS["video_token_id"]] * (grid[1] * grid[2] // merge**2)
            ids += [TOKENS["vision_end_token_id"]]
    return ids + PROMPT


def run(model, device, inputs, ids):
    model = model.to(device)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    mm = (input_ids == TOKENS["image_token_id"]).long() + 2 * (input_ids == TOKENS["video_token_id"]).long()
    pv = inputs["pixel_values"].to(device, torch.bfloat16)
    pvv = inputs["pixel_values_videos"].to(device, torch.bfloat16)
    g, vg = inputs["image_grid_thw"].to(device), inputs["video_grid_thw"].to(device)
    result = {}
    with torch.no_grad():
        out = model.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), mm_token_type_ids=mm,
                          pixel_values=pv, image_grid_thw=g, pixel_values_videos=pvv, video_grid_thw=vg,
                          use_cache=False, output_hidden_states=True)
        for i, h in enumerate(out.hidden_states):
            result[f"hidden_states.{i}"] = h[0].to("cpu").contiguous()
        positions, _ = model.model.get_rope_index(input_ids, mm, image_grid_thw=g, video_grid_thw=vg)
        result["position_ids"] = positions[:, 0].to("cpu").contiguous()
        start = 0
        for v in range(vg.shape[0]):
            count = int(vg[v].prod())
            o = model.model.visual(pvv[start:start + count], grid_thw=vg[v:v + 1], return_dict=True)
            start += count
            result[f"video.{v}.merged"] = o.pooler_output.to("cpu").contiguous()
            for j, d in enumerate(o.deepstack_features):
                result[f"video.{v}.deepstack.{j}"] = d.to("cpu").contiguous()
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model = Qwen3VLForConditionalGeneration.from_pretrained(args.out, dtype=torch.bfloat16).eval()
    merge = model.config.vision_config.spatial_merge_size
    video_processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2,
                                            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                            size={"shortest_edge": 32 * 32, "longest_edge": 4096 * 32 * 32})
    video_processor.save_pretrained(args.out)
    image_processor = Qwen2VLImageProcessor.from_pretrained(args.out)

    picture = images()[0]
    sampled = [MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames(video(n, 11 + n), 24.0, 2.0, 2)
               for n in VIDEO_FRAMES]
    image_inputs = image_processor(images=[picture], return_tensors="pt")
    video_inputs = video_processor(videos=[np.stack(frames) for frames, _ in sampled], do_sample_frames=False,
                                   return_tensors="pt")
    inputs = {**image_inputs, **video_inputs}
    image_tokens = int(image_inputs["image_grid_thw"][0].prod()) // merge**2
    blocks = [(inputs["video_grid_thw"][v].tolist(), seconds) for v, (_, seconds) in enumerate(sampled)]
    for grid, seconds in blocks:
        assert grid[0] == len(seconds), (grid, seconds)
    ids = token_ids(image_tokens, blocks, merge)

    cpu = run(model, "cpu", inputs, ids)
    stats = {"transformers": transformers.__version__, "torch": torch.__version__,
             "seconds": [seconds for _, seconds in sampled]}
    if torch.cuda.is_available():
        cuda = run(model, "cuda", inputs, ids)
        stats["cuda_vs_cpu_rel_l2"] = {k: rel_l2(cuda[k], v) for k, v in cpu.items() if v.is_floating_point()}
    tensors = dict(cpu)
    tensors["image.0"] = torch.from_numpy(picture).contiguous()
    for v, (frames, _) in enumerate(sampled):
        tensors[f"video.{v}"] = torch.from_numpy(np.stack(frames)).contiguous()
    tensors["pixel_values_videos"] = inputs["pixel_values_videos"].float().contiguous()
    tensors["video_grid_thw"] = inputs["video_grid_thw"].to(torch.int64).contiguous()
    tensors["input_ids"] = torch.tensor(ids, dtype=torch.int64)
    save_file(tensors, os.path.join(args.out, "video.safetensors"), metadata={"stats": json.dumps(stats)})
    print(json.dumps(stats, indent=1))
    print({k: tuple(v.shape) for k, v in tensors.items()})


if __name__ == "__main__":
    main()
