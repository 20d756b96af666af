// cuda::attention_int8fp8 (the int8fp8 attention mode) against its CPU reference
// cpu::attention_int8fp8 and against the exact GPU attention (cuda::attention), on q, k, v sliced
// from one fused [N, 3·H·D] bf16 buffer of N(0, 1) values, out a strided view inside a padded
// buffer whose padding must survive.
//
// Bounds:
// - quantize pass vs CPU quantization: bit-identical codes and scales (the same fp32 operations;
//   the K mean is summed in fp64 in another order, which moves its fp32 rounding only at a tie).
// - attention vs the CPU reference on the same inputs: rel-L2 ≤ 5e-3. Both compute the same
//   exact int32 scores, the same scale factors and running maxima; they differ by ex2.approx vs
//   exp2f (≤ 2 ulp, so an e4m3 rounding of P flips only near a tie), fp32 summation order, the
//   fp8 tensor core's internal accumulation within a 128-key tile, and the bf16 rounding those
//   move. Expected ~1e-3 or less.
// - against exact: rel-L2 ≤ 0.04 and cosine ≥ 0.999 (the issue's target for the mode; the CPU
//   reference measures 0.037–0.039 at N = 1,000–4,097).
//   The row sums of P8 come from the tensor core (fp8 products of the weights and ones, added
//   inside the tile in its own order), the CPU's in fp32 key order: within the same bound.
// - the e4m3-output instance vs quantize_blocks_fp8 of the bf16 instance's output: bit for bit.
// - a 2-CTA cluster sharing the K / Vᵀ loads vs one CTA per query block: bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cpu/attention_int8fp8.h"
#include "cuda/attention.h"
#include "cuda/attention_int8fp8.h"
#include "cuda/elementwise.h"
#include "cuda/runtime.h"
#include "cuda/synthetic_fill.h"
#include "gpu/gemm_attention_test_util.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::must;

constexpr double kVsReferenceRelL2 = 5e-3;
constexpr double kVsExactRelL2 = 0.04;
constexpr double kVsExactCosine = 0.999;
// Peaked scores (softmax scale 1 at D = 128: one key dominates most rows) put more weight on the
// few e4m3-rounded P values that matter: measured on the H200 0.0515 / 0.0466 rel-L2 and cosine
// 0.99867 vs exact, with the kernel still within 4.2e-4 of the CPU reference of the mode. The
// issue's 0.04 target is for N(0,1) inputs at the standard scale, checked by kVsExactRelL2.
constexpr double kPeakedVsExactRelL2 = 0.06;
constexpr double kPeakedVsExactCosine = 0.998;
constexpr int64_t kD = 128;
constexpr int64_t kOutPad = 16, kOutCol0 = 8;
constexpr unsigned char kSentinel = 0x5A;

// N(0, 1) by Box–Muller from two 24-bit uniforms of the (seed, index) hash, rounded to bf16.
__global__ void fill_normal_kernel(uint16_t* dst, int64_t count, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    const uint64_t h = test::splitmix64(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777217.0f);
    const float u2 = static_cast<float>((h >> 16) & 0xFFFFFFu) * (1.0f / 16777216.0f);
    dst[i] = f32_to_bf16_bits(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

void fill_normal(const Tensor& t, uint64_t seed, cudaStream_t stream) {
  fill_normal_kernel<<<4096, 256, 0, stream>>>(t.data_as<uint16_t>(), t.numel(), seed);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

struct ModeError {
  double rel_l2 = 0.0, cosine = 0.0;
  int64_t nonfinite = 0;
};

// got vs want over n bf16 values (host arrays).
ModeError mode_error(const uint16_t* got, const uint16_t* want, int64_t n) {
  double num = 0.0, den = 0.0, dot = 0.0, gg = 0.0;
  ModeError e;
  for (int64_t i = 0; i < n; ++i) {
    const double g = bf16_bits_to_f32(got[i]), w = bf16_bits_to_f32(want[i]);
    if (!std::isfinite(g) || !std::isfinite(w)) {
      ++e.nonfinite;
      continue;
    }
    num += (g - w) * (g - w);
    den += w * w;
    dot += g * w;
    gg += g * g;
  }
  e.rel_l2 = std::sqrt(num / den);
  e.cosine = dot / std::sqrt(den * gg);
  return e;
}

// A host bf16 [N, H, D] tensor holding the columns [col, col + H·D) of a host fused buffer.
Tensor gather_heads(const Tensor& fused, int64_t col, int64_t heads) {
  return must(must(fused.slice(1, col, col + heads * kD)).contiguous().reshape({fused.size(0), heads, kD}));
}

class GpuAttentionInt8Fp8 : public test::GpuTest {};

// N(0, 1) q [nq, H, D] and k, v [nk, H, D] sliced from two fused buffers (seeds seed + 1 for k, v
// and seed + 2 for q; seed advances by 2), quantized into a workspace, all in `arena`.
struct QuantizedCase {
  std::string label;
  cuda::Int8Fp8Workspace ws;

  QuantizedCase(cuda::DeviceArena& arena, int64_t nq, int64_t nk, int64_t heads, uint64_t& seed, cudaStream_t stream)
      : label("Nq=" + std::to_string(nq) + " Nk=" + std::to_string(nk) + " H=" + std::to_string(heads)) {
    const int64_t width = heads * kD;
    const Tensor kv = must(arena.alloc({nk, 3 * width}, DType::kBF16));
    const Tensor qf = must(arena.alloc({nq, 3 * width}, DType::kBF16));
    fill_normal(kv, ++seed, stream);
    fill_normal(qf, ++seed, stream);
    const TensorView q = test::head_view(qf, 0, heads, kD), k = test::head_view(kv, width, heads, kD),
                     v = test::head_view(kv, 2 * width, heads, kD);
    ws = must(cuda::int8fp8_workspace(arena, nq, nk, heads));
    must(cuda::quantize_int8fp8(q, k, v, ws, stream));
  }
};

// Quantize pass vs cpu::quantize_int8fp8, GPU attention vs the CPU reference and vs exact, for
// q [nq, H, D] against k, v [nk, H, D] (one fused buffer when nq == nk, as the model has).
void check(cuda::DeviceArena& arena, cudaStream_t stream, int64_t nq, int64_t nk, int64_t heads, float scale,
           uint64_t seed) {
  const std::string label = "Nq=" + std::to_string(nq) + " Nk=" + std::to_string(nk) + " H=" + std::to_string(heads) +
                            " scale=" + std::to_string(scale);
  const size_t mark = arena.mark();
  const int64_t width = 3 * heads * kD;
  const Tensor dkv = must(arena.alloc({nk, width}, DType::kBF16));
  fill_normal(dkv, seed, stream);
  Tensor dq_fused = dkv;
  if (nq != nk) {
    dq_fused = must(arena.alloc({nq, width}, DType::kBF16));
    fill_normal(dq_fused, seed + 1000, stream);
  }
  const TensorView q = test::head_view(dq_fused, 0, heads, kD), k = test::head_view(dkv, heads * kD, heads, kD),
                   v = test::head_view(dkv, 2 * heads * kD, heads, kD);
  const Tensor dout_full = must(arena.alloc({nq, heads, kD + kOutPad}, DType::kBF16));
  const Tensor dout = must(dout_full.slice(2, kOutCol0, kOutCol0 + kD));
  const Tensor dexact = must(arena.alloc({nq, heads, kD}, DType::kBF16));
  EXPECT_EQ(cudaMemsetAsync(dout_full.data(), kSentinel, dout_full.nbytes(), stream), cudaSuccess);

  const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena, nq, nk, heads));
  // A poisoned workspace: the pass must set everything it reads, its per-head chunk counters included.
  EXPECT_EQ(cudaMemsetAsync(ws.q, 0xFF, cuda::int8fp8_workspace_bytes(nq, nk, heads), stream), cudaSuccess);
  must(cuda::quantize_int8fp8(q, k, v, ws, stream));
  must(cuda::attention_int8fp8_quantized(ws, dout.view(), scale, stream));
  must(cuda::attention(q, k, v, dexact.view(), scale, stream));

  // ---- host copies and the CPU reference ----
  const Tensor kv_host = must(cuda::download(dkv, stream));
  const Tensor q_host_fused = nq == nk ? kv_host : must(cuda::download(dq_fused, stream));
  const Tensor hq = gather_heads(q_host_fused, 0, heads), hk = gather_heads(kv_host, heads * kD, heads),
               hv = gather_heads(kv_host, 2 * heads * kD, heads);
  const cpu::Int8Fp8Quantized qz = must(cpu::quantize_int8fp8(hq.view(), hk.view(), hv.view()));
  Tensor ref = Tensor::empty({nq, heads, kD}, DType::kBF16);
  must(cpu::attention_int8fp8_quantized(qz, ref.view(), scale));

  // ---- the quantize pass, bit for bit ----
  const auto download_bytes = [&](const void* src, size_t bytes) {
    std::vector<unsigned char> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  const auto q8 = download_bytes(ws.q, heads * ws.nq_pad * kD);
  const auto k8 = download_bytes(ws.k, heads * ws.nk_pad * kD);
  const auto vt = download_bytes(ws.vt, heads * ws.nk_pad * kD);
  const auto floats = [&](const float* src, size_t n) {
    std::vector<float> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  const auto q_scale = floats(ws.q_scale, heads * ws.nq_pad / 64), k_scale = floats(ws.k_scale, heads * ws.nk_pad / 128),
             v_scale = floats(ws.v_scale, heads * kD), k_mean = floats(ws.k_mean, heads * kD);
  int64_t bad_codes = 0, bad_scales = 0;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < ws.nq_pad; ++r) {
      for (int64_t c = 0; c < kD; ++c) {
        const int8_t want = r < nq ? qz.q[(h * nq + r) * kD + c] : 0;
        bad_codes += static_cast<int8_t>(q8[(h * ws.nq_pad + r) * kD + c]) != want;
      }
    }
    for (int64_t r = 0; r < ws.nk_pad; ++r) {
      for (int64_t c = 0; c < kD; ++c) {
        const int8_t want_k = r < nk ? qz.k[(h * nk + r) * kD + c] : 0;
        bad_codes += static_cast<int8_t>(k8[(h * ws.nk_pad + r) * kD + c]) != want_k;
        const uint8_t want_v = r < nk ? qz.v[(h * nk + r) * kD + c] : 0;
        const int64_t slot = (r / 128) * 128 + cuda::int8fp8_vt_slot(static_cast<int>(r % 128));
        bad_codes += vt[(h * kD + c) * ws.nk_pad + slot] != want_v;
      }
    }
    for (int64_t b = 0; b < ws.nq_pad / 64; ++b) {
      const float want = b < qz.q_blocks() ? qz.q_scale[h * qz.q_blocks() + b] : 0.0f;
      bad_scales += q_scale[h * (ws.nq_pad / 64) + b] != want;
    }
    for (int64_t b = 0; b < ws.nk_pad / 128; ++b) {
      bad_scales += k_scale[h * (ws.nk_pad / 128) + b] != qz.k_scale[h * qz.k_blocks() + b];
    }
    for (int64_t c = 0; c < kD; ++c) {
      bad_scales += v_scale[h * kD + c] != qz.v_scale[h * kD + c];
      bad_scales += k_mean[h * kD + c] != qz.k_mean[h * kD + c];
    }
  }
  EXPECT_EQ(bad_codes, 0) << label << ": quantized codes differ from the CPU's";
  EXPECT_EQ(bad_scales, 0) << label << ": scales or K means differ from the CPU's";

  // ---- the attention pass ----
  const Tensor out_full = must(cuda::download(dout_full, stream));
  const Tensor exact = must(cuda::download(dexact, stream));
  arena.release_to(mark);
  const auto* bytes = static_cast<const unsigned char*>(out_full.data());
  int64_t clobbered = 0;
  for (int64_t row = 0; row < nq * heads; ++row) {
    for (int64_t c = 0; c < kD + kOutPad; ++c) {
      if (c >= kOutCol0 && c < kOutCol0 + kD) continue;
      clobbered += bytes[(row * (kD + kOutPad) + c) * 2] != kSentinel;
      clobbered += bytes[(row * (kD + kOutPad) + c) * 2 + 1] != kSentinel;
    }
  }
  EXPECT_EQ(clobbered, 0) << label << ": bytes written outside out";
  const Tensor got = must(out_full.slice(2, kOutCol0, kOutCol0 + kD)).contiguous();
  const ModeError vs_ref = mode_error(got.data_as<uint16_t>(), ref.data_as<uint16_t>(), got.numel());
  const ModeError vs_exact = mode_error(got.data_as<uint16_t>(), exact.data_as<uint16_t>(), got.numel());
  const ModeError ref_vs_exact = mode_error(ref.data_as<uint16_t>(), exact.data_as<uint16_t>(), got.numel());
  EXPECT_EQ(vs_ref.nonfinite, 0) << label;
  EXPECT_LE(vs_ref.rel_l2, kVsReferenceRelL2) << label << ": GPU vs CPU int8fp8 reference";
  const bool peaked = scale > 0.5f;
  EXPECT_LE(vs_exact.rel_l2, peaked ? kPeakedVsExactRelL2 : kVsExactRelL2) << label << ": GPU int8fp8 vs GPU exact";
  EXPECT_GE(vs_exact.cosine, peaked ? kPeakedVsExactCosine : kVsExactCosine) << label << ": GPU int8fp8 vs GPU exact";
  std::printf("int8fp8 %-40s vs CPU ref rel-L2 %.3e | vs exact rel-L2 %.4f cos %.6f (CPU ref vs exact %.4f)\n",
              label.c_str(), vs_ref.rel_l2, vs_exact.rel_l2, vs_exact.cosine, ref_vs_exact.rel_l2);
}

TEST_F(GpuAttentionInt8Fp8, MatchesCpuReferenceOnFusedQkvSlices) {
  uint64_t seed = 1;
  for (int64_t n : {1, 5, 127, 129, 1000, 4097}) {
    for (int64_t heads : {1, 3}) check(arena_, stream_, n, n, heads, 1.0f / std::sqrt(128.0f), seed++);
  }
}

TEST_F(GpuAttentionInt8Fp8, UnequalLengthsAndPeakedScores) {
  // Scale 1 at D = 128: scores of std ~11, one key dominates most rows (the running max and the
  // rescaling carry the result). Nq != Nk puts the query tail and the key tail in different places.
  check(arena_, stream_, 77, 300, 2, 1.0f, 100);
  check(arena_, stream_, 300, 77, 2, 1.0f, 101);
  check(arena_, stream_, 130, 1, 3, 0.125f, 102);
  check(arena_, stream_, 640, 1000, 2, 1.0f / std::sqrt(128.0f), 103);
  // Past 64 · 128 keys the K-sum / V-max pass runs its most chunks (64) of more than 128 rows each
  // (here 141, not a multiple of its 16 rows in flight): codes, scales and means still the CPU's.
  check(arena_, stream_, 200, 9000, 2, 1.0f / std::sqrt(128.0f), 104);
}

// Q's fused producer (RMSNorm + RoPE + quantize from the raw QKV rows) against head_norm_rope on a
// copy followed by the quantize pass: the same int8 codes and scales bit for bit, and the raw rows
// left as they were. Odd lengths (a partial last Q block), several heads, weights F32 / BF16 /
// none, RoPE over all 128 channels, over 64, and none.
TEST_F(GpuAttentionInt8Fp8, QProducerMatchesNormRopeThenQuantize) {
  uint64_t seed = 500;
  for (int64_t n : {1, 63, 65, 129, 1000}) {
    for (int64_t heads : {1, 3}) {
      for (int variant = 0; variant < 3; ++variant) {
        const DType weight_dtype = variant == 1 ? DType::kBF16 : DType::kF32;
        const int64_t rot = variant == 0 ? 128 : (variant == 1 ? 64 : 0);
        const bool with_weight = variant != 2;
        const std::string label = "n=" + std::to_string(n) + " heads=" + std::to_string(heads) +
                                  " rot=" + std::to_string(rot) + (with_weight ? "" : " no weight");
        const size_t mark = arena_.mark();
        const Tensor fused = must(arena_.alloc({n, 3 * heads * kD}, DType::kBF16));
        fill_normal(fused, ++seed, stream_);
        const Tensor copy = must(arena_.alloc({n, 3 * heads * kD}, DType::kBF16));
        const Tensor pristine = must(arena_.alloc({n, 3 * heads * kD}, DType::kBF16));
        for (const Tensor* dst : {&copy, &pristine}) {
          ASSERT_EQ(cudaMemcpyAsync(dst->data(), fused.data(), fused.nbytes(), cudaMemcpyDeviceToDevice, stream_),
                    cudaSuccess);
        }
        const Tensor weight = must(arena_.alloc({kD}, weight_dtype));
        must(cuda::fill_scaled_normal(weight, ++seed, 1, 0.5f, stream_));
        Tensor cos, sin;
        if (rot > 0) {
          cos = must(arena_.alloc({n, rot}, DType::kF32));
          sin = must(arena_.alloc({n, rot}, DType::kF32));
          must(cuda::fill_scaled_normal(cos, ++seed, 2, 0.7f, stream_));
          must(cuda::fill_scaled_normal(sin, ++seed, 3, 0.7f, stream_));
        }
        const TensorView weight_view = weight.view(), cos_view = cos.defined() ? cos.view() : TensorView(),
                         sin_view = sin.defined() ? sin.view() : TensorView();
        const TensorView* w = with_weight ? &weight_view : nullptr;
        const TensorView* c = rot > 0 ? &cos_view : nullptr;
        const TensorView* sn = rot > 0 ? &sin_view : nullptr;
        const float eps = 1e-6f;

        const cuda::Int8Fp8Workspace got = must(cuda::int8fp8_workspace(arena_, n, n, heads));
        must(cuda::norm_rope_quantize_q_int8fp8(test::head_view(fused, 0, heads, kD), w, eps, c, sn, got, stream_));
        const cuda::Int8Fp8Workspace want = must(cuda::int8fp8_workspace(arena_, n, n, heads));
        const TensorView q_copy = test::head_view(copy, 0, heads, kD);
        must(cuda::head_norm_rope(q_copy, w, eps, c, sn, stream_));
        must(cuda::quantize_int8fp8(q_copy, q_copy, q_copy, want, stream_));

        const auto bytes = [&](const void* src, size_t count) {
          std::vector<unsigned char> host(count);
          EXPECT_EQ(cudaMemcpyAsync(host.data(), src, count, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
          EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
          return host;
        };
        const size_t code_bytes = static_cast<size_t>(heads * got.nq_pad * kD);
        const size_t scale_bytes = static_cast<size_t>(heads * got.nq_pad / 64) * sizeof(float);
        EXPECT_TRUE(bytes(got.q, code_bytes) == bytes(want.q, code_bytes)) << label << ": Q codes differ";
        EXPECT_TRUE(bytes(got.q_scale, scale_bytes) == bytes(want.q_scale, scale_bytes)) << label << ": Q scales differ";
        // The raw rows are only read (the reference normalised its copy's Q in place).
        EXPECT_TRUE(bytes(fused.data(), fused.nbytes()) == bytes(pristine.data(), pristine.nbytes()))
            << label << ": the producer wrote to its input";
        arena_.release_to(mark);
      }
    }
  }
}

TEST_F(GpuAttentionInt8Fp8, QProducerRejectsBadArguments) {
  const int64_t n = 100, heads = 2;
  const Tensor fused = must(arena_.alloc({n, 3 * heads * kD}, DType::kBF16));
  const TensorView q = test::head_view(fused, 0, heads, kD);
  const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena_, n, n, heads));
  const Tensor short_weight = must(arena_.alloc({64}, DType::kF32));
  const Tensor half_weight = must(arena_.alloc({kD}, DType::kF16));
  const Tensor cos = must(arena_.alloc({n, kD}, DType::kF32));
  const Tensor cos_rows = must(arena_.alloc({n + 1, kD}, DType::kF32));
  const Tensor cos_odd = must(arena_.alloc({n, 24}, DType::kF32));
  const TensorView sw = short_weight.view(), hw = half_weight.view(), cv = cos.view(), cr = cos_rows.view(),
                   co = cos_odd.view();
  const auto code = [&](const TensorView& qv, const TensorView* w, const TensorView* c, const TensorView* sn) {
    return cuda::norm_rope_quantize_q_int8fp8(qv, w, 1e-6f, c, sn, ws, stream_).code();
  };
  EXPECT_EQ(code(q, &sw, nullptr, nullptr), StatusCode::kInvalidArgument) << "a weight of 64";
  EXPECT_EQ(code(q, &hw, nullptr, nullptr), StatusCode::kInvalidArgument) << "an F16 weight";
  EXPECT_EQ(code(q, nullptr, &cv, nullptr), StatusCode::kInvalidArgument) << "cos without sin";
  EXPECT_EQ(code(q, nullptr, &cr, &cr), StatusCode::kInvalidArgument) << "cos for another length";
  EXPECT_EQ(code(q, nullptr, &co, &co), StatusCode::kInvalidArgument) << "rot not a multiple of 16";
  EXPECT_EQ(code(q, nullptr, &cv, &cr), StatusCode::kInvalidArgument) << "sin not matching cos";
  TensorView q_short = q;
  q_short.shape = Shape({n - 1, heads, kD});
  EXPECT_EQ(code(q_short, nullptr, nullptr, nullptr), StatusCode::kInvalidArgument) << "q not the workspace's length";
}

// The timeline instance (clock marks in one CTA) computes the shipped kernel's output bit for bit,
// every recorded tile's marks come in program order, and every CTA records its four marks in
// order on a valid SM.
TEST_F(GpuAttentionInt8Fp8, TimelineInstanceMatchesAndMarksInOrder) {
  const int64_t n = 1000, heads = 3;
  const Tensor fused = must(arena_.alloc({n, 3 * heads * kD}, DType::kBF16));
  fill_normal(fused, 77, stream_);
  const TensorView q = test::head_view(fused, 0, heads, kD), k = test::head_view(fused, heads * kD, heads, kD),
                   v = test::head_view(fused, 2 * heads * kD, heads, kD);
  const Tensor shipped = must(arena_.alloc({n, heads, kD}, DType::kBF16));
  const Tensor marked = must(arena_.alloc({n, heads, kD}, DType::kBF16));
  const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena_, n, n, heads));
  must(cuda::quantize_int8fp8(q, k, v, ws, stream_));
  must(cuda::attention_int8fp8_quantized(ws, shipped.view(), 0.088f, stream_));
  const Tensor a = must(cuda::download(shipped, stream_));
  const cuda::KernelTimeline t = must(cuda::attention_int8fp8_timeline(ws, marked.view(), 0.088f, stream_));
  const Tensor b = must(cuda::download(marked, stream_));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "the timeline instance's output differs";
  ASSERT_EQ(t.warps, 12);  // three consumer warpgroups
  ASSERT_EQ(t.tiles, 8);   // 1,000 keys padded to 1,024
  ASSERT_EQ(t.events.size(), 8u);
  EXPECT_EQ(test::timeline_marks_out_of_order(t), 0) << "timeline marks missing or out of program order";
  ASSERT_EQ(t.ctas.size(), 18u);  // 1,024 padded queries in 6 CTAs of 192 × 3 heads
  EXPECT_EQ(test::cta_records_out_of_order(t), 0) << "CTA records missing or out of order";
}

// The e4m3-output instance writes, bit for bit, what quantize_blocks_fp8 (kTiles) makes of the bf16
// instance's output: codes and scales (the layout's padding included: 1–3 heads pad to 4), at
// query counts with a short last tile and with unequal lengths; codes written into a strided view
// leave the bytes around it alone; a bad view is refused.
TEST_F(GpuAttentionInt8Fp8, E4m3OutputIsTheBlockQuantizerOnTheBf16Output) {
  struct Case {
    int64_t nq, nk, heads;
  };
  uint64_t seed = 880;
  for (const Case c : {Case{1, 129, 1}, Case{129, 300, 3}, Case{300, 257, 2}}) {
    ArenaScope scope(arena_);
    const QuantizedCase qc(arena_, c.nq, c.nk, c.heads, seed, stream_);
    const std::string& label = qc.label;
    const cuda::Int8Fp8Workspace& ws = qc.ws;
    const Tensor out = must(arena_.alloc({c.nq, c.heads, kD}, DType::kBF16));
    must(cuda::attention_int8fp8_quantized(ws, out.view(), 0.088f, stream_));
    test::expect_e4m3_tiles_of(
        out, arena_,
        [&](const TensorView& codes, const TensorView& scales) {
          return cuda::attention_int8fp8_quantized_e4m3(ws, codes, scales, 0.088f, stream_);
        },
        label, stream_);
  }
  const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena_, 100, 100, 2));
  const Tensor codes = must(arena_.alloc({100, 2 * kD}, DType::kF8E4M3));
  const Tensor wrong_scales = must(arena_.alloc({2, 2}, DType::kF32));
  EXPECT_EQ(cuda::attention_int8fp8_quantized_e4m3(ws, codes.view(), wrong_scales.view(), 0.088f, stream_).code(),
            StatusCode::kInvalidArgument)
      << "scales [2, 2] where the kTiles layout of 100 queries × 2 heads is [1, 4]";
  const Tensor scales = must(arena_.alloc({1, 4}, DType::kF32));
  EXPECT_EQ(cuda::attention_int8fp8_quantized_e4m3(ws, codes.view(), scales.view(), 0.088f, stream_, 1).code(),
            StatusCode::kInvalidArgument)
      << "the e4m3 output runs in pairs of CTAs only";
}

// A pair of CTAs sharing each K / Vᵀ load (TMA multicast) writes what one CTA per query block
// writes, bit for bit, and nothing else: bf16 output (with the bytes around its strided view) and
// the e4m3 instance, on odd query-block counts (a padding block past the last one) and sweeps of
// 1 to 33 key tiles (fewer than, as many as and more than the ring's three stages).
TEST_F(GpuAttentionInt8Fp8, ClusterPairIsBitwiseTheSingleCtaPath) {
  EXPECT_EQ(cuda::attention_int8fp8_cluster_ctas(37810, 37810, 56), 2);
  EXPECT_EQ(cuda::attention_int8fp8_cluster_ctas(4608, 4608, 24), 1);
  struct Case {
    int64_t nq, nk, heads;
  };
  uint64_t seed = 990;
  for (const Case c : {Case{1, 1, 1}, Case{129, 129, 2}, Case{300, 257, 3}, Case{200, 513, 4}, Case{1000, 1000, 2},
                       Case{4097, 127, 1}, Case{129, 4097, 2}}) {
    ArenaScope scope(arena_);
    const QuantizedCase qc(arena_, c.nq, c.nk, c.heads, seed, stream_);
    const std::string& label = qc.label;
    const cuda::Int8Fp8Workspace& ws = qc.ws;
    Tensor outs[2];
    for (int cluster : {1, 2}) {
      Tensor& full = outs[cluster - 1];
      full = must(arena_.alloc({c.nq, c.heads, kD + kOutPad}, DType::kBF16));
      ASSERT_EQ(cudaMemsetAsync(full.data(), kSentinel, full.nbytes(), stream_), cudaSuccess);
      const Tensor out = must(full.slice(2, kOutCol0, kOutCol0 + kD));
      must(cuda::attention_int8fp8_quantized(ws, out.view(), 0.088f, stream_, cluster));
    }
    const Tensor single = must(cuda::download(outs[0], stream_)), pair = must(cuda::download(outs[1], stream_));
    EXPECT_EQ(std::memcmp(single.data(), pair.data(), single.nbytes()), 0)
        << label << ": the clustered output (or the bytes around it) differs from one CTA per block";
    const Tensor bf16 = must(single.slice(2, kOutCol0, kOutCol0 + kD)).contiguous();
    const Tensor bf16_dev = must(cuda::upload(bf16, arena_, stream_));
    test::expect_e4m3_tiles_of(
        bf16_dev, arena_,
        [&](const TensorView& codes, const TensorView& scales) {
          return cuda::attention_int8fp8_quantized_e4m3(ws, codes, scales, 0.088f, stream_, 2);
        },
        label + " e4m3, clusters of 2", stream_);
  }
  const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena_, 16, 16, 1));
  const Tensor out = must(arena_.alloc({16, 1, kD}, DType::kBF16));
  EXPECT_EQ(cuda::attention_int8fp8_quantized(ws, out.view(), 0.088f, stream_, 4).code(), StatusCode::kInvalidArgument);
}

// ---- the canonical shape: 37,810 tokens, 56 heads of 128 ---------------------------------------------

constexpr int64_t kTokens = 37810, kHeads = 56;
constexpr int64_t kSmallTokens = 4608, kSmallHeads = 24;

class GpuAttentionInt8Fp8Canonical : public test::GpuTest {
 protected:
  // fused 1.63 GB + two outs 2 × 0.54 GB + the workspace 0.82 GB + the small shape's 0.16 GB
  size_t arena_bytes() const override { return size_t{4000} << 20; }

  void SetUp() override {
    test::GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    fused_ = must(arena_.alloc({kTokens, 3 * kHeads * kD}, DType::kBF16));
    out_ = must(arena_.alloc({kTokens, kHeads * kD}, DType::kBF16));
    exact_ = must(arena_.alloc({kTokens, kHeads * kD}, DType::kBF16));
    fill_normal(fused_, 37810, stream_);
  }
  TensorView q() const { return test::head_view(fused_, 0, kHeads, kD); }
  TensorView k() const { return test::head_view(fused_, kHeads * kD, kHeads, kD); }
  TensorView v() const { return test::head_view(fused_, 2 * kHeads * kD, kHeads, kD); }

  const float kScale = 1.0f / std::sqrt(static_cast<float>(kD));
  Tensor fused_, out_, exact_;
};

TEST_F(GpuAttentionInt8Fp8Canonical, SampledRowsMatchCpuAndWholeOutputMatchesExact) {
  EXPECT_EQ(cudaMemsetAsync(out_.data(), kSentinel, out_.nbytes(), stream_), cudaSuccess);
  must(cuda::attention_int8fp8(q(), k(), v(), test::head_view(out_, 0, kHeads, kD), kScale, arena_, stream_));
  must(cuda::attention(q(), k(), v(), test::head_view(exact_, 0, kHeads, kD), kScale, stream_));
  sync();

  constexpr int64_t kSampled = 16;
  const int64_t width = 3 * kHeads * kD;
  std::vector<int64_t> rows = test::random_distinct_indices(kSampled - 2, kTokens - 2, 56);
  for (int64_t& r : rows) r += 1;
  rows.push_back(0);
  rows.push_back(kTokens - 1);
  for (int64_t head : {int64_t{0}, kHeads - 1}) {
    const auto head_columns = [&](int64_t part) {
      return must(test::download_2d(fused_.data(), DType::kBF16, width, 0, kTokens, (part * kHeads + head) * kD, kD)
                      .reshape({kTokens, 1, kD}));
    };
    const Tensor hq = head_columns(0), hk = head_columns(1), hv = head_columns(2);
    const cpu::Int8Fp8Quantized qz = must(cpu::quantize_int8fp8(hq.view(), hk.view(), hv.view()));
    Tensor ref = Tensor::empty({kSampled, 1, kD}, DType::kBF16);
    must(cpu::attention_int8fp8_rows(qz, rows, ref.view(), kScale));
    Tensor got = Tensor::empty({kSampled, 1, kD}, DType::kBF16);
    for (int64_t i = 0; i < kSampled; ++i) {
      const Tensor gr = test::download_2d(out_.data(), DType::kBF16, kHeads * kD, rows[i], 1, head * kD, kD);
      std::memcpy(got.data_as<uint16_t>() + i * kD, gr.data(), gr.nbytes());
    }
    const ModeError e = mode_error(got.data_as<uint16_t>(), ref.data_as<uint16_t>(), got.numel());
    EXPECT_EQ(e.nonfinite, 0) << "head " << head;
    EXPECT_LE(e.rel_l2, kVsReferenceRelL2) << "head " << head << ": GPU vs CPU int8fp8 reference";
    std::printf("int8fp8 37810x56x128, head %lld, %lld sampled queries vs CPU reference: rel-L2 %.3e\n",
                static_cast<long long>(head), static_cast<long long>(kSampled), e.rel_l2);
    RecordProperty("head" + std::to_string(head) + "_vs_reference_rel_l2", std::to_string(e.rel_l2));
  }
  // Every output (271M; the sentinel would show as a huge difference) against exact v1.
  const Tensor got = must(cuda::download(out_, stream_));
  const Tensor exact = must(cuda::download(exact_, stream_));
  const ModeError e = mode_error(got.data_as<uint16_t>(), exact.data_as<uint16_t>(), got.numel());
  EXPECT_EQ(e.nonfinite, 0);
  EXPECT_LE(e.rel_l2, kVsExactRelL2) << "int8fp8 vs exact at 37810x56x128 (the issue's target)";
  EXPECT_GE(e.cosine, kVsExactCosine) << "int8fp8 vs exact at 37810x56x128";
  std::printf("int8fp8 vs exact 37810x56x128, all %lld outputs: rel-L2 %.4f  cosine %.6f\n",
              static_cast<long long>(got.numel()), e.rel_l2, e.cosine);
  RecordProperty("vs_exact_rel_l2", std::to_string(e.rel_l2));
}

double median_ms(cudaStream_t stream, const std::function<Status()>& launch) {
  constexpr int kWarmup = 2, kRepeats = 10;
  for (int i = 0; i < kWarmup; ++i) must(launch());
  cudaEvent_t start, stop;
  EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
  std::vector<float> ms(kRepeats);
  for (float& t : ms) {
    EXPECT_EQ(cudaEventRecord(start, stream), cudaSuccess);
    must(launch());
    EXPECT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    EXPECT_EQ(cudaEventElapsedTime(&t, start, stop), cudaSuccess);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return 0.5 * (ms[kRepeats / 2 - 1] + ms[kRepeats / 2]);
}

// A quick look at the rates (the bench owns protocol and manifests): run with
// --gtest_also_run_disabled_tests --gtest_filter='*Int8Fp8*Time*'. TOPS counts 4·N²·H·D.
TEST_F(GpuAttentionInt8Fp8Canonical, DISABLED_TimeCanonicalShape) {
  const Tensor small_fused = must(arena_.alloc({kSmallTokens, 3 * kSmallHeads * kD}, DType::kBF16));
  const Tensor small_out = must(arena_.alloc({kSmallTokens, kSmallHeads * kD}, DType::kBF16));
  fill_normal(small_fused, 4608, stream_);
  struct Case {
    int64_t n, h;
    const Tensor* fused;
    const Tensor* out;
  };
  for (const Case& shape : {Case{kTokens, kHeads, &fused_, &out_}, Case{kSmallTokens, kSmallHeads, &small_fused, &small_out}}) {
    const TensorView sq = test::head_view(*shape.fused, 0, shape.h, kD),
                     sk = test::head_view(*shape.fused, shape.h * kD, shape.h, kD),
                     sv = test::head_view(*shape.fused, 2 * shape.h * kD, shape.h, kD),
                     so = test::head_view(*shape.out, 0, shape.h, kD);
    const double ops = 4.0 * static_cast<double>(shape.n) * shape.n * shape.h * kD;
    const size_t mark = arena_.mark();
    const cuda::Int8Fp8Workspace ws = must(cuda::int8fp8_workspace(arena_, shape.n, shape.n, shape.h));
    const double quantize = median_ms(stream_, [&] { return cuda::quantize_int8fp8(sq, sk, sv, ws, stream_); });
    const double attend = median_ms(stream_, [&] { return cuda::attention_int8fp8_quantized(ws, so, kScale, stream_); });
    arena_.release_to(mark);
    const double both = median_ms(stream_, [&] { return cuda::attention_int8fp8(sq, sk, sv, so, kScale, arena_, stream_); });
    const double exact = median_ms(stream_, [&] { return cuda::attention(sq, sk, sv, so, kScale, stream_); });
    std::printf("int8fp8 %lldx%lldx128: with quantize %.3f ms (%.1f TOPS) | attention only %.3f ms (%.1f TOPS) | "
                "quantize %.3f ms | exact %.3f ms (%.1f TFLOP/s)\n",
                static_cast<long long>(shape.n), static_cast<long long>(shape.h), both, ops / (both * 1e-3) / 1e12,
                attend, ops / (attend * 1e-3) / 1e12, quantize, exact, ops / (exact * 1e-3) / 1e12);
    RecordProperty("int8fp8_" + std::to_string(shape.n) + "_median_ms", std::to_string(both));
  }
}

}  // namespace
}  // namespace vortex
