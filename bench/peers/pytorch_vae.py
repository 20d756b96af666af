#!/usr/bin/env python3
"""PyTorch peers of `vortex bench vae-decode`, run by it in the same device call.

    python3 bench/peers/pytorch_vae.py --workload vae-video|vae-encode|vae-encode-clip|vae-encode-video|vae-audio|vae-audio-encode
                                       --io DUMP --out REPORT
                                       [--warmup 3 --reps 10]

vae-video  diffusers' AutoencoderKLMiniMaxH3 (bring diffusers' src as .ref and put it on PYTHONPATH)
           built from the dump's config (the release's) with the dump's decoder weights (vortex's
           synthetic bf16 weights, widened to the checkpoint's fp32; the encoder, which decoding never
           runs, keeps its random init). It decodes the dump's latents as the pipeline's decode step
           does: de-normalise, `vae.decode` under float16 autocast over fp32 weights (the release's
           verified recipe; tiling on, the release's tiles), ImageNet de-normalisation and clamp.
           Checks vortex's frames against it (both minus the ImageNet mean, so the bound is relative
           to the decoded signal).
vae-encode diffusers' AutoencoderKLMiniMaxH3 with the dump's encoder weights (vortex's synthetic fp32
           weights; the decoder, which encoding never runs, keeps its random init) and the dump's
           tiling (the release's): `vae.encode` of the dump's ImageNet-normalised keyframe pixels
           [1, 3, 1, H, W], as encode_vae_condition calls it; the posterior's moments against
           vortex's. Checked and timed in fp32 with TF32 off, and timed with PyTorch's defaults
           (cuDNN convolutions in TF32) too.
vae-encode-clip  the same on a 17-frame clip [1, 3, 17, H, W] (one clip of a video reference): the fp32
           encode is checked once (its time reported as reference_first_run_ms), the defaults timed.
vae-encode-video  the same as the clip on a 22-frame video [1, 3, 22, H, W]: diffusers' encode pads it
           to two clips with copies of the last frame and drops the trailing latent frames, as vortex.
vae-audio  diffusers' AutoencoderKLMiniMaxH3Audio with the dump's decoder state dict (weight_g /
           weight_v, filters) in fp32: `audio_vae.decode` of the de-normalised latents, with TF32 off
           (the checked run and one timing) and with PyTorch's defaults (cuDNN convolutions in TF32).
vae-audio-encode  the same model with the dump's encoder state dict: the ref2va reference encoder
           step's soundtrack encode (`audio_vae.encode` of the stereo waveform as two mono items, the
           posterior mean, normalised, channel-major rows), on the device, fp32 without TF32 (checked
           and timed) and with PyTorch's defaults.

Protocol as vortex's (measure() of pytorch_h3.py): warm-ups, then timed repetitions with CUDA
events, each after a 256 MB L2 flush. The report holds medians (ms) and rel-L2 / max-abs of vortex
vs the peer.
"""

import argparse
import json

import safetensors
import torch
from safetensors.torch import load_file

from pytorch_h3 import compare, measure

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_dump(path):
    with safetensors.safe_open(path, "pt") as f:
        config = json.loads(f.metadata()["config"])
    io = load_file(path, device="cuda")
    weights = {k: v for k, v in io.items() if not k.startswith(("in.", "out."))}
    return config, io, weights


def constructor_kwargs(config):
    return {k: v for k, v in config.items() if not k.startswith("_")}


def load_decoder(model, weights, encoder_prefixes):
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise SystemExit(f"dump has tensors the model does not: {unexpected[:5]}")
    stray = [k for k in missing if not k.startswith(encoder_prefixes)]
    if stray:
        raise SystemExit(f"dump lacks decoder tensors: {stray[:5]}")


def vae_video(args):
    from diffusers import AutoencoderKLMiniMaxH3

    config, io, weights = load_dump(args.io)
    with torch.device("cuda"):
        vae = AutoencoderKLMiniMaxH3(**constructor_kwargs(config)).eval()
    load_decoder(vae, {k: v.float() for k, v in weights.items()}, ("encoder.", "quant_conv."))
    del weights
    latents = io["in.latents"][None]
    ours = io["out.frames"]
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(config["latents_mean"], device="cuda").view(shape)
    std = torch.tensor(config["latents_std"], device="cuda").view(shape)
    pixel_mean = torch.tensor(IMAGENET_MEAN, device="cuda").view(shape)
    pixel_std = torch.tensor(IMAGENET_STD, device="cuda").view(shape)

    def decode():
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            video = vae.decode(latents * std + mean, return_dict=False)[0]
        return (video.float() * pixel_std + pixel_mean).clamp(0, 1)

    with torch.no_grad():
        reference = decode()
        correctness = compare(ours[None] - pixel_mean, reference - pixel_mean)
        correctness["comparator"] = ("diffusers AutoencoderKLMiniMaxH3.decode, float16 autocast over fp32 "
                                     "weights (the pipeline's recipe), same weights and latents; frames minus "
                                     "the ImageNet mean")
        del reference, ours
        report = measure(decode, args.warmup, args.reps)
    return {"correctness": correctness, "peers": [{"name": "diffusers-vae-fp16-autocast", **report}]}


def vae_encode(args):
    from diffusers import AutoencoderKLMiniMaxH3

    config, io, weights = load_dump(args.io)
    with safetensors.safe_open(args.io, "pt") as f:
        tiling = json.loads(f.metadata()["tiling"])
    with torch.device("cuda"):
        vae = AutoencoderKLMiniMaxH3(**constructor_kwargs(config)).eval()
    missing, unexpected = vae.load_state_dict(weights, strict=False)
    if unexpected:
        raise SystemExit(f"dump has tensors the model does not: {unexpected[:5]}")
    stray = [k for k in missing if k.startswith(("encoder.", "quant_conv."))]
    if stray:
        raise SystemExit(f"dump lacks encoder tensors: {stray[:5]}")
    del weights
    vae.enable_tiling(**tiling)
    pixels = io["in.pixels"][None]
    ours = io["out.moments"][None]

    def encode():
        return vae.encode(pixels, return_dict=False)[0].parameters

    reports = []
    clip = args.workload in ("vae-encode-clip", "vae-encode-video")
    with torch.no_grad():
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        reference = encode()
        stop.record()
        stop.synchronize()
        correctness = compare(ours, reference)
        correctness["comparator"] = ("diffusers AutoencoderKLMiniMaxH3.encode (tiled as the release), fp32 without "
                                     "TF32, same weights and pixels; the posterior's moments")
        correctness["reference_first_run_ms"] = start.elapsed_time(stop)
        if not clip:  # a clip's fp32 encode takes tens of seconds: checked once, not timed 13 times
            reports.append({"name": "diffusers-vae-encode-fp32", **measure(encode, args.warmup, args.reps)})
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
        # What the default's TF32 convolutions cost in accuracy: its moments against the fp32 encode's.
        tf32_error = compare(encode(), reference)
        del reference
        reports.append({"name": "diffusers-vae-encode-default-tf32-convs", "moments_vs_fp32": tf32_error,
                        **measure(encode, args.warmup, args.reps)})
    return {"correctness": correctness, "peers": reports}


def vae_audio(args):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    config, io, weights = load_dump(args.io)
    vae = AutoencoderKLMiniMaxH3Audio(**constructor_kwargs(config)).to("cuda").eval()
    load_decoder(vae, weights, ("encoder.", "pre_block.", "mean_proj.", "logs_proj."))
    # vortex's latents are time-major [2, A, C]; the pipeline's decode step takes [2, C, A].
    latents = io["in.latents"].permute(0, 2, 1).contiguous()
    ours = io["out.waveform"]
    mean = torch.tensor(config["latents_mean"], device="cuda").view(1, -1, 1)
    std = torch.tensor(config["latents_std"], device="cuda").view(1, -1, 1)

    def decode():
        return vae.decode(latents * std + mean, return_dict=False)[0]

    reports = []
    with torch.no_grad():
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        reference = decode()[:, 0]
        correctness = compare(ours, reference)
        correctness["comparator"] = ("diffusers AutoencoderKLMiniMaxH3Audio.decode, fp32 without TF32, same weights "
                                     "and latents")
        reports.append({"name": "diffusers-audio-vae-fp32", **measure(decode, args.warmup, args.reps)})
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
        reports.append({"name": "diffusers-audio-vae-default-tf32-convs", **measure(decode, args.warmup, args.reps)})
    return {"correctness": correctness, "peers": reports}


def vae_audio_encode(args):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    config, io, weights = load_dump(args.io)
    vae = AutoencoderKLMiniMaxH3Audio(**constructor_kwargs(config)).to("cuda").eval()
    missing, unexpected = vae.load_state_dict(weights, strict=False)
    if unexpected:
        raise SystemExit(f"dump has tensors the model does not: {unexpected[:5]}")
    stray = [k for k in missing if not k.startswith(("dec_in_proj.", "decoder."))]
    if stray:
        raise SystemExit(f"dump lacks encoder tensors: {stray[:5]}")
    del weights
    waveform = io["in.waveform"]
    ours = io["out.rows"]
    channels = config["latent_channels"]
    mean = torch.tensor(config["latents_mean"], device="cuda").view(1, 1, -1)
    std = torch.tensor(config["latents_std"], device="cuda").view(1, 1, -1)

    def encode():
        posterior = vae.encode(waveform[:, None], return_dict=False)[0]
        latents = posterior.mode().float().transpose(1, 2)
        return ((latents - mean) / std).reshape(-1, channels)

    reports = []
    with torch.no_grad():
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        correctness = compare(ours, encode())
        correctness["comparator"] = ("diffusers AutoencoderKLMiniMaxH3Audio.encode as the ref2va reference encoder "
                                     "step runs it, fp32 without TF32, same weights and waveform; normalised rows")
        reports.append({"name": "diffusers-audio-encode-fp32", **measure(encode, args.warmup, args.reps)})
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
        reports.append({"name": "diffusers-audio-encode-default-tf32-convs", **measure(encode, args.warmup, args.reps)})
    return {"correctness": correctness, "peers": reports}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True,
                        choices=["vae-video", "vae-encode", "vae-encode-clip", "vae-encode-video", "vae-audio",
                                 "vae-audio-encode"])
    parser.add_argument("--io", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    report = {"vae-video": vae_video, "vae-encode": vae_encode, "vae-encode-clip": vae_encode,
              "vae-encode-video": vae_encode, "vae-audio": vae_audio,
              "vae-audio-encode": vae_audio_encode}[args.workload](args)
    report["torch"] = torch.__version__
    report["cudnn"] = torch.backends.cudnn.version()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
