#include "cpu/attention.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "cpu/rows.h"

namespace vortex::cpu {
namespace {

// Eight lanes, compiled to AVX2 (see gemm.cc). Softmax needs its own vector code: GCC will not
// vectorise a scalar clamp or max under the default -ftrapping-math, and glibc's scalar expf
// (~4 ns) would cost more than both attention GEMMs together at D = 64.
using V8 = float __attribute__((vector_size(32)));
using V8i = int32_t __attribute__((vector_size(32)));

inline V8 splat(float x) { return V8{} + x; }

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof(v)); }

// e^x for x <= 0, within 2 ulp of expf (Cody–Waite reduction x = n·ln2 + r, |r| <= ln2/2, and
// Cephes' degree-7 polynomial for e^r). Arguments below -87.5 give e^-87.5 ≈ 1e-38, which no
// softmax sum (>= 1, from its max) can resolve; NaN stays NaN.
inline V8 exp_nonpositive(V8 x) {
  const V8 lowest = splat(-87.5f);
  x = x < lowest ? lowest : x;
  // Adding and subtracting 1.5·2^23 rounds x·log2(e) to the nearest integer.
  const V8 round_magic = splat(12582912.0f);
  const V8 n = (x * 1.44269504088896341f + round_magic) - round_magic;
  V8 r = x - n * 0.693359375f;  // ln2 split in two so that n·ln2_hi is exact
  r = r - n * -2.12194440e-4f;
  V8 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n from its exponent bits; n is in [-126, 0] after the clamp.
  const V8i e = __builtin_convertvector(n, V8i) + 127;
  return p * std::bit_cast<V8>(e << 23);
}

// s[0:n] <- exp(s - max(s)); returns the fp32 sum of the new s (summed in eight fixed lanes, then
// lane order, then the tail: the same order every call).
float exp_shifted_row(float* s, int64_t n) {
  int64_t i = 0;
  V8 vmax = splat(-std::numeric_limits<float>::infinity());
  for (; i + 8 <= n; i += 8) {
    const V8 x = load8(s + i);
    vmax = x > vmax ? x : vmax;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int lane = 0; lane < 8; ++lane) m = vmax[lane] > m ? vmax[lane] : m;
  for (; i < n; ++i) m = s[i] > m ? s[i] : m;

  const V8 vm = splat(m);
  V8 vsum{};
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const V8 e = exp_nonpositive(load8(s + i) - vm);
    store8(s + i, e);
    vsum += e;
  }
  float sum = 0.0f;
  for (int lane = 0; lane < 8; ++lane) sum += vsum[lane];
  if (i < n) {
    // The tail goes through the same vector code, padded with lanes that are not kept.
    float tail[8] = {};
    std::memcpy(tail, s + i, static_cast<size_t>(n - i) * sizeof(float));
    const V8 e = exp_nonpositive(load8(tail) - vm);
    for (int lane = 0; i < n; ++i, ++lane) {
      s[i] = e[lane];
      sum += e[lane];
    }
  }
  return sum;
}

std::string describe(const TensorView& t) {
  return std::string(dtype_name(t.dtype)) + t.shape.to_string();
}

Status check_operand(const char* name, const TensorView& t) {
  const std::string what = std::string("attention: ") + name + " " + describe(t);
  if (t.device != Device::kCpu) return invalid_argument(what + " is not on the CPU");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) {
    return invalid_argument(what + " must be F32 or BF16");
  }
  if (t.rank() != 3) return invalid_argument(what + " must be [N, H, D]");
  if (t.shape[2] > 1 && t.strides[2] != 1) {
    return invalid_argument(what + " needs unit stride on D, has " + std::to_string(t.strides[2]));
  }
  return ok_status();
}

// dst[r, :] = t[n0 + r, h, :] as fp32, rows of D floats.
void gather_head_rows(const TensorView& t, int64_t h, int64_t n0, int64_t rows, float* dst) {
  const int64_t d = t.shape[2];
  for (int64_t r = 0; r < rows; ++r) {
    load_row(row_ptr(t, n0 + r, h), t.dtype, d, dst + r * d);
  }
}

// Scratch of one parallel_for chunk: the head whose K and V are widened, and one query block.
struct AttentionScratch {
  int64_t head = -1;
  std::vector<float> k, v;          // [Nk, D]
  std::vector<float> q, o, scores;  // [rows, D], [rows, D], [rows, Nk]
};

// Query head h reads key/value head h / (H / Hkv): the identity without grouped K and V.
void attend_query_block(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, float scale, GemmVariant variant, bool causal,
                        int64_t h, int64_t n0, int64_t rows, AttentionScratch& s) {
  const int64_t nk = k.shape[0], d = q.shape[2];
  const int64_t kv_head = h / (q.shape[1] / k.shape[1]);
  if (s.head != kv_head) {
    s.k.resize(static_cast<size_t>(nk * d));
    s.v.resize(static_cast<size_t>(nk * d));
    gather_head_rows(k, kv_head, 0, nk, s.k.data());
    gather_head_rows(v, kv_head, 0, nk, s.v.data());
    s.head = kv_head;
  }
  s.q.resize(static_cast<size_t>(rows * d));
  s.o.resize(static_cast<size_t>(rows * d));
  s.scores.resize(static_cast<size_t>(rows * nk));
  gather_head_rows(q, h, n0, rows, s.q.data());

  // scores[rows, Nk] = scale · Q · Kᵀ
  matmul_f32(variant, true, rows, nk, d, scale, s.q.data(), d, s.k.data(), d, s.scores.data(), nk);
  float row_sum[kQueryBlock];
  for (int64_t r = 0; r < rows; ++r) {
    // Causal: query n0 + r sees keys 0 ..= n0 + r; the masked weights are exactly zero.
    float* row = s.scores.data() + r * nk;
    const int64_t seen = causal ? std::min(nk, n0 + r + 1) : nk;
    row_sum[r] = exp_shifted_row(row, seen);
    std::fill(row + seen, row + nk, 0.0f);
  }
  // With bf16 V the PV product is a bf16 product in the reference (PyTorch's CPU flash kernel,
  // and every GPU flash kernel): P is rounded to bf16 first, the row sums stay fp32. Matching it
  // takes the bf16 goldens from ~6e-3 to ~4e-4 rel-L2 at the refiner output.
  if (v.dtype == DType::kBF16) {
    for (int64_t i = 0; i < rows * nk; ++i) s.scores[i] = round_bf16(s.scores[i]);
  }
  // o[rows, D] = P · V with P unnormalised; dividing the D outputs beats dividing the Nk weights.
  matmul_f32(variant, false, rows, d, nk, 1.0f, s.scores.data(), nk, s.v.data(), d, s.o.data(), d);

  for (int64_t r = 0; r < rows; ++r) {
    float* o = s.o.data() + r * d;
    for (int64_t j = 0; j < d; ++j) o[j] /= row_sum[r];
    store_row(o, d, row_ptr(out, n0 + r, h), out.dtype);
  }
}

}  // namespace

namespace {

Status attention_impl(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, float scale, GemmVariant variant, bool causal) {
  VORTEX_RETURN_IF_ERROR(check_operand("q", q));
  VORTEX_RETURN_IF_ERROR(check_operand("k", k));
  VORTEX_RETURN_IF_ERROR(check_operand("v", v));
  VORTEX_RETURN_IF_ERROR(check_operand("out", out));
  const int64_t nq = q.shape[0], heads = q.shape[1], d = q.shape[2], nk = k.shape[0];
  const bool heads_fit = causal ? k.shape[1] >= 1 && heads % k.shape[1] == 0 : k.shape[1] == heads;
  if (!heads_fit || k.shape[2] != d) {
    return invalid_argument("attention: k " + describe(k) + " and q " + describe(q) +
                            (causal ? " differ in head dim, or q's heads are not a multiple of k's"
                                    : " differ in heads or head dim"));
  }
  if (causal && nk != nq) {
    return invalid_argument("attention: causal attention needs as many keys as queries; q " + describe(q) +
                            ", k " + describe(k));
  }
  if (v.shape != k.shape) {
    return invalid_argument("attention: v " + describe(v) + " must have k's shape " +
                            k.shape.to_string());
  }
  if (out.shape != q.shape) {
    return invalid_argument("attention: out " + describe(out) + " must have q's shape " +
                            q.shape.to_string());
  }
  if (nk == 0 && nq > 0) {
    return invalid_argument("attention: k " + describe(k) + " has no keys to attend to");
  }
  if (!gemm_variant_available(variant)) {
    return unimplemented(std::string("attention: GEMM variant '") + gemm_variant_name(variant) +
                         "' is not in this build");
  }
  if (q.numel() == 0) return ok_status();

  const int64_t q_blocks = (nq + kQueryBlock - 1) / kQueryBlock;
  // Tasks are numbered head-major, so a chunk of consecutive tasks widens few heads' K and V.
  parallel_for(0, heads * q_blocks, [&](int64_t t0, int64_t t1) {
    AttentionScratch scratch;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / q_blocks;
      const int64_t n0 = (t % q_blocks) * kQueryBlock;
      attend_query_block(q, k, v, out, scale, variant, causal, h, n0, std::min(kQueryBlock, nq - n0),
                         scratch);
    }
  });
  return ok_status();
}

}  // namespace

Status attention(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, float scale, GemmVariant variant) {
  return attention_impl(q, k, v, out, scale, variant, /*causal=*/false);
}

Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, float scale, GemmVariant variant) {
  return attention_impl(q, k, v, out, scale, variant, /*causal=*/true);
}

}  // namespace vortex::cpu
