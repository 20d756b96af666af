#!/usr/bin/env python3
"""Writes the Qwen3-VL text encoder goldens under tests/golden/qwen3_text_small/ with transformers.

Runs on the GPU machine (transformers and PyTorch are installed there):

    python3 tools/golden/make_qwen3_text_golden.py --out tests/golden/qwen3_text_small

A small Qwen3VLForConditionalGeneration with random weights, cast to bf16 as the H3 pipeline runs
it, encodes a fixed list of token ids the way diffusers' `get_qwen3vl_prompt_embeds` does for a
text-only presentation (the language model alone, all-ones attention mask, text token types,
`output_hidden_states=True`). The folder gets
  config.json, model.safetensors   save_pretrained's output: the Hugging Face layout and names
  io.safetensors                   `input_ids` (int64) and `hidden_states.<i>` (bf16) for every
                                   i in 0..layers, from the CPU run; the `stats` metadata holds
                                   the CUDA run's rel-L2 against it at each i
The encoder is asked for hidden_states[LAYER] of a model with more layers than that, as H3 asks
for layer 50 of a 64-layer model: the last entries are past the layer H3 reads and the final norm.
"""

import argparse
import json
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402

LAYER = 4
# head_dim 48 is not hidden / heads (32), as in the released model (5120 / 64 = 80 != 128); two
# query heads per key/value head; mrope sections sum to head_dim / 2.
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
VISION_CONFIG = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 128,
                 "deepstack_visual_indexes": [], "num_position_embeddings": 16, "patch_size": 16}
# 45 ids: the vocabulary's ends, a repeated run and a spread.
INPUT_IDS = [0, 319, 17, 17, 17, 42, 255, 1, 300, 128] + [(37 * i + 11) % 320 for i in range(35)]


def randomize(model):
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5))


def hidden_states(model, device):
    model = model.to(device)
    ids = torch.tensor([INPUT_IDS], dtype=torch.long, device=device)
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, output_hidden_states=True)
    with torch.no_grad():
        try:
            out = model.model(mm_token_type_ids=torch.zeros_like(ids), **kwargs)
        except TypeError:  # a transformers without multimodal token types
            out = model.model(**kwargs)
    return [h[0].to("cpu") for h in out.hidden_states]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    config = Qwen3VLConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG)
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    # Run the model as the pipeline loads it. from_pretrained in bf16 keeps the RoPE inverse
    # frequencies (a non-persistent buffer) in fp32; the cast above rounds them to bf16 as well,
    # which moves every position past the first few by a bf16 ulp of the angle.
    model = Qwen3VLForConditionalGeneration.from_pretrained(args.out, dtype=torch.bfloat16).eval()
    assert model.model.language_model.rotary_emb.inv_freq.dtype == torch.float32

    cpu = hidden_states(model, "cpu")
    stats = {"transformers": transformers.__version__, "torch": torch.__version__, "layer": LAYER}
    if torch.cuda.is_available():
        cuda = hidden_states(model, "cuda")
        stats["cuda_vs_cpu_rel_l2"] = [
            float((c.float() - g.float()).norm() / g.float().norm().clamp_min(1e-30)) for c, g in zip(cuda, cpu)
        ]
    tensors = {"input_ids": torch.tensor(INPUT_IDS, dtype=torch.int64)}
    for i, h in enumerate(cpu):
        tensors[f"hidden_states.{i}"] = h.contiguous()
    save_file(tensors, os.path.join(args.out, "io.safetensors"), metadata={"stats": json.dumps(stats)})
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
