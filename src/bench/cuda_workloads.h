// `vortex bench` workloads on one GPU (DESIGN section 4).
//
//   h3-block   one transformer block at the canonical shape (37,810 rows, synthetic weights)
//   gemm       the four block GEMMs at the canonical shape (QKV, out, FC1, FC2), one manifest each
//   attention  exact attention, 37,810 x 56 heads x 128
//   h3-forward, h3-denoise  the whole model per recipe (cuda_model_workloads.cc)
//   vae-decode, vae-encode, text-encode, vision-encode  the VAE decoders, the video VAE encoder,
//              the text encoder and the vision
//              tower (cuda_vae_workloads.cc, cuda_text_workloads.cc, cuda_vision_workloads.cc)
//   lora-merge  a LoRA adapter switch per block (cuda_lora_workloads.cc)
//   weight-load one block's weights from a quantized checkpoint onto the device (cuda_load_workloads.cc)
//
// Protocol: warm-ups, then timed repetitions, each preceded by an L2 flush (a 256 MB memset, four
// times the H200's 60 MB L2) and timed with CUDA events around the measured work only; the median
// is primary. Peers (PyTorch eager and torch.compile of the same computation) run as a child
// process in the same call, read the inputs vortex dumped, check vortex's output, time themselves
// with the same protocol and report back; their medians enter the manifest as ratios.
#pragma once

#include <string>
#include <vector>

#include "bench/manifest.h"
#include "vortex/status.h"

namespace vortex::bench {

struct BenchOptions {
  std::string workload;
  int warmup = 3;
  int repetitions = 10;
  uint64_t seed = 0;
  std::string work_dir = "/tmp/vortex-bench";  // dumps for peers
  std::string peer_command;                    // e.g. "python3 bench/peers/pytorch_h3.py"; empty: no peer
  std::string git_commit = "unknown";
};

const std::vector<std::string>& cuda_workload_names();
// One manifest per measured item (gemm yields four).
Result<std::vector<Manifest>> run_cuda_workload(const BenchOptions& options);
// `vae-decode`: the canonical video and audio VAE decodes, one manifest each; `vae-encode`: the
// video VAE encoder on one canonical keyframe and one clip, and the audio VAE encoder on one soundtrack
// (vae-encode-keyframe, -clip, -audio run one of them) (cuda_vae_workloads.cc).
Result<std::vector<Manifest>> run_vae_workload(const BenchOptions& options);
// `text-encode`: the Qwen3-VL text encoder at the released widths, two prompt lengths
// (cuda_text_workloads.cc).
Result<std::vector<Manifest>> run_text_workload(const BenchOptions& options);
// `vision-encode`: the Qwen3-VL vision tower at the released widths on one canonical keyframe
// (cuda_vision_workloads.cc).
Result<std::vector<Manifest>> run_vision_workload(const BenchOptions& options);
// `lora-merge`: a LoRA switch per transformer block at the released widths, merged on the device,
// against the host merge it replaced (cuda_lora_workloads.cc).
Result<std::vector<Manifest>> run_lora_workload(const BenchOptions& options);
// `weight-load`: one transformer block's linears loaded from an fp8, NVFP4 or bf16 checkpoint, the
// quantized ones dequantized on the device against the host (cuda_load_workloads.cc).
Result<std::vector<Manifest>> run_load_workload(const BenchOptions& options);

}  // namespace vortex::bench
