// The kernel-level workloads of `vortex bench`: the four block GEMMs and exact attention at the
// canonical shape. Correctness is checked against the CPU reference on sampled rows (the full
// products are too large for the CPU), peers time PyTorch on the same shapes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/timeline_json.h"
#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "cuda/attention.h"
#include "cuda/attention_int8fp8.h"
#include "cuda/attention_wgmma.h"
#include "cuda/attention_wgmma_v2.h"
#include "cuda/gemm.h"
#include "cuda/synthetic_fill.h"
#include "formats/safetensors.h"
#include "models/h3/tensor_views.h"

namespace vortex::bench {

namespace {

constexpr int64_t kRows = 37810;  // the canonical packed sequence
constexpr int64_t kSampledRows = 64;

// Rows [0, k) of a host tensor spread evenly over a device tensor: downloads `k` rows.
Result<Tensor> download_rows(const Tensor& device, const std::vector<int64_t>& rows) {
  const int64_t width = device.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), width}, device.dtype());
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(device.dtype());
  for (size_t i = 0; i < rows.size(); ++i) {
    VORTEX_CUDA_CHECK(cudaMemcpy(static_cast<char*>(out.data()) + i * row_bytes,
                                 static_cast<const char*>(device.data()) + rows[i] * device.strides()[0] *
                                     static_cast<int64_t>(dtype_size(device.dtype())),
                                 row_bytes, cudaMemcpyDeviceToHost));
  }
  return out;
}

std::vector<int64_t> sampled_rows(int64_t n, int64_t k) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < k; ++i) rows.push_back(i * (n - 1) / std::max<int64_t>(k - 1, 1));
  return rows;
}

Manifest base_manifest(const BenchOptions& o, const std::string& name, const Samples& samples, double flops) {
  Manifest m;
  m.workload = name;
  m.samples = samples;
  m.derived = {{"tflops", flops / (samples.median() * 1e-3) / 1e12}, {"flops", flops}};
  m.protocol = protocol_json(o);
  return m;
}

}  // namespace

Result<std::vector<Manifest>> bench_gemm(const BenchOptions& o) {
  struct Shape3 {
    const char* name;
    int64_t in, out;
  };
  const Shape3 shapes[] = {{"qkv", 5376, 3 * 7168}, {"out", 7168, 5376}, {"fc1", 5376, 2 * 14336}, {"fc2", 14336, 5376}};
  std::vector<Manifest> manifests;
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(nlohmann::json env, environment_json(o));
  for (const Shape3& s : shapes) {
    const size_t bytes = static_cast<size_t>((kRows * s.in + s.out * s.in + kRows * s.out) * 2) + 4096 + (64u << 20);
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create(bytes));
    VORTEX_ASSIGN_OR_RETURN(Tensor x, arena.alloc({kRows, s.in}, DType::kBF16));
    VORTEX_ASSIGN_OR_RETURN(Tensor w, arena.alloc({s.out, s.in}, DType::kBF16));
    VORTEX_ASSIGN_OR_RETURN(Tensor y, arena.alloc({kRows, s.out}, DType::kBF16));
    VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(x, o.seed, 200, 1.0f, nullptr));
    VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(w, o.seed, 201, 1.0f / std::sqrt(float(s.in)), nullptr));
    VORTEX_ASSIGN_OR_RETURN(auto gemm, cuda::GemmRunner::create(arena));
    auto body = [&]() { return gemm->linear(x.view(), w.view(), nullptr, y.view(), nullptr); };
    VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
    Manifest m = base_manifest(o, std::string("gemm-") + s.name, samples, 2.0 * kRows * s.in * s.out);
    m.workload_section = {{"name", m.workload}, {"m", kRows}, {"k", s.in}, {"n", s.out}, {"dtype", "bf16"},
                          {"out_dtype", "bf16"}, {"layout", "y[M,N] = x[M,K] w[N,K]^T"}, {"seed", o.seed}};
    m.environment = env;
    m.implementation = {{"backend", "cuda"}, {"gemm", "cuBLASLt bf16, fp32 accumulate, heuristic algo"}};
    // Correctness on sampled rows against the CPU reference GEMM.
    const std::vector<int64_t> rows = sampled_rows(kRows, kSampledRows);
    VORTEX_ASSIGN_OR_RETURN(Tensor xs, download_rows(x, rows));
    VORTEX_ASSIGN_OR_RETURN(Tensor ys, download_rows(y, rows));
    VORTEX_ASSIGN_OR_RETURN(Tensor wh, cuda::download(w, nullptr));
    Tensor ref = Tensor::empty({kSampledRows, s.out}, DType::kF32);
    VORTEX_RETURN_IF_ERROR(cpu::linear(xs.view(), wh.view(), nullptr, ref.view()));
    m.correctness = compare(ys, ref, "CPU reference linear (fp32) on 64 sampled rows", 1e-2);
    if (!o.peer_command.empty()) {
      VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer,
                              run_peer(o, std::string("gemm:") + std::to_string(kRows) + "x" + std::to_string(s.in) +
                                              "x" + std::to_string(s.out),
                                       ""));
      add_peer_ratios(m, peer);
    }
    manifests.push_back(std::move(m));
  }
  return manifests;
}

namespace {

struct AttentionShape {
  int64_t n, heads;
  const char* suffix;  // workload name suffix: the canonical shape has none
};

// Registers, spills and shared memory of the kernel that runs, as the manifest reports them.
nlohmann::json resources_json(const cuda::KernelResources& r) {
  return {{"registers_per_thread", r.registers},
          {"spill_bytes_per_thread", r.local_bytes},
          {"shared_bytes", r.static_shared_bytes + r.dynamic_shared_bytes},
          {"threads", r.max_threads}};
}

// A clustered kernel's resources and how many CTAs share each K / V load (TMA multicast).
nlohmann::json clustered_resources_json(const cuda::KernelResources& r, int cluster_ctas) {
  nlohmann::json j = resources_json(r);
  j["cluster_ctas"] = cluster_ctas;
  return j;
}

Result<nlohmann::json> exact_kernel_resources(cuda::AttentionVariant variant, int64_t n, int64_t heads) {
  cuda::KernelResources r;
  switch (variant) {
    case cuda::AttentionVariant::kV1: {
      const int cluster_ctas = cuda::attention_wgmma_cluster_ctas(n, n, heads);
      VORTEX_ASSIGN_OR_RETURN(r, cuda::attention_wgmma_resources(cluster_ctas));
      return clustered_resources_json(r, cluster_ctas);
    }
    case cuda::AttentionVariant::kV2: {
      VORTEX_ASSIGN_OR_RETURN(r, cuda::attention_v2_resources(n));
      break;
    }
    case cuda::AttentionVariant::kV2Keys128: {
      VORTEX_ASSIGN_OR_RETURN(r, cuda::attention_v2_resources(n, cuda::V2KeyTiles::kOfV1));
      break;
    }
    case cuda::AttentionVariant::kV0:
      return nlohmann::json("see v0 (mma.sync) in src/cuda/attention.cu");
  }
  return resources_json(r);
}

}  // namespace

// Both attention modes at the canonical shape and at a short one (4,608 × 24 heads, where a
// faster long-sequence kernel must not lose), each against cuDNN and flash from the PyTorch peer
// in the same run. The int8fp8 manifests also state the mode's error against the exact kernel's
// output on the same N(0,1) inputs (every element, rel-L2 and cosine).
Result<std::vector<Manifest>> bench_attention(const BenchOptions& o) {
  const int64_t D = 128;
  const AttentionShape shapes[] = {{kRows, 56, ""}, {4608, 24, "-4608x24"}};
  VORTEX_ASSIGN_OR_RETURN(const cuda::AttentionVariant variant, cuda::attention_variant_from_env());
  VORTEX_ASSIGN_OR_RETURN(const int timeline_launches, timeline_launches_from_env());
  VORTEX_ASSIGN_OR_RETURN(const int timeline_cluster, timeline_cluster_from_env());
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(nlohmann::json env, environment_json(o));
  std::vector<Manifest> manifests;
  for (const AttentionShape& shape : shapes) {
    const int64_t N = shape.n, H = shape.heads;
    const size_t bytes = static_cast<size_t>(N * 5 * H * D * 2) + 4096;
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create(bytes));
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena scratch,
                            cuda::DeviceArena::create(cuda::int8fp8_workspace_bytes(N, N, H) + 4096));
    // q, k, v as column slices of one fused [N, 3·H·D] buffer, as the block produces them.
    VORTEX_ASSIGN_OR_RETURN(Tensor qkv, arena.alloc({N, 3 * H * D}, DType::kBF16));
    VORTEX_ASSIGN_OR_RETURN(Tensor out_exact, arena.alloc({N, H * D}, DType::kBF16));
    VORTEX_ASSIGN_OR_RETURN(Tensor out_int8fp8, arena.alloc({N, H * D}, DType::kBF16));
    VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(qkv, o.seed, 300, 1.0f, nullptr));
    // Views of column slices: [N, H, D] with the buffer's row stride.
    auto heads = [&](const Tensor& t, int64_t column) { return h3::heads_view(t, column, H, D); };
    const TensorView q = heads(qkv, 0), k = heads(qkv, H * D), v = heads(qkv, 2 * H * D);
    const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));
    const nlohmann::json workload = {{"n", N}, {"heads", H}, {"head_dim", D}, {"causal", false}, {"dtype", "bf16"},
                                     {"qkv_layout", "column slices of a fused [N, 3*H*D] buffer"},
                                     {"inputs", "N(0,1)"}, {"seed", o.seed}};
    const double flops = 4.0 * N * N * H * D;

    auto exact = [&]() { return cuda::attention(q, k, v, heads(out_exact, 0), scale, nullptr); };
    VORTEX_ASSIGN_OR_RETURN(Samples exact_samples, timer->measure(o, nullptr, exact));
    Manifest m_exact = base_manifest(o, std::string("attention") + shape.suffix, exact_samples, flops);
    m_exact.workload_section = workload;
    m_exact.workload_section["name"] = m_exact.workload;
    m_exact.environment = env;
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json exact_resources, exact_kernel_resources(variant, N, H));
    m_exact.implementation = {{"backend", "cuda"}, {"mode", "exact"},
                              {"attention", cuda::attention_variant_description(variant)},
                              {"kernel", exact_resources}};

    auto int8fp8 = [&]() {
      return cuda::attention_int8fp8(q, k, v, heads(out_int8fp8, 0), scale, scratch, nullptr);
    };
    VORTEX_ASSIGN_OR_RETURN(Samples int8fp8_samples, timer->measure(o, nullptr, int8fp8));
    // The mode's two passes timed apart (medians), to tell the quantize pass's share at each shape.
    const size_t split_mark = scratch.mark();
    VORTEX_ASSIGN_OR_RETURN(const cuda::Int8Fp8Workspace split_ws, cuda::int8fp8_workspace(scratch, N, N, H));
    VORTEX_ASSIGN_OR_RETURN(Samples quantize_samples, timer->measure(o, nullptr, [&]() {
      return cuda::quantize_int8fp8(q, k, v, split_ws, nullptr);
    }));
    VORTEX_ASSIGN_OR_RETURN(Samples pass_samples, timer->measure(o, nullptr, [&]() {
      return cuda::attention_int8fp8_quantized(split_ws, heads(out_int8fp8, 0), scale, nullptr);
    }));
    scratch.release_to(split_mark);
    Manifest m_int8 = base_manifest(o, std::string("attention-int8fp8") + shape.suffix, int8fp8_samples, flops);
    const int int8fp8_cluster_ctas = cuda::attention_int8fp8_cluster_ctas(N, N, H);
    VORTEX_ASSIGN_OR_RETURN(const cuda::KernelResources int8fp8_resources,
                            cuda::attention_int8fp8_resources(int8fp8_cluster_ctas));
    m_int8.derived["quantize_pass_ms"] = quantize_samples.median();
    m_int8.derived["attention_pass_ms"] = pass_samples.median();
    m_int8.workload_section = workload;
    m_int8.workload_section["name"] = m_int8.workload;
    m_int8.environment = env;
    m_int8.implementation = {{"backend", "cuda"}, {"mode", "int8fp8"},
                             {"attention", "int8 QK^T and e4m3 PV wgmma (src/cuda/attention_int8fp8.cu), row sums "
                                           "of the e4m3 weights from the tensor core; time includes the quantize pass"},
                             {"kernel", clustered_resources_json(int8fp8_resources, int8fp8_cluster_ctas)}};

    // Correctness: both outputs against the CPU's exact attention for 16 sampled query rows (all
    // heads); the quantized mode against its own bound, and against the exact kernel everywhere.
    VORTEX_RETURN_IF_ERROR(exact());
    VORTEX_RETURN_IF_ERROR(int8fp8());
    VORTEX_ASSIGN_OR_RETURN(Tensor qkv_host, cuda::download(qkv, nullptr));
    const std::vector<int64_t> rows = sampled_rows(N, 16);
    Tensor q_rows = Tensor::empty({16, H, D}, DType::kBF16);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(static_cast<char*>(q_rows.data()) + i * H * D * 2,
                  static_cast<const char*>(qkv_host.data()) + rows[i] * 3 * H * D * 2, H * D * 2);
    }
    Tensor ref = Tensor::empty({16, H, D}, DType::kF32);
    VORTEX_RETURN_IF_ERROR(cpu::attention(q_rows.view(), heads(qkv_host, H * D), heads(qkv_host, 2 * H * D), ref.view(),
                                          scale));
    VORTEX_ASSIGN_OR_RETURN(Tensor ref2, ref.reshape({16, H * D}));
    VORTEX_ASSIGN_OR_RETURN(Tensor got_exact, download_rows(out_exact, rows));
    VORTEX_ASSIGN_OR_RETURN(Tensor got_int8, download_rows(out_int8fp8, rows));
    m_exact.correctness =
        compare(got_exact, ref2, "CPU reference attention (fp32) on 16 sampled query rows, all heads", 1e-2);
    m_int8.correctness = compare(got_int8, ref2,
                                 "CPU exact attention (fp32) on 16 sampled query rows, all heads; the int8fp8 "
                                 "mode's bound",
                                 0.06);
    VORTEX_ASSIGN_OR_RETURN(Tensor all_exact, cuda::download(out_exact, nullptr));
    VORTEX_ASSIGN_OR_RETURN(Tensor all_int8, cuda::download(out_int8fp8, nullptr));
    m_int8.derived["error_vs_exact"] = error_json(all_int8, all_exact);
    m_int8.derived["error_vs_exact"]["inputs"] = "N(0,1) q, k, v; every output element";
    if (timeline_launches > 0) {
      if (variant == cuda::AttentionVariant::kV1) {
        const auto launch = [&]() {
          return cuda::attention_wgmma_timeline(q, k, v, heads(out_exact, 0), scale, nullptr, timeline_cluster);
        };
        VORTEX_ASSIGN_OR_RETURN(m_exact.derived["timeline"], repeated_timeline_json(timeline_launches, launch));
      }
      const size_t mark = scratch.mark();
      VORTEX_ASSIGN_OR_RETURN(const cuda::Int8Fp8Workspace ws, cuda::int8fp8_workspace(scratch, N, N, H));
      VORTEX_RETURN_IF_ERROR(cuda::quantize_int8fp8(q, k, v, ws, nullptr));
      const auto launch = [&]() {
        return cuda::attention_int8fp8_timeline(ws, heads(out_int8fp8, 0), scale, nullptr, timeline_cluster);
      };
      VORTEX_ASSIGN_OR_RETURN(m_int8.derived["timeline"], repeated_timeline_json(timeline_launches, launch));
      scratch.release_to(mark);
    }
    if (!o.peer_command.empty()) {
      VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "attention:" + std::to_string(N) + "x" +
                                                                    std::to_string(H) + "x" + std::to_string(D),
                                                            ""));
      add_peer_ratios(m_exact, peer);
      add_peer_ratios(m_int8, peer);
    }
    manifests.push_back(std::move(m_exact));
    manifests.push_back(std::move(m_int8));
  }
  return manifests;
}

}  // namespace vortex::bench
