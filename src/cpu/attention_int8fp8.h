// CPU reference of the `int8fp8` attention mode (DESIGN section 3): SageAttention-style quantized
// attention, defined here step by step so that the GPU kernel (src/cuda/attention_int8fp8.*) can be
// checked against it tightly and the mode's error against `exact` is a property of the mode.
//
// Quantization (per head h; every operation fp32 unless named, scales computed once):
//   K smoothing   mean[c] = fp32(Σ_j k[j, c] in fp64 / Nk);  k'[j, c] = k[j, c] − mean[c]
//                 (exact for softmax: it shifts every score of a query row by q·mean).
//   Q, K int8     per block of kQBlock query rows / kKBlock key rows: amax = max |x| over the block,
//                 scale = amax / 127, x8 = clamp(rint(x · (127 / amax)), ±127) (ties to even);
//                 an all-zero block has scale 0 and codes 0.
//   V e4m3        per (head, channel) over all keys: amax, scale = amax / 448,
//                 v8 = e4m3_rne_saturating(v · (448 / amax)).
// Attention (per query row i of Q block b, keys in tiles t of kKBlock, an online softmax in the
// log2 domain whose tile boundaries are part of the definition):
//   acc_j   = Σ_c q8[i, c] · k8[j, c]                        (exact int32, |acc| < 2^21 at D = 128)
//   c_t     = (q_scale[b] · (scale · log2 e)) · k_scale[t]
//   m_t     = max(m_{t−1}, fp32(max_j acc_j) · c_t)            (max over the tile's keys)
//   alpha_t = exp2(m_{t−1} − m_t)                              (0 for the first tile)
//   b_t     = fma(−1.5·2^23, c_t, log2(448) − m_t)
//   p_j     = exp2(fma(fp32(1.5·2^23 + acc_j), c_t, b_t))       (P scaled by 448, in (0, 448]; the
//             biased score is exact, and its bits are acc_j + bits(1.5·2^23), one integer add on the GPU)
//   l_t     = l_{t−1} · alpha_t + Σ_j e4m3(p_j)                (row sum of the weights the products
//             use; the GPU kernel takes it from the tensor core, with the P·V product)
//   O_t[c]  = fma(O_{t−1}[c], alpha_t, Σ_j e4m3(p_j) · v8[j, c]) (per-tile sum, then one fp32 add)
//   out[c]  = bf16((O_T[c] · v_scale[c]) · (1 / l_T))          (the 448 cancels in O / l)
#pragma once

#include <cstdint>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// Rows per query scale (one wgmma M tile of the GPU kernel).
constexpr int64_t kInt8Fp8QBlock = 64;
// Rows per key scale, and keys per online-softmax tile.
constexpr int64_t kInt8Fp8KBlock = 128;
// P is quantized as e4m3(448 · P): its largest weight lands on e4m3's largest finite value.
constexpr float kInt8Fp8PScale = 448.0f;
constexpr float kInt8Fp8Log2PScale = 8.80735492205760410f;  // log2(448)
constexpr float kLog2e = 1.4426950408889634f;
// 1.5·2^23: fp32(kInt8Fp8ScoreBias + acc) is exact for |acc| < 2^22, and its bits are
// acc + 0x4B400000 — the GPU's int32 → fp32 without a conversion instruction.
constexpr float kInt8Fp8ScoreBias = 12582912.0f;

// The quantized operands of one call (unpadded, head-major).
struct Int8Fp8Quantized {
  int64_t nq = 0, nk = 0, heads = 0, d = 0;
  std::vector<int8_t> q;        // [H, Nq, D]
  std::vector<int8_t> k;        // [H, Nk, D], smoothed
  std::vector<uint8_t> v;       // [H, Nk, D], e4m3 bits
  std::vector<float> q_scale;   // [H, ceil(Nq / kInt8Fp8QBlock)]
  std::vector<float> k_scale;   // [H, ceil(Nk / kInt8Fp8KBlock)]
  std::vector<float> v_scale;   // [H, D]
  std::vector<float> k_mean;    // [H, D]

  int64_t q_blocks() const { return (nq + kInt8Fp8QBlock - 1) / kInt8Fp8QBlock; }
  int64_t k_blocks() const { return (nk + kInt8Fp8KBlock - 1) / kInt8Fp8KBlock; }
};

// q: [Nq, H, D]; k, v: [Nk, H, D]; F32 or BF16 host views, any strides on N and H, unit stride on D.
// D <= 1024 (acc stays exact in fp32). Nq, Nk >= 1.
Result<Int8Fp8Quantized> quantize_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v);

// out: [Nq, H, D] (F32 or BF16, any strides on N and H). `scale` is the softmax scale (> 0).
Status attention_int8fp8_quantized(const Int8Fp8Quantized& quantized, const TensorView& out, float scale);

// Only the query rows `rows` (indices into Nq): out is [rows.size(), H, D].
Status attention_int8fp8_rows(const Int8Fp8Quantized& quantized, const std::vector<int64_t>& rows,
                              const TensorView& out, float scale);

// quantize_int8fp8 then attention_int8fp8_quantized.
Status attention_int8fp8(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         float scale);

}  // namespace vortex::cpu
