#include "cpu/attention_int8fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/portable_math.h"
#include "cpu/rows.h"

namespace vortex::cpu {
namespace {

std::string describe(const TensorView& t) { return std::string(dtype_name(t.dtype)) + t.shape.to_string(); }

Status check_operand(const char* name, const TensorView& t) {
  const std::string what = std::string("attention_int8fp8: ") + name + " " + describe(t);
  if (t.device != Device::kCpu) return invalid_argument(what + " is not on the CPU");
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16) return invalid_argument(what + " must be F32 or BF16");
  if (t.rank() != 3) return invalid_argument(what + " must be [N, H, D]");
  if (t.shape[2] > 1 && t.strides[2] != 1) return invalid_argument(what + " needs unit stride on D");
  return ok_status();
}

// fp32 → int8 code with the block's reciprocal scale: ties to even, clamped to ±127.
inline int8_t int8_code(float x, float inverse) {
  const float r = std::nearbyint(x * inverse);
  return static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
}

// Quantizes rows [0, n) of one head (fp32 [n, d] in `x`) in blocks of `block` rows into `codes`
// ([n, d]) and `scales` ([ceil(n / block)]).
void quantize_int8_blocks(const std::vector<float>& x, int64_t n, int64_t d, int64_t block, int8_t* codes,
                          float* scales) {
  for (int64_t b = 0; b * block < n; ++b) {
    const int64_t r0 = b * block, r1 = std::min(n, r0 + block);
    float amax = 0.0f;
    for (int64_t i = r0 * d; i < r1 * d; ++i) amax = std::max(amax, std::fabs(x[i]));
    scales[b] = amax / 127.0f;
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = r0 * d; i < r1 * d; ++i) codes[i] = int8_code(x[i], inverse);
  }
}

void load_head(const TensorView& t, int64_t h, std::vector<float>& dst) {
  const int64_t n = t.shape[0], d = t.shape[2];
  dst.resize(static_cast<size_t>(n * d));
  for (int64_t r = 0; r < n; ++r) load_row(row_ptr(t, r, h), t.dtype, d, dst.data() + r * d);
}

Status check_out(const Int8Fp8Quantized& qz, const TensorView& out, int64_t rows) {
  VORTEX_RETURN_IF_ERROR(check_operand("out", out));
  if (out.shape[0] != rows || out.shape[1] != qz.heads || out.shape[2] != qz.d) {
    return invalid_argument("attention_int8fp8: out " + describe(out) + " must be [" + std::to_string(rows) + ", " +
                            std::to_string(qz.heads) + ", " + std::to_string(qz.d) + "]");
  }
  return ok_status();
}

// One query row of one head (the mode's definition, header comment), written to out[row_out, h].
void attend_row(const Int8Fp8Quantized& qz, int64_t h, int64_t i, const std::vector<float>& v_values,
                float scale_log2, const TensorView& out, int64_t row_out,
                std::vector<int32_t>& acc, std::vector<float>& o, std::vector<float>& o_tile) {
  const int64_t nk = qz.nk, d = qz.d;
  const int8_t* qrow = qz.q.data() + (h * qz.nq + i) * d;
  const int8_t* khead = qz.k.data() + h * nk * d;
  const float q_factor = qz.q_scale[h * qz.q_blocks() + i / kInt8Fp8QBlock] * scale_log2;
  acc.resize(static_cast<size_t>(kInt8Fp8KBlock));
  o.assign(static_cast<size_t>(d), 0.0f);
  o_tile.resize(static_cast<size_t>(d));
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
  for (int64_t t = 0; t * kInt8Fp8KBlock < nk; ++t) {
    const int64_t j0 = t * kInt8Fp8KBlock, j1 = std::min(nk, j0 + kInt8Fp8KBlock);
    const float c = q_factor * qz.k_scale[h * qz.k_blocks() + t];
    int32_t acc_max = std::numeric_limits<int32_t>::min();
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* krow = khead + j * d;
      int32_t sum = 0;
      for (int64_t ch = 0; ch < d; ++ch) sum += static_cast<int32_t>(qrow[ch]) * static_cast<int32_t>(krow[ch]);
      acc[j - j0] = sum;
      acc_max = std::max(acc_max, sum);
    }
    const float m_new = std::max(m, static_cast<float>(acc_max) * c);
    const float alpha = portable_exp2f(m - m_new);
    const float offset = std::fma(-kInt8Fp8ScoreBias, c, kInt8Fp8Log2PScale - m_new);
    float sum = 0.0f;
    std::fill(o_tile.begin(), o_tile.end(), 0.0f);
    for (int64_t j = j0; j < j1; ++j) {
      const float biased = kInt8Fp8ScoreBias + static_cast<float>(acc[j - j0]);  // exact: |acc| < 2^21
      const float p = portable_exp2f(std::fma(biased, c, offset));
      const float w = e4m3_bits_to_f32(f32_to_e4m3_bits(p));
      sum += w;
      const float* vrow = v_values.data() + j * d;
      for (int64_t ch = 0; ch < d; ++ch) o_tile[ch] += w * vrow[ch];
    }
    l = l * alpha + sum;
    for (int64_t ch = 0; ch < d; ++ch) o[ch] = std::fma(o[ch], alpha, o_tile[ch]);
    m = m_new;
  }
  const float inverse = 1.0f / l;
  const float* vs = qz.v_scale.data() + h * d;
  for (int64_t ch = 0; ch < d; ++ch) o[ch] = (o[ch] * vs[ch]) * inverse;
  store_row(o.data(), d, row_ptr(out, row_out, h), out.dtype);
}

// Runs attend_row for every (head, listed row), heads outermost so a thread widens few V heads.
void attend_rows(const Int8Fp8Quantized& qz, const std::vector<int64_t>& rows, const TensorView& out, float scale) {
  const float scale_log2 = scale * kLog2e;
  const int64_t count = static_cast<int64_t>(rows.size());
  parallel_for(0, qz.heads * count, [&](int64_t t0, int64_t t1) {
    std::vector<float> v_values, o, o_tile;
    std::vector<int32_t> acc;
    int64_t widened = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / count, r = t % count;
      if (h != widened) {
        v_values.resize(static_cast<size_t>(qz.nk * qz.d));
        const uint8_t* codes = qz.v.data() + h * qz.nk * qz.d;
        for (int64_t e = 0; e < qz.nk * qz.d; ++e) v_values[e] = e4m3_bits_to_f32(codes[e]);
        widened = h;
      }
      attend_row(qz, h, rows[r], v_values, scale_log2, out, r, acc, o, o_tile);
    }
  });
}

}  // namespace

Result<Int8Fp8Quantized> quantize_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v) {
  VORTEX_RETURN_IF_ERROR(check_operand("q", q));
  VORTEX_RETURN_IF_ERROR(check_operand("k", k));
  VORTEX_RETURN_IF_ERROR(check_operand("v", v));
  const int64_t nq = q.shape[0], heads = q.shape[1], d = q.shape[2], nk = k.shape[0];
  if (k.shape[1] != heads || k.shape[2] != d || v.shape != k.shape) {
    return invalid_argument("attention_int8fp8: q " + describe(q) + ", k " + describe(k) + ", v " + describe(v) +
                            " must be [Nq, H, D], [Nk, H, D], [Nk, H, D]");
  }
  if (nq < 1 || nk < 1 || heads < 1 || d < 1 || d > 1024) {
    return invalid_argument("attention_int8fp8: needs Nq, Nk, H >= 1 and 1 <= D <= 1024, got q " + describe(q) +
                            ", k " + describe(k));
  }
  Int8Fp8Quantized qz;
  qz.nq = nq, qz.nk = nk, qz.heads = heads, qz.d = d;
  qz.q.resize(static_cast<size_t>(heads * nq * d));
  qz.k.resize(static_cast<size_t>(heads * nk * d));
  qz.v.resize(static_cast<size_t>(heads * nk * d));
  qz.q_scale.resize(static_cast<size_t>(heads * qz.q_blocks()));
  qz.k_scale.resize(static_cast<size_t>(heads * qz.k_blocks()));
  qz.v_scale.resize(static_cast<size_t>(heads * d));
  qz.k_mean.resize(static_cast<size_t>(heads * d));

  parallel_for(0, heads, [&](int64_t h0, int64_t h1) {
    std::vector<float> x;
    std::vector<double> sum(static_cast<size_t>(d));
    std::vector<float> amax(static_cast<size_t>(d));
    for (int64_t h = h0; h < h1; ++h) {
      load_head(q, h, x);
      quantize_int8_blocks(x, nq, d, kInt8Fp8QBlock, qz.q.data() + h * nq * d,
                           qz.q_scale.data() + h * qz.q_blocks());

      load_head(k, h, x);
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < d; ++c) sum[c] += static_cast<double>(x[j * d + c]);
      }
      float* mean = qz.k_mean.data() + h * d;
      for (int64_t c = 0; c < d; ++c) mean[c] = static_cast<float>(sum[c] / static_cast<double>(nk));
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < d; ++c) x[j * d + c] -= mean[c];
      }
      quantize_int8_blocks(x, nk, d, kInt8Fp8KBlock, qz.k.data() + h * nk * d,
                           qz.k_scale.data() + h * qz.k_blocks());

      load_head(v, h, x);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < d; ++c) amax[c] = std::max(amax[c], std::fabs(x[j * d + c]));
      }
      float* vs = qz.v_scale.data() + h * d;
      for (int64_t c = 0; c < d; ++c) vs[c] = amax[c] / kInt8Fp8PScale;
      uint8_t* codes = qz.v.data() + h * nk * d;
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          const float inverse = amax[c] > 0.0f ? kInt8Fp8PScale / amax[c] : 0.0f;
          codes[j * d + c] = f32_to_e4m3_bits(x[j * d + c] * inverse);
        }
      }
    }
  });
  return qz;
}

Status attention_int8fp8_quantized(const Int8Fp8Quantized& quantized, const TensorView& out, float scale) {
  std::vector<int64_t> rows(static_cast<size_t>(quantized.nq));
  for (int64_t i = 0; i < quantized.nq; ++i) rows[i] = i;
  return attention_int8fp8_rows(quantized, rows, out, scale);
}

Status attention_int8fp8_rows(const Int8Fp8Quantized& quantized, const std::vector<int64_t>& rows,
                              const TensorView& out, float scale) {
  VORTEX_RETURN_IF_ERROR(check_out(quantized, out, static_cast<int64_t>(rows.size())));
  if (!(scale > 0.0f) || !std::isfinite(scale)) return invalid_argument("attention_int8fp8: scale must be finite and > 0");
  for (const int64_t r : rows) {
    if (r < 0 || r >= quantized.nq) return invalid_argument("attention_int8fp8: row " + std::to_string(r) + " is out of range");
  }
  attend_rows(quantized, rows, out, scale);
  return ok_status();
}

Status attention_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         float scale) {
  VORTEX_ASSIGN_OR_RETURN(const Int8Fp8Quantized quantized, quantize_int8fp8(q, k, v));
  return attention_int8fp8_quantized(quantized, out, scale);
}

}  // namespace vortex::cpu
