#!/usr/bin/env python3
"""PyTorch peers for `vortex bench`, run by it in the same device call.

    python3 bench/peers/pytorch_h3.py --workload h3-block --io DUMP --out REPORT [--warmup 3 --reps 10]

h3-forward the diffusers MiniMaxH3Transformer3DModel at the canonical shape, eager bf16 with cuDNN
           attention, then with each transformer block torch.compile'd (regional compilation), its
           own random weights (timing only).
h3-block   the reference diffusers MiniMaxH3TransformerBlock (bring diffusers' src as .ref and put it
           on PYTHONPATH) on vortex's dumped weights and inputs: eager bf16 with cuDNN attention, and
           torch.compile of the same block. Checks vortex's output against the eager result.
gemm:MxKxN torch.nn.functional.linear, bf16, y = x w^T.
attention  scaled_dot_product_attention at 37,810 x 56 x 128 (or attention:NxHxD), cuDNN and flash backends.

Protocol as vortex's: warm-ups, then timed repetitions with CUDA events, each after a 256 MB L2
flush; the report holds medians (ms) and, for h3-block, rel-L2 / max-abs of vortex vs the peer.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

L2_FLUSH_BYTES = 256 << 20


def measure(fn, warmup, reps, setup=None):
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        flush.fill_(i & 0xFF)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i >= warmup:
            samples.append(start.elapsed_time(stop))
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "samples_ms": samples}


def compare(ours, reference):
    ours, reference = ours.double(), reference.double()
    diff = ours - reference
    mask = reference.abs() > 1e-3
    return {
        "rel_l2": float(diff.norm() / reference.norm().clamp_min(1e-300)),
        "max_abs": float(diff.abs().max()),
        "max_rel": float((diff.abs()[mask] / reference.abs()[mask]).max()) if mask.any() else 0.0,
    }


def h3_block(args):
    from safetensors.torch import load_file
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

    io = load_file(args.io, device="cuda")
    import safetensors
    with safetensors.safe_open(args.io, "pt") as f:
        config = json.loads(f.metadata()["config"])
    block = MiniMaxH3TransformerBlock(
        hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
        attention_head_dim=config["attention_head_dim"], ffn_dim=config["ffn_dim"],
        time_embed_dim=config["time_embed_dim"], norm_eps=config["norm_eps"], qk_norm_eps=config["qk_norm_eps"])
    weights = {k: v for k, v in io.items() if not k.startswith(("in.", "out."))}
    block.load_state_dict(weights)
    block = block.to(device="cuda", dtype=torch.bfloat16).eval()

    x0 = io["in.x"][None]
    temb = io["in.temb"].float()
    adaln = io["in.adaln_rows"].long()
    rope = (io["in.rope_cos"].float(), io["in.rope_sin"].float())
    reports = []
    with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        reference = block(x0.clone(), temb, adaln, rope)[0]
        correctness = compare(io["out.x"], reference)
        correctness["comparator"] = ("diffusers MiniMaxH3TransformerBlock, PyTorch eager bf16, cuDNN SDPA, "
                                     "same weights and inputs")
        x = x0.clone()
        reports.append({"name": "pytorch-eager-cudnn",
                        **measure(lambda: block(x, temb, adaln, rope), args.warmup, args.reps)})
        compiled = torch.compile(block)
        reports.append({"name": "torch-compile",
                        **measure(lambda: compiled(x, temb, adaln, rope), args.warmup, args.reps)})
    return {"correctness": correctness, "peers": reports}


def h3_forward(args):
    """The diffusers transformer at the canonical shape with its own random bf16 weights: the same
    shapes, layout and attention backend as vortex's forward, timed; no output check is possible
    (vortex's 62 GB of synthetic weights cannot be handed over)."""
    import safetensors
    from safetensors.torch import load_file
    from diffusers import MiniMaxH3Transformer3DModel

    with safetensors.safe_open(args.io, "pt") as f:
        config = json.loads(f.metadata()["config"])
    io = load_file(args.io, device="cuda")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = MiniMaxH3Transformer3DModel(**config).eval()
    torch.set_default_dtype(torch.float32)
    for name, module in model.named_modules():
        if name and any(part in name for part in ("proj_in", "time_embedder", "proj_out", "rope")):
            module.to(torch.float32)
    inputs = {
        "hidden_states": io["in.hidden_states"][None], "audio_hidden_states": io["in.audio_hidden_states"][None],
        "encoder_hidden_states": io["in.encoder_hidden_states"][None], "timestep": io["in.timestep"],
        "timestep_indices": io["in.timestep_indices"], "token_tags": io["in.token_tags"],
        "position_ids": io["in.position_ids"], "video_indices": io["in.video_indices"],
        "audio_indices": io["in.audio_indices"], "text_indices": io["in.text_indices"],
    }
    peers = []
    with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        report = measure(lambda: model(**inputs, return_dict=False), args.warmup, args.reps)
        peers.append({"name": "diffusers-transformer-eager-cudnn (own random weights)", **report})
        # Regional compilation, as PyTorch recommends for stacks of identical layers: each block is
        # compiled in place and the 50 instances share one compiled graph, so only the first call
        # compiles (its time is reported apart; the warm-ups absorb it).
        for block in model.transformer_blocks:
            block.compile()
        start = time.perf_counter()
        model(**inputs, return_dict=False)
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - start
        report = measure(lambda: model(**inputs, return_dict=False), args.warmup, args.reps)
        peers.append({"name": "diffusers-transformer-compiled-blocks (torch.compile per block, own random weights)",
                      "first_call_s (compilation included)": first_call_s, **report})
    return {"peers": peers}


def gemm(args, spec):
    m, k, n = (int(v) for v in spec.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    return {"peers": [{"name": "torch-linear", **measure(lambda: F.linear(x, w), args.warmup, args.reps)}]}


def attention(args, n=37810, heads=56, dim=128):
    q, k, v = (torch.randn(1, heads, n, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    reports = []
    for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel([backend]):
            reports.append({"name": name, **measure(lambda: F.scaled_dot_product_attention(q, k, v),
                                                    args.warmup, args.reps)})
    return {"peers": reports}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--io", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if args.workload == "h3-block":
        report = h3_block(args)
    elif args.workload == "h3-forward":
        report = h3_forward(args)
    elif args.workload.startswith("gemm:"):
        report = gemm(args, args.workload[len("gemm:"):])
    elif args.workload == "attention":
        report = attention(args)
    elif args.workload.startswith("attention:"):
        n, heads, dim = (int(x) for x in args.workload[len("attention:"):].split("x"))
        report = attention(args, n, heads, dim)
    else:
        raise SystemExit(f"unknown workload {args.workload!r}")
    report["torch"] = torch.__version__
    report["cudnn"] = torch.backends.cudnn.version()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
