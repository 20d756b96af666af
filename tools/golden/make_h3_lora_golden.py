#!/usr/bin/env python3
"""Writes tests/golden/h3_lora/: LoRA files in every layout diffusers' MiniMax-H3 loader reads, and
the weights and outputs diffusers makes of them.

Runs on the GPU machine beside make_h3_golden.py (same reference copy, same helpers):

    PYTHONPATH=.ref python3 tools/golden/make_h3_lora_golden.py --out tests/golden

The model is a small H3 with 128-wide heads, since DiffSynth-Studio's per-head-interleaved QKV is
de-interleaved by diffusers at a head width of 128. Each LoRA file is read by
`MiniMaxH3LoraLoaderMixin.lora_state_dict` (the format detection, the conversion onto diffusers'
module names, kohya's `.alpha` fold and the `__metadata__` alphas). Every converted module is then
merged into the base weights in float64, W + scaling * (B @ A), with peft's scaling rule
(alpha / rank, alpha / sqrt(rank) under rsLoRA; alpha == rank when nothing records an alpha) and
rounded to fp32 once. Where peft is importable, the same adapters are also loaded through peft and
its scalings and unfused forward are checked against the merged ones (recorded in `stats`).

Writes:
  config.json, base.safetensors   the model (fp32, diffusers layout)
  <name>.safetensors              one LoRA file per layout (see LORA_FILES)
  expected.safetensors            `<name>/<tensor>`: each merged weight that file's LoRA changes (fp32);
                                  `in.*`: forward inputs; `<case>.video_out` / `<case>.audio_out`
                                  for the cases in FORWARD_CASES (weights merged as listed, fp32)
"""

import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin  # noqa: E402
from make_h3_golden import full_config, randomize, tiny_inputs  # noqa: E402

CONFIG = {
    "num_attention_heads": 2,
    "attention_head_dim": 128,
    "hidden_size": 32,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "ffn_dim": 48,
    "in_channels": 4,
    "audio_in_channels": 6,
    "patch_size": [1, 2, 2],
    "text_dim": 8,
    "freq_dim": 8,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 16,
}

# Original module name -> diffusers module name, outside the blocks.
STANDALONE = {
    "video_patch_proj": "proj_in",
    "audio_patch_proj": "audio_proj_in",
    "condition_proj": "context_embedder",
    "time_embedder.proj_in": "time_embedder.linear_1",
    "time_embedder.proj_out": "time_embedder.linear_2",
    "final_layer.adaln_proj.linear": "norm_out.linear",
    "final_layer.video_out": "proj_out",
    "final_layer.audio_out": "audio_proj_out",
}


def original_shape(state, module):
    """[out, in] of an original-layout module (fused qkv_proj, [gate; value] fc1)."""
    if module in STANDALONE:
        return tuple(state[STANDALONE[module] + ".weight"].shape)
    block = re.sub(r"^blocks\.", "transformer_blocks.", module)
    block = re.sub(r"^token_refiner\.blocks\.", "token_refiner.refiner_blocks.", block)
    prefix, _, leaf = block.rpartition(".attn.") if ".attn." in block else block.rpartition(".mlp.")
    if leaf == "qkv_proj":
        out, inp = state[prefix + ".attn.to_q.weight"].shape
        return 3 * out, inp
    diffusers_leaf = {"out_proj": ".attn.to_out.0", "fc1": ".ff.net.0.proj", "fc2": ".ff.net.2"}
    if leaf in diffusers_leaf:
        return tuple(state[prefix + diffusers_leaf[leaf] + ".weight"].shape)
    return tuple(state[block + ".weight"].shape)  # adaln_proj.linear


def factors(g, shape, rank, dtype):
    out_f, in_f = shape
    down = torch.randn(rank, in_f, generator=g) / in_f**0.5
    up = torch.randn(out_f, rank, generator=g) * (0.5 / rank**0.5)
    return down.to(dtype), up.to(dtype)


BLOCK0 = ["blocks.0.attn.qkv_proj", "blocks.0.attn.out_proj", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2",
          "blocks.0.adaln_proj.linear"]


def kohya_original(state, g):
    """ai-toolkit / ComfyUI style: `diffusion_model.` prefix, lora_down / lora_up with `.alpha`, every
    kind of module (block, refiner block, every projection outside the blocks)."""
    modules = BLOCK0 + ["blocks.1.mlp.fc1", "token_refiner.blocks.0.attn.qkv_proj", "token_refiner.blocks.0.mlp.fc1",
                        "token_refiner.blocks.0.mlp.fc2"] + list(STANDALONE)
    tensors = {}
    for i, module in enumerate(modules):
        down, up = factors(g, original_shape(state, module), 4, torch.float32)
        tensors[f"diffusion_model.{module}.lora_down.weight"] = down
        tensors[f"diffusion_model.{module}.lora_up.weight"] = up
        # alpha / rank 0.75 (not a power of two), and 0.25 on every third module (the fold's balancing loop).
        tensors[f"diffusion_model.{module}.alpha"] = torch.tensor(1.0 if i % 3 == 0 else 3.0)
    return tensors, {}


def diffusers_metadata_alpha(state, g):
    """diffusers names under `transformer.`, mixed rank (8 / 2 on the AdaLN projections), bf16, the
    network alpha in `__metadata__` (lightx2v's turbo files)."""
    tensors = {}
    for module in ["transformer_blocks.1.attn.to_q", "transformer_blocks.1.attn.to_k", "transformer_blocks.1.attn.to_v",
                   "transformer_blocks.1.attn.to_out.0", "transformer_blocks.1.ff.net.0.proj",
                   "transformer_blocks.1.ff.net.2", "transformer_blocks.1.adaln_proj.linear", "norm_out.linear",
                   "proj_out"]:
        rank = 2 if "adaln" in module or module == "norm_out.linear" else 8
        down, up = factors(g, tuple(state[module + ".weight"].shape), rank, torch.bfloat16)
        tensors[f"transformer.{module}.lora_A.weight"] = down
        tensors[f"transformer.{module}.lora_B.weight"] = up
    return tensors, {"alpha": "4"}


def diffsynth(state, g, heads, head_dim):
    """DiffSynth-Studio: no prefix, peft's `.default.` infix, the raw checkpoint's per-head-interleaved
    QKV rows `[h0: q k v, h1: q k v]`."""
    tensors = {}
    for module in ["blocks.0.attn.qkv_proj", "blocks.0.mlp.fc1", "blocks.1.attn.out_proj",
                   "token_refiner.blocks.0.attn.qkv_proj"]:
        down, up = factors(g, original_shape(state, module), 4, torch.float32)
        if module.endswith("qkv_proj"):
            # Write the factor the interleaved layout holds for the same [q; k; v] update.
            q, k, v = up.chunk(3)
            up = torch.stack([t.reshape(heads, head_dim, -1) for t in (q, k, v)], dim=1).reshape(up.shape)
        tensors[f"{module}.lora_A.default.weight"] = down
        tensors[f"{module}.lora_B.default.weight"] = up.contiguous()
    return tensors, {}


def musubi(state, g):
    """musubi-tuner (kohya sd-scripts): flattened `lora_unet_` names, lora_down / lora_up, `.alpha`."""
    tensors = {}
    for module in ["blocks.1.attn.qkv_proj", "blocks.1.mlp.fc2", "blocks.0.adaln_proj.linear",
                   "token_refiner.blocks.0.mlp.fc1", "final_layer.video_out", "time_embedder.proj_in"]:
        down, up = factors(g, original_shape(state, module), 4, torch.float32)
        flat = "lora_unet_" + module.replace(".", "_")
        tensors[f"{flat}.lora_down.weight"] = down
        tensors[f"{flat}.lora_up.weight"] = up
        tensors[f"{flat}.alpha"] = torch.tensor(8.0)
    return tensors, {}


def peft_dump(state, g):
    """A peft state dict saved as is: diffusers names, `.default.` infix, no component prefix."""
    tensors = {}
    for module in ["transformer_blocks.0.attn.to_v", "transformer_blocks.0.ff.net.2", "context_embedder"]:
        down, up = factors(g, tuple(state[module + ".weight"].shape), 4, torch.float32)
        tensors[f"{module}.lora_A.default.weight"] = down
        tensors[f"{module}.lora_B.default.weight"] = up
    return tensors, {}


def adapter_metadata(state, g):
    """What diffusers' save_lora_weights writes: `transformer.` names and the adapter's peft config as
    `lora_adapter_metadata` JSON (r 4, alpha 8, one module at another rank, one at another alpha)."""
    tensors = {}
    ranks = {"transformer_blocks.0.attn.to_q": 4, "transformer_blocks.1.ff.net.2": 2,
             "transformer_blocks.0.adaln_proj.linear": 4, "token_refiner.refiner_blocks.0.attn.to_k": 4}
    for module, rank in ranks.items():
        down, up = factors(g, tuple(state[module + ".weight"].shape), rank, torch.float32)
        tensors[f"transformer.{module}.lora_A.weight"] = down
        tensors[f"transformer.{module}.lora_B.weight"] = up
    config = {"r": 4, "lora_alpha": 8, "rank_pattern": {"^transformer_blocks.1.ff.net.2": 2},
              "alpha_pattern": {"^transformer_blocks.0.attn.to_q": 2}, "use_rslora": False, "use_dora": False,
              "lora_bias": False, "target_modules": sorted(ranks)}
    packed = {f"transformer.{k}": v for k, v in config.items()}
    return tensors, {"lora_adapter_metadata": json.dumps(packed)}


def rslora_metadata(state, g):
    """The same metadata under rsLoRA (alpha / sqrt(rank))."""
    tensors = {}
    for module in ["transformer_blocks.1.attn.to_out.0", "audio_proj_out"]:
        down, up = factors(g, tuple(state[module + ".weight"].shape), 4, torch.float32)
        tensors[f"transformer.{module}.lora_A.weight"] = down
        tensors[f"transformer.{module}.lora_B.weight"] = up
    config = {"r": 4, "lora_alpha": 6, "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": True,
              "use_dora": False, "lora_bias": False,
              "target_modules": ["transformer_blocks.1.attn.to_out.0", "audio_proj_out"]}
    return tensors, {"lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()})}


def peft_made(state, g, targets, rank, use_dora, lora_bias):
    """A file as diffusers saves a peft adapter (`transformer.` + get_peft_model_state_dict's names),
    made by peft itself so the tensor names are peft's own: random factors, DoRA magnitudes around
    the norms of W + B·A, lora_B biases."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    model = full_config(CONFIG)[1]
    model.load_state_dict(state)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, use_dora=use_dora, lora_bias=lora_bias)
    inject_adapter_in_model(config, model, adapter_name="default")
    modules = dict(model.named_modules())
    with torch.no_grad():
        for target in targets:
            layer = modules[target]
            down, up = factors(g, tuple(state[target + ".weight"].shape), rank, torch.float32)
            layer.lora_A["default"].weight.copy_(down)
            layer.lora_B["default"].weight.copy_(up)
            if lora_bias:
                layer.lora_B["default"].bias.copy_(0.1 * torch.randn(up.shape[0], generator=g))
            if use_dora:
                norm = (state[target + ".weight"].double() + up.double() @ down.double()).norm(dim=1)
                spread = torch.exp(0.25 * torch.randn(up.shape[0], generator=g, dtype=torch.float64))
                layer.lora_magnitude_vector["default"].weight.copy_((norm * spread).float())
    saved = get_peft_model_state_dict(model, adapter_name="default")
    return {f"transformer.{k}": v.detach().clone() for k, v in saved.items()}, {}


def dora(state, g):
    """peft's DoRA (lora_magnitude_vector) on linears other files also target, so that a stacked
    case shows it scaling the adapters merged before it."""
    return peft_made(state, g, ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_out.0",
                                "context_embedder", "audio_proj_out"], 4, True, False)


def lora_bias(state, g):
    """peft's lora_bias (a lora_B bias) on linears with a bias: inside the blocks, outside, an fp32 island."""
    return peft_made(state, g, ["transformer_blocks.1.adaln_proj.linear", "context_embedder", "proj_out"], 2, False,
                     True)


LORA_FILES = ["kohya_original", "diffusers_metadata_alpha", "diffsynth", "musubi", "peft_dump", "adapter_metadata",
              "rslora_metadata", "dora", "lora_bias"]
# Forward outputs: (case, [(file, strength), ...]) merged in order.
FORWARD_CASES = [("kohya_original", [("kohya_original", 1.0)]),
                 ("stacked", [("kohya_original", 0.5), ("diffusers_metadata_alpha", 1.0), ("diffsynth", -0.75)]),
                 ("dora_stacked", [("lora_bias", 0.7), ("rslora_metadata", 1.0), ("dora", -0.5)])]


def pattern_value(patterns, module, default):
    """peft's pattern lookup: a key matches a module name it ends, after a dot or from the start."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(^|.*\.){key}$", module):
            return value
    return default


def scaling(module, rank, metadata):
    if not metadata:
        return 1.0
    config = {k[len("transformer."):]: v for k, v in metadata.items() if k.startswith("transformer.")}
    r = pattern_value(config.get("rank_pattern"), module, config["r"])
    assert r == rank, f"{module}: rank {rank} in the file, {r} in the metadata"
    alpha = pattern_value(config.get("alpha_pattern"), module, config["lora_alpha"])
    return alpha / (math.sqrt(r) if config.get("use_rslora") else r)


def converted_modules(folder, name):
    state_dict, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(
        folder, weight_name=name + ".safetensors", return_lora_metadata=True)
    modules = {}
    for key, value in state_dict.items():
        assert key.startswith("transformer."), key
        module, _, leaf = key[len("transformer."):].rpartition(".lora_")
        modules.setdefault(module, {})[leaf] = value
    out = {}
    for module, parts in modules.items():
        down, up = parts["A.weight"].double(), parts["B.weight"].double()
        magnitude = parts.get("magnitude_vector.weight", parts.get("magnitude_vector"))
        bias = parts.get("B.bias")
        out[module] = (down, up, scaling(module, down.shape[0], metadata),
                       None if magnitude is None else magnitude.double(), None if bias is None else bias.double())
    return out, state_dict, metadata


def merge(base, applications):
    """base (fp32 state dict) with each (modules, strength) folded in float64, rounded once, as peft's
    unmerged forward computes: a plain module adds s·B·A (and s·b to the bias); a DoRA module, with
    f = m / ‖W + s·B·A‖ per output row of the unmerged W, makes the sum so far f·(sum + s·B·A) and
    scales the adapters' bias terms so far likewise (not the linear's own bias)."""
    merged = {k: v.double() for k, v in base.items()}
    added_bias = {}
    for modules, strength in applications:
        for module, (down, up, scale, magnitude, bias) in modules.items():
            s = strength * scale
            delta = s * (up @ down)
            own = s * bias if bias is not None else torch.zeros(up.shape[0], dtype=torch.float64)
            added = added_bias.get(module, torch.zeros(up.shape[0], dtype=torch.float64))
            if magnitude is None:
                merged[module + ".weight"] += delta
                added_bias[module] = added + own
            else:
                f = magnitude / (base[module + ".weight"].double() + delta).norm(dim=1)
                merged[module + ".weight"] = f[:, None] * (merged[module + ".weight"] + delta)
                added_bias[module] = f * (added + own)
    for module, added in added_bias.items():
        if module + ".bias" in merged:
            merged[module + ".bias"] += added
    return {k: v.float() for k, v in merged.items()}


def changed_tensors(modules):
    """The model tensors a file's modules change: each weight, and the bias where a module has a lora_B bias."""
    return [module + leaf for module, m in modules.items() for leaf in ([".weight"] + ([".bias"] if m[4] is not None
                                                                                       else []))]


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def forward(state, inputs):
    model = full_config(CONFIG)[1]
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        video, audio = model(**inputs, return_dict=False)
    return video[0], audio[0]


def peft_check(base, folder, name, modules, inputs, expected_video):
    """Loads the file through diffusers + peft: the scalings peft chose and its unfused forward."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return "peft not installed: not cross-checked"
    try:
        return peft_loaded_check(base, folder, name, modules, inputs, expected_video)
    except Exception as error:  # recorded in stats, read before the golden is committed
        return f"peft check failed: {type(error).__name__}: {error}"


def peft_loaded_check(base, folder, name, modules, inputs, expected_video):
    model = full_config(CONFIG)[1]
    model.load_state_dict(base)
    _, state_dict, metadata = converted_modules(folder, name)
    MiniMaxH3LoraLoaderMixin.load_lora_into_transformer(state_dict, transformer=model, adapter_name="x",
                                                        metadata=metadata)
    for module_name, module in model.named_modules():
        if "x" in getattr(module, "scaling", {}):
            assert abs(module.scaling["x"] - modules[module_name][2]) < 1e-12, (module_name, module.scaling["x"])
    model.eval()
    with torch.no_grad():
        video, _ = model(**inputs, return_dict=False)
    return {"peft_unfused_video_vs_merged": rel_l2(video[0], expected_video)}


def peft_stacked_check(base, folder, applications, inputs, expected_video):
    """Several files loaded through diffusers + peft as adapters active in order at their strengths
    (set_adapters): peft's unfused forward against the merge of the same (DoRA's order matters)."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return "peft not installed: not cross-checked"
    try:
        model = full_config(CONFIG)[1]
        model.load_state_dict(base)
        names = []
        for i, (name, _) in enumerate(applications):
            _, state_dict, metadata = converted_modules(folder, name)
            MiniMaxH3LoraLoaderMixin.load_lora_into_transformer(state_dict, transformer=model, adapter_name=f"a{i}",
                                                                metadata=metadata)
            names.append(f"a{i}")
        model.set_adapters(names, weights=[strength for _, strength in applications])
        model.eval()
        with torch.no_grad():
            video, _ = model(**inputs, return_dict=False)
        return {"peft_unfused_video_vs_merged": rel_l2(video[0], expected_video)}
    except Exception as error:  # recorded in stats, read before the golden is committed
        return f"peft check failed: {type(error).__name__}: {error}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/golden")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    folder = os.path.join(args.out, "h3_lora")
    os.makedirs(folder, exist_ok=True)

    torch.manual_seed(5)
    config, model = full_config(CONFIG)
    randomize(model, 5)
    base = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(base, os.path.join(folder, "base.safetensors"),
              metadata={"config": json.dumps(config, sort_keys=True), "format": "pt", "layout": "diffusers"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"_class_name": "MiniMaxH3Transformer3DModel", **config}, f, indent=2, sort_keys=True)

    g = torch.Generator().manual_seed(11)
    makers = {"kohya_original": lambda: kohya_original(base, g),
              "diffusers_metadata_alpha": lambda: diffusers_metadata_alpha(base, g),
              "diffsynth": lambda: diffsynth(base, g, CONFIG["num_attention_heads"], CONFIG["attention_head_dim"]),
              "musubi": lambda: musubi(base, g), "peft_dump": lambda: peft_dump(base, g),
              "adapter_metadata": lambda: adapter_metadata(base, g),
              "rslora_metadata": lambda: rslora_metadata(base, g),
              "dora": lambda: dora(base, g), "lora_bias": lambda: lora_bias(base, g)}
    expected, converted, stats = {}, {}, {}
    inputs = tiny_inputs(config)
    for name in LORA_FILES:
        tensors, metadata = makers[name]()
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, name + ".safetensors"),
                  metadata=metadata or None)
        modules, _, _ = converted_modules(folder, name)
        converted[name] = modules
        merged = merge(base, [(modules, 1.0)])
        for tensor in changed_tensors(modules):
            expected[f"{name}/{tensor}"] = merged[tensor].contiguous()
        video, _ = forward(merged, inputs)
        stats[name] = {"modules": len(modules),
                       "scalings": sorted({round(m[2], 12) for m in modules.values()}),
                       "peft": peft_check(base, folder, name, modules, inputs, video)}
    for key in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        expected["in." + key] = inputs[key][0].float().contiguous()
    for key in ("timestep", "timestep_indices", "token_tags", "video_indices", "audio_indices", "text_indices",
                "position_ids"):
        expected["in." + key] = inputs[key].contiguous()
    base_video, base_audio = forward(base, inputs)
    for case, applications in FORWARD_CASES:
        merged = merge(base, [(converted[name], strength) for name, strength in applications])
        video, audio = forward(merged, inputs)
        expected[f"{case}.video_out"] = video.float().contiguous()
        expected[f"{case}.audio_out"] = audio.float().contiguous()
        stats[case + "_vs_base"] = {"video": rel_l2(video, base_video), "audio": rel_l2(audio, base_audio)}
        if len(applications) > 1:
            stats[case + "_peft"] = peft_stacked_check(base, folder, applications, inputs, video)
    save_file(expected, os.path.join(folder, "expected.safetensors"),
              metadata={"stats": json.dumps(stats, sort_keys=True),
                        "cases": json.dumps(FORWARD_CASES), "torch": torch.__version__})
    print(json.dumps(stats, indent=2, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
