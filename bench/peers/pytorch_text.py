#!/usr/bin/env python3
"""PyTorch peer of `vortex bench text-encode` and `vision-encode`, run by it in the same device call.

    python3 bench/peers/pytorch_text.py --workload text-encode|vision-encode --io DUMP --out REPORT [--warmup 3 --reps 10]

transformers' Qwen3-VL text model (the language model of Qwen3VLForConditionalGeneration, what
the H3 pipeline runs for a text-only prompt) built from the dump's checkpoint folder (vortex's
synthetic bf16 weights at the released widths, its config.json) in bf16 on the GPU with SDPA
attention, run on the dump's token ids with an all-ones mask. The states after the last decoder
layer, before the final norm (the pipeline reads that layer's hidden state), are taken by a
forward hook and compared with vortex's. Timed: the model's forward on the device-resident ids.

vision-encode: transformers' Qwen3-VL vision model (the visual module of the same class) built
from the checkpoint's vision_config in bf16 with SDPA attention, run on the dump's pixel values
(the image processor's, as bf16, as the pipeline feeds them) and patch grid; its merged and
DeepStack features are compared with vortex's. Timed: vortex's span, the host f32 patches to the
features on the host (the bf16 cast and upload, the forward, four downloads); reported beside it,
the forward alone from device-resident pixels to device-resident features.

Protocol as vortex's (measure() of pytorch_h3.py): warm-ups, then timed repetitions with CUDA
events, each after a 256 MB L2 flush.
"""

import argparse
import json
import os

import safetensors
import torch
from safetensors.torch import load_file

from pytorch_h3 import compare, measure

def read_dump(path):
    """(the metadata vortex wrote, the tensors on the device) of an --io dump."""
    with safetensors.safe_open(path, "pt") as f:
        meta = json.loads(f.metadata()["encoder"])
    return meta, load_file(path, device="cuda")


def bf16_sdpa_model(model_class, config):
    config._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = model_class(config).eval()
    torch.set_default_dtype(torch.float32)
    return model


def load_weights(model, folder, prefix, may_miss=frozenset()):
    """The checkpoint's tensors under `prefix` into the model; any other mismatch is an error."""
    weights = {k[len(prefix):]: v for k, v in load_file(os.path.join(folder, "model.safetensors"), device="cuda").items()
               if k.startswith(prefix)}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if k not in may_miss]:
        raise SystemExit(f"checkpoint does not fit {type(model).__name__}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


def text_encode(args):
    import transformers
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

    meta, io = read_dump(args.io)
    folder = meta["checkpoint"]
    with open(os.path.join(folder, "config.json")) as f:
        text_config = json.load(f)["text_config"]
    # The released model's multimodal RoPE sections; a text-only prompt gives every axis the same
    # position, so they do not change the result.
    text_config["rope_parameters"] = dict(text_config["rope_parameters"], mrope_section=[24, 20, 20],
                                          mrope_interleaved=True)
    model = bf16_sdpa_model(Qwen3VLTextModel, Qwen3VLTextConfig(**text_config))
    # The pipeline reads layer 50's states before the final norm, which the checkpoint may omit.
    load_weights(model, folder, "model.language_model.", may_miss={"norm.weight"})
    rotary = getattr(model, "rotary_emb", None)
    inv_freq_dtype = str(rotary.inv_freq.dtype) if rotary is not None else "?"

    captured = []
    model.layers[meta["layers"] - 1].register_forward_hook(
        lambda module, inputs, output: captured.append(output[0] if isinstance(output, tuple) else output))
    ids = io["in.input_ids"].long()[None]
    mask = torch.ones_like(ids)

    def forward():
        return model(input_ids=ids, attention_mask=mask, use_cache=False)

    with torch.no_grad():
        forward()
        reference = captured[-1][0]
        correctness = compare(io["out.states"], reference)
        correctness["comparator"] = (f"transformers {transformers.__version__} Qwen3VLTextModel, bf16, SDPA, same "
                                     f"checkpoint and ids (RoPE inverse frequencies {inv_freq_dtype})")
        timing = measure(forward, args.warmup, args.reps)
    return {"correctness": correctness, "peers": [{"name": "transformers-qwen3vl-text-eager-sdpa", **timing}]}


def vision_encode(args):
    import transformers
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    meta, io = read_dump(args.io)
    folder = meta["checkpoint"]
    with open(os.path.join(folder, "config.json")) as f:
        model = bf16_sdpa_model(Qwen3VLVisionModel, Qwen3VLVisionConfig(**json.load(f)["vision_config"]))
    load_weights(model, folder, "model.visual.")
    pixels_host = io["in.pixel_values"].cpu()  # the processor's f32 patches, as vortex's timed span starts
    pixels = pixels_host.to(torch.bfloat16).cuda()
    grid = io["in.grid_thw"].long()

    def forward():
        return model(pixels, grid_thw=grid, return_dict=True)

    def features(out):
        # transformers 5 returns an output object; 4.x a (merged, deepstack) tuple.
        if isinstance(out, tuple):
            return out[0], list(out[1])
        return out.pooler_output, list(out.deepstack_features)

    def host_to_host():
        # vortex's timed span: host f32 patches -> bf16 on the device -> the tower -> the features on the host.
        merged, deepstack = features(model(pixels_host.to("cuda", torch.bfloat16), grid_thw=grid, return_dict=True))
        return merged.cpu(), [d.cpu() for d in deepstack]

    with torch.no_grad():
        merged, deepstack = features(forward())
        correctness = compare(io["out.merged"], merged)
        correctness["deepstack"] = [compare(io[f"out.deepstack.{j}"], d) for j, d in enumerate(deepstack)]
        correctness["comparator"] = (f"transformers {transformers.__version__} Qwen3VLVisionModel, bf16, SDPA, same "
                                     f"checkpoint and pixel values (bf16)")
        timing = measure(host_to_host, args.warmup, args.reps)
        resident = measure(forward, args.warmup, args.reps)
    return {"correctness": correctness, "peers": [{"name": "transformers-qwen3vl-vision-eager-sdpa", **timing}],
            "device_resident": {"span": "device bf16 pixels -> device features", **resident}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=["text-encode", "vision-encode"])
    parser.add_argument("--io", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    report = text_encode(args) if args.workload == "text-encode" else vision_encode(args)
    report["torch"] = torch.__version__
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
