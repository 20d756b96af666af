#!/usr/bin/env python3
"""Writes the Qwen3-VL vision goldens under tests/golden/qwen3_vl_small/ with transformers.

Runs on the GPU machine (transformers, torchvision and PyTorch are installed there):

    python3 tools/golden/make_qwen3_vl_golden.py --out tests/golden/qwen3_vl_small

A small Qwen3VLForConditionalGeneration with random weights, in bf16 as the H3 pipeline runs it,
encodes a keyframe presentation the way diffusers' `get_qwen3vl_prompt_embeds` does for fl2va: two
RGB images through the image processor (`pixel_values`, `image_grid_thw`), a token list with a
label, `<|vision_start|>`, one `<|image_pad|>` per merged patch and `<|vision_end|>` per image and
then a prompt, image-pad token types, `output_hidden_states=True`. The label and prompt ids are
arbitrary in-vocabulary ids (the tokenizer is tested on its own). The folder gets
  config.json, model.safetensors     save_pretrained's output (Hugging Face layout and names)
  preprocessor_config.json           the image processor's
  io.safetensors                     `image.<i>` (uint8 [H, W, 3]), `pixel_values` (f32, the
                                     processor's), `image_grid_thw`, `input_ids`, `position_ids`
                                     (int64 [3, N], the multimodal RoPE positions),
                                     `vision.<i>.embedded` (the patch embedding plus the
                                     interpolated position embedding), `vision.<i>.block0`,
                                     `vision.<i>.last` (the last block's output),
                                     `vision.<i>.merged`, `vision.<i>.deepstack.<j>` (each image
                                     encoded alone) and `hidden_states.<l>` for every l, bf16,
                                     from the CPU run; the `stats` metadata holds the CUDA run's
                                     rel-L2 against it and the PIL-backend processor's largest
                                     pixel difference.
The images' sides are multiples of 32 (patch 16 · merge 2), as H3's keyframe canvas always is, so
the processor does not resize them; their patch grids (4 × 6 and 6 × 10) differ from the learned
8 × 8 position grid, so the position embeddings are interpolated both down and up.
"""

import argparse
import json
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402

TEXT_CONFIG = {
    "vocab_size": 320,
    "hidden_size": 128,
    "intermediate_size": 320,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [8, 8, 8],
                        "mrope_interleaved": True},
    "tie_word_embeddings": False,
}
# head_dim 16; deepstack after blocks 0 and 2, so decoder layers 0 and 1 get visual features.
VISION_CONFIG = {"depth": 3, "hidden_size": 64, "intermediate_size": 96, "num_heads": 4, "out_hidden_size": 128,
                 "deepstack_visual_indexes": [0, 2], "num_position_embeddings": 64, "patch_size": 16,
                 "spatial_merge_size": 2, "temporal_patch_size": 2}
TOKENS = {"image_token_id": 301, "vision_start_token_id": 302, "vision_end_token_id": 303, "video_token_id": 304}
IMAGE_SIZES = [(64, 96), (96, 160)]  # (height, width)
LABELS = [[11, 12, 13], [14, 15]]
PROMPT = [(37 * i + 11) % 300 for i in range(20)]


def randomize(model):
    g = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name) and p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "pos_embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (fan_in ** -0.5))


def images():
    g = np.random.default_rng(7)
    out = []
    for h, w in IMAGE_SIZES:
        # A smooth field plus noise: neighbouring patches differ, as in a picture.
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([128 + 90 * np.sin(xx / (7 + c) + yy / (11 + 2 * c) + c) for c in range(3)], axis=-1)
        out.append(np.clip(base + g.normal(0, 25, base.shape), 0, 255).astype(np.uint8))
    return out


def token_ids(grids, merge):
    ids = []
    for label, grid in zip(LABELS, grids):
        count = int(grid.prod()) // (merge * merge)
        ids += label + [TOKENS["vision_start_token_id"]] + [TOKENS["image_token_id"]] * count
        ids += [TOKENS["vision_end_token_id"]]
    return ids + PROMPT


def run(model, device, pixel_values, grid, ids):
    model = model.to(device)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    mm = (input_ids == TOKENS["image_token_id"]).long()
    pv = pixel_values.to(device, torch.bfloat16)
    g = grid.to(device)
    result = {}
    with torch.no_grad():
        out = model.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), mm_token_type_ids=mm,
                          pixel_values=pv, image_grid_thw=g, use_cache=False, output_hidden_states=True)
        for i, h in enumerate(out.hidden_states):
            result[f"hidden_states.{i}"] = h[0].to("cpu").contiguous()
        positions, _ = model.model.get_rope_index(input_ids, mm, image_grid_thw=g)
        result["position_ids"] = positions[:, 0].to("cpu").contiguous()

        visual = model.model.visual
        captured = {}
        hooks = [
            visual.blocks[0].register_forward_pre_hook(lambda m, a: captured.__setitem__("embedded", a[0])),
            visual.blocks[0].register_forward_hook(lambda m, a, o: captured.__setitem__("block0", o)),
        ]
        start = 0
        for i in range(grid.shape[0]):
            count = int(grid[i].prod())
            o = visual(pv[start:start + count], grid_thw=g[i:i + 1], return_dict=True)
            start += count
            result[f"vision.{i}.embedded"] = captured["embedded"].to("cpu").contiguous()
            result[f"vision.{i}.block0"] = captured["block0"].to("cpu").contiguous()
            result[f"vision.{i}.last"] = o.last_hidden_state.to("cpu").contiguous()
            result[f"vision.{i}.merged"] = o.pooler_output.to("cpu").contiguous()
            for j, d in enumerate(o.deepstack_features):
                result[f"vision.{i}.deepstack.{j}"] = d.to("cpu").contiguous()
        for h in hooks:
            h.remove()
    return result


def rel_l2(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    config = Qwen3VLConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG, **TOKENS)
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    # As the pipeline loads it: the RoPE inverse frequencies (non-persistent buffers) stay fp32.
    model = Qwen3VLForConditionalGeneration.from_pretrained(args.out, dtype=torch.bfloat16).eval()

    processor_args = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
                          image_std=[0.5, 0.5, 0.5], min_pixels=32 * 32, max_pixels=1024 * 1024)
    processor = Qwen2VLImageProcessor(**processor_args)
    processor.save_pretrained(args.out)
    arrays = images()
    features = processor(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")
    pixel_values, grid = features["pixel_values"], features["image_grid_thw"]
    pil = Qwen2VLImageProcessorPil(**processor_args)(images=[Image.fromarray(a) for a in arrays], return_tensors="pt")
    ids = token_ids(grid, VISION_CONFIG["spatial_merge_size"])

    cpu = run(model, "cpu", pixel_values, grid, ids)
    stats = {"transformers": transformers.__version__, "torch": torch.__version__,
             "pil_backend_max_pixel_diff": float((pil["pixel_values"] - pixel_values).abs().max())}
    if torch.cuda.is_available():
        cuda = run(model, "cuda", pixel_values, grid, ids)
        stats["cuda_vs_cpu_rel_l2"] = {k: rel_l2(cuda[k], v) for k, v in cpu.items() if v.is_floating_point()}
    tensors = dict(cpu)
    for i, a in enumerate(arrays):
        tensors[f"image.{i}"] = torch.from_numpy(a).contiguous()
    tensors["pixel_values"] = pixel_values.float().contiguous()
    tensors["image_grid_thw"] = grid.to(torch.int64).contiguous()
    tensors["input_ids"] = torch.tensor(ids, dtype=torch.int64)
    save_file(tensors, os.path.join(args.out, "io.safetensors"), metadata={"stats": json.dumps(stats)})
    print(json.dumps(stats, indent=1))
    print({k: tuple(v.shape) for k, v in tensors.items()})


if __name__ == "__main__":
    main()
