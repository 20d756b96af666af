#include "bench/cuda_bench_util.h"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/cuda_gpu_monitor.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "models/h3/generate.h"

namespace vortex::bench {

Result<std::unique_ptr<Timer>> Timer::create() {
  std::unique_ptr<Timer> t(new Timer());
  VORTEX_ASSIGN_OR_RETURN(t->flush_arena_, cuda::DeviceArena::create(kL2FlushBytes + 512));
  VORTEX_ASSIGN_OR_RETURN(t->flush_, t->flush_arena_.alloc({static_cast<int64_t>(kL2FlushBytes)}, DType::kU8));
  VORTEX_CUDA_CHECK(cudaEventCreate(&t->start_));
  VORTEX_CUDA_CHECK(cudaEventCreate(&t->stop_));
  return t;
}

Timer::~Timer() {
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
}

Result<Samples> Timer::measure(const BenchOptions& o, const std::function<Status()>& setup,
                               const std::function<Status()>& body) {
  Samples samples;
  std::unique_ptr<GpuMonitor> monitor;
  for (int i = 0; i < o.warmup + o.repetitions; ++i) {
    if (i == o.warmup) {
      int device = 0;
      VORTEX_CUDA_CHECK(cudaGetDevice(&device));
      monitor = GpuMonitor::start(device);
    }
    if (setup) VORTEX_RETURN_IF_ERROR(setup());
    VORTEX_CUDA_CHECK(cudaMemsetAsync(flush_.data(), i & 0xFF, kL2FlushBytes, nullptr));
    VORTEX_CUDA_CHECK(cudaEventRecord(start_, nullptr));
    VORTEX_RETURN_IF_ERROR(body());
    VORTEX_CUDA_CHECK(cudaEventRecord(stop_, nullptr));
    VORTEX_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    VORTEX_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    if (i >= o.warmup) samples.ms.push_back(ms);
  }
  if (monitor) samples.gpu = monitor->stop();
  return samples;
}

nlohmann::json protocol_json(const BenchOptions& o) {
  return {{"warmup", o.warmup},
          {"repetitions", o.repetitions},
          {"timer", "cuda_events"},
          {"l2_flush", {{"method", "cudaMemsetAsync before each repetition"}, {"bytes", kL2FlushBytes}}},
          {"primary", "median"}};
}

Result<nlohmann::json> environment_json(const BenchOptions& o) {
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::device_info());
  return nlohmann::json{{"gpu", info.name},
                        {"sm_count", info.sm_count},
                        {"compute_capability", std::to_string(info.major) + "." + std::to_string(info.minor)},
                        {"sm_clock_max_mhz", info.clock_khz / 1000},
                        {"memory_clock_max_mhz", info.memory_clock_khz / 1000},
                        {"memory_bytes", info.total_memory},
                        {"driver_version", info.driver_version},
                        {"cuda_runtime_version", info.runtime_version},
                        {"cublaslt_version", cublasLtGetVersion()},
                        {"cudnn", "not used by vortex"},
                        {"nccl", "not used (single GPU)"},
                        {"git_commit", o.git_commit}};
}

// rel-L2 / max-abs / max-rel of `a` against the reference `b` (host tensors, any float dtype).
double cosine_similarity(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

nlohmann::json error_json(const Tensor& a, const Tensor& reference) {
  const Correctness c = compare(a, reference, "", 1.0);
  return {{"rel_l2", c.rel_l2}, {"max_abs", c.max_abs}, {"cosine", cosine_similarity(a, reference)}};
}

nlohmann::json checksum_json(const Tensor& t) {
  const h3::LatentChecksum c = h3::latent_checksum(t);
  return {{"sha256", c.sha256}, {"sum", c.sum}};
}

Result<size_t> device_bytes_in_use() {
  size_t free_bytes = 0, total_bytes = 0;
  VORTEX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

Correctness compare(const Tensor& a, const Tensor& b, const std::string& comparator, double bound) {
  Correctness c;
  c.comparator = comparator;
  c.bound = bound;
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    num += (x - y) * (x - y);
    den += y * y;
    c.max_abs = std::max(c.max_abs, std::abs(x - y));
    if (std::abs(y) > 1e-3) c.max_rel = std::max(c.max_rel, std::abs(x - y) / std::abs(y));
  }
  c.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  c.passed = c.rel_l2 <= bound && std::isfinite(c.rel_l2);
  return c;
}

// Runs the peer for `workload`; returns its JSON report (see bench/peers/pytorch_h3.py).
Result<nlohmann::json> run_peer(const BenchOptions& o, const std::string& workload, const std::string& io_path) {
  if (o.peer_command.empty()) return nlohmann::json();
  std::error_code ignored;
  std::filesystem::create_directories(o.work_dir, ignored);
  const std::string report = o.work_dir + "/peer_" + workload + ".json";
  std::ostringstream cmd;
  cmd << o.peer_command << " --workload '" << workload << "' --out '" << report << "' --warmup " << o.warmup
      << " --reps " << o.repetitions;
  if (!io_path.empty()) cmd << " --io '" << io_path << "'";
  std::fprintf(stderr, "vortex bench: running peer: %s\n", cmd.str().c_str());
  // A failing peer does not void vortex's own measurement: the manifest records the failure.
  if (std::system(cmd.str().c_str()) != 0) return nlohmann::json{{"error", "peer command failed: " + cmd.str()}};
  std::ifstream in(report);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded()) return nlohmann::json{{"error", report + ": peer report is not JSON"}};
  return json;
}

void add_peer_ratios(Manifest& m, const nlohmann::json& peer) {
  if (peer.is_object() && peer.contains("error")) m.peers.push_back({{"error", peer["error"]}});
  if (!peer.is_object() || !peer.contains("peers")) return;
  const double ours = m.samples.median();
  for (const auto& p : peer["peers"]) {
    nlohmann::json entry = p;
    entry["ratio_peer_over_vortex"] = p["median_ms"].get<double>() / ours;
    m.peers.push_back(entry);
  }
}

Result<BlockFusions> block_fusions_from_env() {
  const char* v = std::getenv("VORTEX_VARIANT_BLOCK");
  if (v == nullptr || *v == '\0' || std::string(v) == "folded") return BlockFusions{};
  if (std::string(v) == "fused") return BlockFusions{true, false};
  if (std::string(v) == "unfused") return BlockFusions{false, false};
  return invalid_argument(std::string("VORTEX_VARIANT_BLOCK: '") + v + "' (expected folded, fused or unfused)");
}

std::string fusions_description(const BlockFusions& fusions) {
  if (!fusions.fused_norms) return "none (separate launches)";
  std::string d =
      "residual + RMSNorm + AdaLN modulation in one pass; QK RMSNorm + RoPE in one pass (bitwise equal to the "
      "separate launches)";
  if (fusions.fold_ffn_residual) d += "; each block's FFN residual applied by the next block's first norm";
  return d;
}

std::vector<BlockLinear> block_linears(const h3::H3Config& c) {
  const std::string p = "transformer_blocks.0.";
  const int64_t C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim;
  return {{p + "attn.to_q", inner, C},     {p + "attn.to_k", inner, C},     {p + "attn.to_v", inner, C},
          {p + "attn.to_out.0", C, inner}, {p + "ff.net.0.proj", 2 * F, C}, {p + "ff.net.2", C, F}};
}

Tensor normal_f32(const Shape& shape, uint64_t seed, float stddev, float mean) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data_as<float>();
  parallel_for(0, t.numel(), [&](int64_t begin, int64_t end) {
    fill_normal(p + begin, end - begin, seed, /*stream=*/0, begin);
    for (int64_t i = begin; i < end; ++i) p[i] = mean + stddev * p[i];
  }, int64_t{1} << 16);
  return t;
}

Result<std::pair<Tensor, Tensor>> concatenated_bf16(const std::vector<Tensor>& got, const h3::NamedTensors& want) {
  int64_t total = 0;
  for (const Tensor& t : got) total += t.numel();
  Tensor got_all = Tensor::empty({total}, DType::kBF16), want_all = Tensor::empty({total}, DType::kBF16);
  for (size_t i = 0, at = 0; i < got.size(); at += got[i].nbytes(), ++i) {
    if (got[i].dtype() != DType::kBF16 || want[i].second.dtype() != DType::kBF16 ||
        want[i].second.numel() != got[i].numel()) {
      return invalid_argument("concatenated_bf16: tensor " + std::to_string(i) + " is not BF16 of the same size on both sides");
    }
    VORTEX_ASSIGN_OR_RETURN(const Tensor t, cuda::download(got[i], nullptr));
    std::memcpy(static_cast<char*>(got_all.data()) + at, t.data(), t.nbytes());
    std::memcpy(static_cast<char*>(want_all.data()) + at, want[i].second.contiguous().data(), t.nbytes());
  }
  return std::pair{got_all, want_all};
}

}  // namespace vortex::bench
