#!/usr/bin/env python3
"""Writes the MiniMax-H3 audio VAE parity goldens under tests/golden/ by running the diffusers reference.

Runs where PyTorch lives (the GPU machine), with the reference implementation brought as a git-ignored copy of
diffusers' `src/diffusers` (never committed):

    PYTHONPATH=.ref python3 tools/golden/make_audio_vae_golden.py --out tests/golden

The reference runs in fp32 on the CPU, one thread, seeded: the same bytes on every run. For each config it writes
a folder with
  config.json             the diffusers AutoencoderKLMiniMaxH3Audio config (random latents_mean / latents_std)
  diffusers.safetensors   random fp32 weights: the model's whole state dict (encoder, pre_block, mean/logs heads,
                          dec_in_proj, BigVGAN decoder with weight_g / weight_v and the Kaiser-sinc filter buffers)
  io_fp32.safetensors     in.audio_rows [2*A, C]: the transformer's packed stereo rows (left rows, then right rows);
                          out.<module> [2, C, T]: decoder intermediates named after the reference modules;
                          out.waveform [2, samples]: the pipeline's stereo soundtrack
The rows go through the reference pipeline's own blocks (MiniMaxH3AfterDenoiseStep unpacks them,
MiniMaxH3AudioDecodeStep de-normalises and decodes), so the golden covers the pipeline's channel layout and
de-normalisation as well as the model.

Configs: audio_vae_tiny is diffusers' unit-test config (tests/models/autoencoders/
test_models_autoencoder_kl_minimax_h3_audio.py); audio_vae_small has the release's structure at small width
(32 latent channels, a rate-5 stage with kernel 9, three AMP kernels 3/7/11 with dilations 1/3/5).
"""

import argparse
import json
import os
import sys
import types

# cuBLAS needs a fixed workspace to be deterministic; set before torch initialises CUDA.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from diffusers import AutoencoderKLMiniMaxH3Audio  # noqa: E402

# diffusers' unit-test config; its latent statistics (0 and 1) are replaced by random ones below.
TINY_CONFIG = {
    "encoder_dim": 4,
    "encoder_rates": [2, 2],
    "latent_dim": 32,
    "latent_channels": 8,
    "num_attention_heads": 2,
    "decoder_dim": 16,
    "decoder_rates": [2, 2],
    "decoder_kernel_sizes": [4, 4],
    "resblock_kernel_sizes": [3, 7],
    "resblock_dilation_sizes": [[1, 3], [1, 3]],
    "sampling_rate": 32000,
}

# The release's structure (rate 5 with kernel 9, then rate 2 with kernel 4; AMP kernels 3/7/11 at dilations
# 1/3/5; 32 latent channels) at small width; hop 20.
SMALL_CONFIG = {
    "encoder_dim": 4,
    "encoder_rates": [5, 2, 2],
    "latent_dim": 64,
    "latent_channels": 32,
    "num_attention_heads": 2,
    "decoder_dim": 32,
    "decoder_rates": [5, 2, 2],
    "decoder_kernel_sizes": [9, 4, 4],
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "sampling_rate": 32000,
}

MAX_TOTAL_BYTES = 1_500_000


def build_model(overrides, generator):
    """The reference model with random per-channel latent statistics in its config."""
    channels = overrides["latent_channels"]
    mean = (0.1 * torch.randn(channels, generator=generator)).tolist()
    std = (0.5 + torch.rand(channels, generator=generator)).tolist()
    model = AutoencoderKLMiniMaxH3Audio(**overrides, latents_mean=mean, latents_std=std)
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    return json.loads(json.dumps(config)), model  # tuples -> lists


def randomize(model, generator):
    """Every parameter moved off its initial value; the filter and zero_k_bias buffers stay the reference's."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("weight_g"):
                param.copy_(1.0 + 0.1 * noise)  # the fused rows' norms, near 1
            elif name.endswith(".alpha") and param.ndim == 3:
                param.copy_(1.0 + 0.1 * noise)  # the encoder's Snake frequency, linear space, [1, C, 1]
            elif param.ndim >= 2:
                param.copy_(noise / param[0].numel() ** 0.5)  # weight_v, linear and 1x1 conv weights: fan-in
            elif name.endswith(".alpha") or name.endswith(".beta"):
                param.copy_(0.2 * noise)  # SnakeBeta, log space
            elif "norm" in name and name.endswith(".weight"):
                param.copy_(1.0 + 0.1 * noise)  # LayerNorm scales
            else:
                param.copy_(0.05 * noise)  # biases, q_bias, v_bias


def manual_decode(model, rows, num_latents):
    """The pipeline's audio tail written out: unpack, de-normalise, decode (a cross-check of the block path)."""
    latents = rows.reshape(2, num_latents, rows.shape[-1]).permute(0, 2, 1).contiguous()
    mean = torch.tensor(model.config.latents_mean, device=rows.device).view(1, -1, 1)
    std = torch.tensor(model.config.latents_std, device=rows.device).view(1, -1, 1)
    with torch.no_grad():
        audio = model.decode(latents * std + mean, return_dict=False)[0]
    return audio.float().permute(1, 0, 2)


def pipeline_decode(model, rows, num_latents):
    """The reference pipeline's own blocks: MiniMaxH3AfterDenoiseStep, then MiniMaxH3AudioDecodeStep."""
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3AfterDenoiseStep, MiniMaxH3AudioDecodeStep
    from diffusers.modular_pipelines.modular_pipeline import PipelineState

    # The after-denoise block also unpacks video rows: one 2x2 latent frame of 4 channels (one 16-wide row).
    components = types.SimpleNamespace(
        patch_size=(1, 2, 2),
        vae_latent_channels=4,
        audio_channels=2,
        audio_vae=model,
        _execution_device=torch.device("cpu"),
        audio_sampling_rate=model.config.sampling_rate,
    )
    state = PipelineState()
    for key, value in {
        "latents": torch.zeros(1, 16),
        "audio_latents": rows,
        "num_latent_frames": 1,
        "latent_height": 2,
        "latent_width": 2,
        "num_audio_latents": num_latents,
    }.items():
        state.set(key, value)
    _, state = MiniMaxH3AfterDenoiseStep()(components, state)
    _, state = MiniMaxH3AudioDecodeStep()(components, state)
    return state.get("audio")


def record_intermediates(model, records):
    """Forward hooks naming each decoder intermediate after its module ([B, C, T] as the reference holds it)."""
    decoder = model.decoder

    def output(name):
        return lambda module, args, out: records.__setitem__(name, out.detach().float().contiguous().clone())

    def first_input(name):
        return lambda module, args: records.__setitem__(name, args[0].detach().float().contiguous().clone())

    hooks = [
        model.dec_in_proj.register_forward_pre_hook(first_input("latents")),  # de-normalised decoder input
        model.dec_in_proj.register_forward_hook(output("dec_in_proj")),
        decoder.conv_pre.register_forward_hook(output("decoder.conv_pre")),
    ]
    num_stages = len(decoder.ups)
    for i, up in enumerate(decoder.ups):
        hooks.append(up[0].register_forward_hook(output(f"decoder.ups.{i}")))
        if i > 0:  # stage i-1's output (the mean of its AMP blocks) is upsampler i's input
            hooks.append(up[0].register_forward_pre_hook(first_input(f"decoder.stage.{i - 1}")))
    hooks.append(decoder.activation_post.register_forward_pre_hook(first_input(f"decoder.stage.{num_stages - 1}")))
    for n, block in enumerate(decoder.resblocks):
        hooks.append(block.register_forward_hook(output(f"decoder.resblocks.{n}")))
    first = decoder.resblocks[0]
    hooks.append(first.convs1[0].register_forward_hook(output("decoder.resblocks.0.convs1.0")))
    hooks.append(first.convs2[0].register_forward_hook(output("decoder.resblocks.0.convs2.0")))
    for index in (0, 1):
        act = first.activations[index]
        prefix = f"decoder.resblocks.0.activations.{index}"
        hooks.append(act.upsample.register_forward_hook(output(prefix + ".upsample")))
        hooks.append(act.act.register_forward_hook(output(prefix + ".act")))
        hooks.append(act.register_forward_hook(output(prefix)))
    hooks.append(decoder.activation_post.register_forward_hook(output("decoder.activation_post")))
    hooks.append(decoder.conv_post.register_forward_hook(output("decoder.conv_post")))  # before the clamp
    return hooks


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def write_folder(out_dir, name, overrides, seed, num_latents):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config, model = build_model(overrides, generator)
    randomize(model, generator)
    model.eval()
    rows = torch.randn(2 * num_latents, config["latent_channels"], generator=generator)

    # Scale conv_post so the waveform mostly stays inside the clamp: the golden then checks signal, not +-1.
    records = {}
    hooks = record_intermediates(model, records)
    manual_decode(model, rows, num_latents)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        model.decoder.conv_post.weight_g.mul_(0.4 / records["decoder.conv_post"].std().clamp_min(1e-6))

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "diffusers.safetensors"),
              metadata={"format": "pt", "config": json.dumps(config, sort_keys=True)})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"_class_name": "AutoencoderKLMiniMaxH3Audio", **config}, f, indent=2, sort_keys=True)

    manual = manual_decode(model, rows, num_latents)
    records = {}
    hooks = record_intermediates(model, records)
    source = "pipeline blocks"
    try:
        audio = pipeline_decode(model, rows, num_latents)
    except Exception as error:  # noqa: BLE001 - report and fall back to the written-out tail
        print(f"WARNING {name}: the pipeline blocks failed ({error!r}); using the written-out tail instead")
        records.clear()
        source = "written-out tail"
        audio = manual_decode(model, rows, num_latents)
    for hook in hooks:
        hook.remove()
    pipeline_vs_manual = rel_l2(audio, manual)
    if pipeline_vs_manual != 0.0:
        print(f"WARNING {name}: pipeline blocks and the written-out tail differ (rel-L2 {pipeline_vs_manual:.3e})")

    assert audio.shape == (1, 2, num_latents * model.hop_length), audio.shape
    io = {"in.audio_rows": rows.clone(), "out.waveform": audio[0].clone()}
    io.update({"out." + key: value for key, value in records.items()})
    stats = {
        "source": source,
        "pipeline_vs_written_out_rel_l2": pipeline_vs_manual,
        "num_audio_latents": num_latents,
        "samples": int(audio.shape[-1]),
        "clamped_fraction": float((audio.abs() >= 1.0).double().mean()),
        "waveform_rms": float(audio.double().pow(2).mean().sqrt()),
    }
    if torch.cuda.is_available():  # the reference's own fp32 spread between devices, TF32 off; context only
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            cuda_model = AutoencoderKLMiniMaxH3Audio(**config)
            cuda_model.load_state_dict(state)
            cuda_model = cuda_model.eval().cuda()
            cuda_audio = manual_decode(cuda_model, rows.cuda(), num_latents).cpu()
            stats["cuda_fp32_vs_cpu_rel_l2"] = rel_l2(cuda_audio, audio)
        except Exception as error:  # noqa: BLE001 - a statistic, not a golden: record why it is missing
            stats["cuda_fp32_vs_cpu_rel_l2"] = f"not measured: {error!r}"
    save_file(io, os.path.join(folder, "io_fp32.safetensors"),
              metadata={"stats": json.dumps(stats, sort_keys=True), "torch": torch.__version__})
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/golden")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    stats = {"torch": torch.__version__}
    stats["audio_vae_tiny"] = write_folder(args.out, "audio_vae_tiny", TINY_CONFIG, seed=0, num_latents=5)
    stats["audio_vae_small"] = write_folder(args.out, "audio_vae_small", SMALL_CONFIG, seed=1, num_latents=7)
    total = 0
    for name in ("audio_vae_tiny", "audio_vae_small"):
        folder = os.path.join(args.out, name)
        for file in sorted(os.listdir(folder)):
            size = os.path.getsize(os.path.join(folder, file))
            total += size
            print(f"{name}/{file}: {size} bytes")
    print(json.dumps(stats, indent=2, sort_keys=True))
    print(f"total {total} bytes")
    if total > MAX_TOTAL_BYTES:
        print(f"ERROR: the goldens take {total} bytes, more than {MAX_TOTAL_BYTES}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
