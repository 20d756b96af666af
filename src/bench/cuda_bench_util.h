// Shared pieces of the CUDA bench workloads: the event timer with L2 flush, the manifest
// sections every workload fills the same way, output comparison, and the peer subprocess.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "bench/cuda_workloads.h"
#include "bench/manifest.h"
#include "cuda/runtime.h"
#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::bench {

constexpr size_t kL2FlushBytes = 256u << 20;

class Timer {
 public:
  static Result<std::unique_ptr<Timer>> create();
  ~Timer();
  // For each of warm-ups + repetitions: setup (untimed), L2 flush, CUDA events around body. The
  // SM clock and power are sampled over the timed repetitions (Samples::gpu).
  Result<Samples> measure(const BenchOptions& o, const std::function<Status()>& setup,
                          const std::function<Status()>& body);

 private:
  cuda::DeviceArena flush_arena_;
  Tensor flush_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

nlohmann::json protocol_json(const BenchOptions& o);
Result<nlohmann::json> environment_json(const BenchOptions& o);
// rel-L2 / max-abs / max-rel of `a` against the reference `b` (host tensors, any float dtype).
Correctness compare(const Tensor& a, const Tensor& b, const std::string& comparator, double bound);
// Cosine similarity of two host tensors with the same element count (any float dtype), in fp64.
double cosine_similarity(const Tensor& a, const Tensor& b);
// How far `a` is from `reference` (host tensors), as manifests state an approximate path's error:
// {rel_l2, max_abs, cosine}.
nlohmann::json error_json(const Tensor& a, const Tensor& reference);
// {sha256, sum} of a host tensor's bytes and values: the output's bits as a manifest records them,
// so that runs of two builds can be held bitwise equal (tools/bench/checksum_history.py, ab_summary.py).
nlohmann::json checksum_json(const Tensor& t);
// Device memory in use (cudaMemGetInfo: total - free), the CUDA context included.
Result<size_t> device_bytes_in_use();
// Runs the peer for `workload` on the dumped inputs; an empty JSON when no peer is configured.
Result<nlohmann::json> run_peer(const BenchOptions& o, const std::string& workload, const std::string& io_path);
// Appends the peer's entries with ratio_peer_over_vortex = peer median / vortex median.
void add_peer_ratios(Manifest& m, const nlohmann::json& peer);

// One transformer block's six linears at `config`'s widths, by their diffusers names under
// transformer_blocks.0 (the lora-merge and weight-load workloads).
struct BlockLinear {
  std::string name;  // without ".weight"
  int64_t out, in;
};
std::vector<BlockLinear> block_linears(const h3::H3Config& config);
// Counter-based N(mean, stddev²) values in a host F32 tensor, made on every core (a block's 385M
// weights would take seconds on one).
Tensor normal_f32(const Shape& shape, uint64_t seed, float stddev, float mean = 0.0f);
// The device tensors `got` (downloaded) and the host tensors `want`, each list concatenated in order
// into one host BF16 tensor: both sides of one compare().
Result<std::pair<Tensor, Tensor>> concatenated_bf16(const std::vector<Tensor>& got, const h3::NamedTensors& want);

// The block-boundary fusions of a bench's model (h3::CudaModelOptions::fused_norms and
// fold_ffn_residual), from VORTEX_VARIANT_BLOCK for A/B runs: "folded" or unset is the default,
// the fused kernels with each block's FFN residual applied by the next block's first norm (where
// AdaLN tables are per request); "fused" leaves the FFN residual as its own pass; "unfused" runs
// the norms, modulations and residuals as separate launches (the path the fusions are proven
// bitwise equal to).
struct BlockFusions {
  bool fused_norms = true;
  bool fold_ffn_residual = true;
};
Result<BlockFusions> block_fusions_from_env();
std::string fusions_description(const BlockFusions& fusions);

}  // namespace vortex::bench
