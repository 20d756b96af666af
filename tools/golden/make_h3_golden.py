#!/usr/bin/env python3
"""Writes the MiniMax-H3 parity goldens under tests/golden/ by running the diffusers reference.

Runs on the GPU machine, where PyTorch lives, with the reference implementation brought as a
git-ignored copy of diffusers' `src/diffusers` (never committed):

    PYTHONPATH=.ref python3 tools/golden/make_h3_golden.py --out tests/golden

For each config it writes a folder with
  config.json                 the diffusers transformer config
  diffusers.safetensors       random fp32 weights, diffusers layout (to_q/to_k/to_v, [value; gate])
  original.safetensors        the same weights, original layout (per-head interleaved qkv_proj, [gate; value])
  io_fp32.safetensors         inputs, intermediates (temb, rope, refiner, every block) and outputs, fp32
  io_bf16.safetensors         the same run with the block stack in bf16 (fp32 islands kept), on the CPU
and, for configs with a trajectory, trajectory.safetensors (a short denoise through the two schedulers).
Plus schedule.safetensors (sigma grids) and layout_canonical.safetensors (the canonical packed layout).
"""

import argparse
import json
import os
import sys

# cuBLAS needs a fixed workspace to be deterministic; set before torch initialises CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from safetensors.torch import save_file

from diffusers import MiniMaxH3Transformer3DModel  # noqa: E402
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.schedulers import MiniMaxH3Scheduler

VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2
FP32_MODULES = ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out", "rope")

# diffusers' own unit-test config (tests/models/transformers/test_models_transformer_minimax_h3.py).
TINY_CONFIG = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 2,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 6,
    "patch_size": [1, 2, 2],
    "text_dim": 8,
    "freq_dim": 8,
    "time_embed_hidden_dim": 24,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}

# Three blocks, heads * head_dim (72) != hidden (48), partial rotary (18 of 24 channels), the real
# latent widths (24 video channels, 32 audio), and a t2va layout built by the reference pipeline.
SMALL_CONFIG = {
    "num_attention_heads": 3,
    "attention_head_dim": 24,
    "hidden_size": 48,
    "num_layers": 3,
    "num_refiner_layers": 2,
    "ffn_dim": 64,
    "in_channels": 24,
    "audio_in_channels": 32,
    "patch_size": [1, 2, 2],
    "text_dim": 40,
    "freq_dim": 16,
    "time_embed_hidden_dim": 48,
    "time_embed_dim": 24,
    "rope_freq_dim": 3,
}


def full_config(overrides):
    """The model and its full config (defaults filled in by diffusers)."""
    model = MiniMaxH3Transformer3DModel(**overrides)
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    config["patch_size"] = list(config["patch_size"])
    return config, model


def randomize(model, seed):
    """Default Linear init, then norms and biases moved off their trivial values."""
    generator = torch.Generator().manual_seed(seed)
    norm_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.RMSNorm)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in norm_weights:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif param.ndim == 1:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))
            else:
                fan_in = param.shape[1]
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)


def to_original_layout(state, config):
    """Inverse of scripts/convert_minimax_h3_to_diffusers.py: diffusers names -> original names."""
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    out = {}
    renames = [
        ("proj_in.", "video_patch_proj."),
        ("audio_proj_in.", "audio_patch_proj."),
        ("context_embedder.", "condition_proj."),
        ("time_embedder.linear_1.", "time_embedder.proj_in."),
        ("time_embedder.linear_2.", "time_embedder.proj_out."),
        ("norm_out.norm.", "final_layer.norm."),
        ("norm_out.linear.", "final_layer.adaln_proj.linear."),
        ("proj_out.", "final_layer.video_out."),
        ("audio_proj_out.", "final_layer.audio_out."),
    ]
    for name, tensor in state.items():
        if name.endswith("attn.to_k.weight") or name.endswith("attn.to_v.weight"):
            continue
        target = name
        if target.startswith("transformer_blocks."):
            target = "blocks." + target[len("transformer_blocks."):]
        elif target.startswith("token_refiner.refiner_blocks."):
            target = "token_refiner.blocks." + target[len("token_refiner.refiner_blocks."):]
        else:
            for src, dst in renames:
                if target.startswith(src):
                    target = dst + target[len(src):]
                    break
        target = target.replace(".attn.norm_q.", ".attn.q_norm.").replace(".attn.norm_k.", ".attn.k_norm.")
        target = target.replace(".attn.to_out.0.", ".attn.out_proj.").replace(".ff.net.2.", ".mlp.fc2.")
        if name.endswith("attn.to_q.weight"):
            prefix = name[: -len("to_q.weight")]
            q, k, v = (state[prefix + p + ".weight"] for p in ("to_q", "to_k", "to_v"))
            # Raw shards interleave per head: [h0: q k v, h1: q k v, ...].
            stacked = torch.stack([t.reshape(heads, head_dim, -1) for t in (q, k, v)], dim=1)
            out[target.replace(".attn.to_q.weight", ".attn.qkv_proj.weight")] = stacked.reshape(
                3 * heads * head_dim, -1).contiguous()
            continue
        if name.endswith("ff.net.0.proj.weight"):
            value, gate = tensor.chunk(2, dim=0)
            out[target.replace(".ff.net.0.proj.weight", ".mlp.fc1.weight")] = torch.cat([gate, value]).contiguous()
            continue
        out[target] = tensor.contiguous()
    rope_dim = config["rope_freq_dim"]
    out["rope.inv_freq"] = 1.0 / (config["rope_theta"] ** (
        torch.arange(0, 2 * rope_dim, 2, dtype=torch.float32) / (2 * rope_dim)))
    return out


def tiny_inputs(config):
    """The packed layout of diffusers' unit test: text 4, audio 6, video 8, two timesteps."""
    n_text, n_audio, n_video = 4, 6, 8
    n = n_text + n_audio + n_video
    text_idx = torch.arange(n_text)
    audio_idx = torch.arange(n_text, n_text + n_audio)
    video_idx = torch.arange(n_text + n_audio, n)
    tags = torch.empty(n, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = TEXT_TAG, AUDIO_TAG, VIDEO_TAG
    t_idx = torch.zeros(n, dtype=torch.long)
    t_idx[audio_idx] = 1
    pos = torch.zeros(n, 3, dtype=torch.float32)
    pos[:, 0] = torch.arange(n, dtype=torch.float32)
    pos[video_idx, 1] = torch.arange(n_video, dtype=torch.float32) % 4
    pos[video_idx, 2] = torch.arange(n_video, dtype=torch.float32) % 2
    g = torch.Generator().manual_seed(0)
    patch = config["in_channels"] * 4
    return {
        "hidden_states": torch.randn(1, n_video, patch, generator=g),
        "audio_hidden_states": torch.randn(1, n_audio, config["audio_in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, n_text, config["text_dim"], generator=g),
        "timestep": torch.tensor([0.7, 0.3]),
        "timestep_indices": t_idx,
        "token_tags": tags,
        "position_ids": pos,
        "video_indices": video_idx,
        "audio_indices": audio_idx,
        "text_indices": text_idx,
    }


def t2va_layout(num_text, num_frames, latent_h, latent_w, patch):
    """The reference pipeline's t2va layout; returns the layout dict plus geometry."""
    latent_frames = (num_frames - 5) // 17 * 5 + 2
    audio_latents = int(round(num_frames / 24 * 40))
    text_tags = torch.full((num_text,), TEXT_TAG, dtype=torch.long)
    pos, tags, v_idx, a_idx, t_idx, n_cond_v, n_cond_a = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        text_tags, latent_frames, latent_h, latent_w, audio_latents, tuple(patch), 2, AUDIO_TAG, VIDEO_TAG, ())
    return {
        "position_ids": pos, "token_tags": tags, "video_indices": v_idx, "audio_indices": a_idx,
        "text_indices": t_idx, "latent_frames": latent_frames, "audio_latents": audio_latents,
    }


def small_inputs(config, layout, video_timestep, audio_timestep):
    g = torch.Generator().manual_seed(1)
    n_video, n_audio, n_text = (layout[k].numel() for k in ("video_indices", "audio_indices", "text_indices"))
    timestep, t_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        layout["video_indices"], layout["audio_indices"], 0, 0, n_text, video_timestep, audio_timestep, 1.0, 1.0)
    return {
        "hidden_states": torch.randn(1, n_video, config["in_channels"] * 4, generator=g),
        "audio_hidden_states": torch.randn(1, n_audio, config["audio_in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(1, n_text, config["text_dim"], generator=g),
        "timestep": timestep,
        "timestep_indices": t_idx,
        "token_tags": layout["token_tags"],
        "position_ids": layout["position_ids"],
        "video_indices": layout["video_indices"],
        "audio_indices": layout["audio_indices"],
        "text_indices": layout["text_indices"],
    }


def cast_mixed_bf16(model):
    """The released checkpoint's precision: bf16 everywhere except the fp32 islands."""
    for name, module in model.named_modules():
        if not name or any(part in name for part in FP32_MODULES):
            continue
        for pname, param in list(module.named_parameters(recurse=False)):
            param.data = param.data.to(torch.bfloat16)
    return model


def run_with_intermediates(model, inputs):
    """Forward with hooks that record the refiner output and every block output."""
    records = {}
    hooks = [model.token_refiner.register_forward_hook(
        lambda m, a, o: records.__setitem__("refiner_out", o[0].detach().clone()))]
    for i, block in enumerate(model.transformer_blocks):
        hooks.append(block.register_forward_hook(
            lambda m, a, o, i=i: records.__setitem__(f"block_{i}_out", o[0].detach().clone())))
        if i == 0:
            hooks.append(block.register_forward_pre_hook(
                lambda m, a: records.__setitem__("block_0_in", a[0][0].detach().clone())))
    hooks.append(model.norm_out.register_forward_hook(
        lambda m, a, o: records.__setitem__("norm_out", o[0].detach().clone())))
    with torch.no_grad():
        video, audio = model(**inputs, return_dict=False)
        temb = model.time_embedder(model.time_proj(inputs["timestep"]).to(torch.float32))
        cos, sin = model.rope(inputs["position_ids"])
    for h in hooks:
        h.remove()
    records.update({"video_out": video[0], "audio_out": audio[0], "temb": temb, "rope_cos": cos, "rope_sin": sin})
    return records


def io_tensors(inputs, records):
    out = {}
    for key in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        out["in." + key] = inputs[key][0].float().contiguous()
    for key in ("timestep", "timestep_indices", "token_tags", "video_indices", "audio_indices", "text_indices"):
        out["in." + key] = inputs[key].contiguous()
    out["in.position_ids"] = inputs["position_ids"].contiguous()
    for key, value in records.items():
        out["out." + key] = value.float().contiguous()
    return out


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def write_config_folder(out_dir, name, overrides, seed, inputs_fn, trajectory=None):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(seed)
    config, model = full_config(overrides)
    randomize(model, seed)
    model.eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(config, sort_keys=True), "format": "pt", "layout": "diffusers"}
    save_file(state, os.path.join(folder, "diffusers.safetensors"), metadata=meta)
    original = to_original_layout(state, config)
    save_file(original, os.path.join(folder, "original.safetensors"), metadata={**meta, "layout": "original"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"_class_name": "MiniMaxH3Transformer3DModel", **config}, f, indent=2, sort_keys=True)

    inputs = inputs_fn(config)
    fp32 = run_with_intermediates(model, inputs)
    save_file(io_tensors(inputs, fp32), os.path.join(folder, "io_fp32.safetensors"))

    bf16_model = full_config(overrides)[1]
    bf16_model.load_state_dict(state)
    bf16_model = cast_mixed_bf16(bf16_model).eval()
    bf16 = run_with_intermediates(bf16_model, inputs)
    save_file(io_tensors(inputs, bf16), os.path.join(folder, "io_bf16.safetensors"))
    stats = {
        "bf16_cpu_vs_fp32": {k: rel_l2(bf16[k], fp32[k]) for k in ("video_out", "audio_out")},
    }
    if torch.cuda.is_available():
        cuda_model = full_config(overrides)[1]
        cuda_model.load_state_dict(state)
        cuda_model = cast_mixed_bf16(cuda_model).eval().cuda()
        cuda_inputs = {k: v.cuda() for k, v in inputs.items()}
        with torch.no_grad():
            v, a = cuda_model(**cuda_inputs, return_dict=False)
        stats["bf16_cuda_vs_bf16_cpu"] = {"video_out": rel_l2(v[0].cpu(), bf16["video_out"]),
                                          "audio_out": rel_l2(a[0].cpu(), bf16["audio_out"])}
    if trajectory is not None:
        trajectory(model, inputs, config, folder)
    return stats


def small_trajectory(model, inputs, config, folder, steps=4):
    """A short t2va denoise, the reference loop's arithmetic: two schedules, one forward per step."""
    video_sched, audio_sched = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    video_sched.set_timesteps(steps)
    audio_sched.set_timesteps(steps)
    g = torch.Generator().manual_seed(7)
    n_video = inputs["video_indices"].numel()
    n_audio = inputs["audio_indices"].numel()
    latents = torch.randn(n_video, config["in_channels"] * 4, generator=g)
    audio = torch.randn(n_audio, config["audio_in_channels"], generator=g)
    record = {"in.video_noise": latents.clone(), "in.audio_noise": audio.clone(),
              "in.encoder_hidden_states": inputs["encoder_hidden_states"][0].clone()}
    n_text = inputs["text_indices"].numel()
    for i, (t, ta) in enumerate(zip(video_sched.timesteps, audio_sched.timesteps)):
        timestep, t_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            inputs["video_indices"], inputs["audio_indices"], 0, 0, n_text, float(t), float(ta), 1.0, 1.0)
        step_inputs = dict(inputs, hidden_states=latents[None], audio_hidden_states=audio[None],
                           timestep=timestep, timestep_indices=t_idx)
        with torch.no_grad():
            v, a = model(**step_inputs, return_dict=False)
        record[f"step_{i}.timestep"] = timestep.clone()
        record[f"step_{i}.video_velocity"] = v[0].clone()
        latents = video_sched.step(v[0].float(), t, latents, return_dict=False)[0]
        audio = audio_sched.step(a[0].float(), ta, audio, return_dict=False)[0]
    record["out.video_latents"] = latents
    record["out.audio_latents"] = audio
    record["sigmas.video"] = video_sched.sigmas
    record["sigmas.audio"] = audio_sched.sigmas
    save_file({k: v.contiguous() for k, v in record.items()}, os.path.join(folder, "trajectory.safetensors"),
              metadata={"steps": str(steps)})


def write_schedules(out_dir):
    tensors = {}
    for steps in (2, 8, 12, 30, 50):
        for shift in (12.0, 3.0):
            sched = MiniMaxH3Scheduler(shift=shift)
            sched.set_timesteps(steps)
            tensors[f"sigmas.steps{steps}.shift{int(shift)}"] = sched.sigmas.contiguous()
            tensors[f"timesteps.steps{steps}.shift{int(shift)}"] = sched.timesteps.contiguous()
    save_file(tensors, os.path.join(out_dir, "schedule.safetensors"))


def write_canonical_layout(out_dir):
    layout = t2va_layout(100, 124, 48, 84, (1, 2, 2))
    # Positions as the reference builds them (float64) and the tags as bytes; the row indices
    # follow from the tags, which keeps the file small.
    tensors = {"position_ids": layout["position_ids"].contiguous(),
               "token_tags": layout["token_tags"].to(torch.uint8).contiguous()}
    save_file(tensors, os.path.join(out_dir, "layout_canonical.safetensors"),
              metadata={"num_text": "100", "num_frames": "124", "height": "768", "width": "1344"})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/golden")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    stats = {"torch": torch.__version__}
    stats["h3_tiny"] = write_config_folder(args.out, "h3_tiny", TINY_CONFIG, 0, tiny_inputs)
    # t2va at 22 frames (7 latent frames) on a 128x192 canvas: 8x12 latents, 24 rows per frame.
    small_layout = t2va_layout(12, 22, 8, 12, (1, 2, 2))
    stats["h3_small"] = write_config_folder(
        args.out, "h3_small", SMALL_CONFIG, 1,
        lambda config: small_inputs(config, small_layout, 0.35, 0.6), trajectory=small_trajectory)
    write_schedules(args.out)
    write_canonical_layout(args.out)
    with open(os.path.join(args.out, "golden_stats.json"), "w") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
    print(json.dumps(stats, indent=2, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
