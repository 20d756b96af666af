// The kernel-level workloads of `vortex bench`: the four block GEMMs and exact attention at the
// canonical shape. Correctness is checked against the CPU reference on sampled rows (the full
// products are too large for the CPU), peers time PyTorch on the same shapes.
#include <cmath>
#include <filesystem>

#include "bench/cuda_bench_util.h"
#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "cuda/attention.h"
#include "cuda/gemm.h"
#include "cuda/synthetic_fill.h"
#include "formats/safetensors.h"

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

Result<std::vector<Manifest>> bench_attention(const BenchOptions& o) {
  const int64_t H = 56, D = 128;
  const size_t bytes = static_cast<size_t>(kRows * 4 * H * D * 2) + 4096;
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create(bytes));
  // q, k, v as column slices of one fused [N, 3·H·D] buffer, as the block produces them.
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv, arena.alloc({kRows, 3 * H * D}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(Tensor out, arena.alloc({kRows, H * D}, DType::kBF16));
  VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(qkv, o.seed, 300, 1.0f, nullptr));
  auto heads = [&](const Tensor& t, int64_t column) {
    TensorView v = t.view();
    v.data = static_cast<char*>(v.data) + column * 2;
    v.shape = Shape({kRows, H, D});
    v.strides = Shape({t.strides()[0], D, 1});
    return v;
  };
  const float scale = static_cast<float>(1.0 / std::sqrt(double(D)));
  auto body = [&]() { return cuda::attention(heads(qkv, 0), heads(qkv, H * D), heads(qkv, 2 * H * D), heads(out, 0), scale, nullptr); };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
  Manifest m = base_manifest(o, "attention", samples, 4.0 * kRows * kRows * H * D);
  m.workload_section = {{"name", "attention"}, {"n", kRows}, {"heads", H}, {"head_dim", D}, {"causal", false},
                        {"dtype", "bf16"}, {"qkv_layout", "column slices of a fused [N, 3*H*D] buffer"},
                        {"seed", o.seed}};
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  VORTEX_ASSIGN_OR_RETURN(const cuda::AttentionVariant variant, cuda::attention_variant_from_env());
  m.implementation = {{"backend", "cuda"}, {"attention", cuda::attention_variant_description(variant)}};
  // Correctness: CPU attention for 16 sampled query rows of the full sequence, all heads.
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv_host, cuda::download(qkv, nullptr));
  const std::vector<int64_t> rows = sampled_rows(kRows, 16);
  Tensor q_rows = Tensor::empty({16, H, D}, DType::kBF16);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(static_cast<char*>(q_rows.data()) + i * H * D * 2,
                static_cast<const char*>(qkv_host.data()) + rows[i] * 3 * H * D * 2, H * D * 2);
  }
  auto host_heads = [&](int64_t column) {
    TensorView v = qkv_host.view();
    v.data = static_cast<char*>(v.data) + column * 2;
    v.shape = Shape({kRows, H, D});
    v.strides = Shape({3 * H * D, D, 1});
    return v;
  };
  Tensor ref = Tensor::empty({16, H, D}, DType::kF32);
  VORTEX_RETURN_IF_ERROR(cpu::attention(q_rows.view(), host_heads(H * D), host_heads(2 * H * D), ref.view(), scale));
  VORTEX_ASSIGN_OR_RETURN(Tensor got, download_rows(out, rows));
  VORTEX_ASSIGN_OR_RETURN(Tensor ref2, ref.reshape({16, H * D}));
  m.correctness = compare(got, ref2, "CPU reference attention (fp32) on 16 sampled query rows, all heads", 1e-2);
  if (!o.peer_command.empty()) {
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "attention", ""));
    add_peer_ratios(m, peer);
  }
  return std::vector<Manifest>{m};
}

}  // namespace vortex::bench
