// RMSNorm family (CPU reference).
//
//   rms_norm:        y = R(x * rsqrt(mean(x^2) + eps) * weight)       over the last dim
//   layer_norm:      y = R((x - mean) · rsqrt(var + eps) · weight + bias)   over the last dim
//                    (biased variance; the statistics in double, the rest in fp32)
//   adaln_modulate:  y = R(R(x * R(1 + scale[row])) + shift[row])    per-row table lookup
//
// R rounds to y's dtype (identity for F32). rms_norm rounds once: PyTorch 2.11's fused RMSNorm
// (the reference's) keeps the normalised value in fp32 through the weight multiply. Measured on
// the bf16 goldens, rounding before the weight instead (the older composite RMSNorm) moves the
// block outputs 1.6x further from the reference. The three roundings of adaln_modulate are the
// three bf16 elementwise ops of `norm * (1 + scale) + shift` in the reference block.
#pragma once

#include <cstdint>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// Where rms_norm rounds: once at the end (the H3 reference's fused RMSNorm), or also before the
// weight multiply, y = R(weight * R(x * rsqrt(mean(x^2) + eps))) (the Qwen3 text encoder's own
// RMSNorm module, which casts the normalised value back to the input dtype and then multiplies).
enum class RmsNormRounding { kOnce, kBeforeWeight };

// x, y: [N, C] or [N, H, D] (normalised over the last dim), may alias. weight: [C] or null.
Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y,
                RmsNormRounding rounding = RmsNormRounding::kOnce);

// x, y: [N, C], may alias; weight, bias: [C].
Status layer_norm(const TensorView& x, const TensorView& weight, const TensorView& bias, float eps,
                  const TensorView& y);

// x, y: [N, C] (may alias); shift, scale: [R, C] views (rows of a modulation table);
// row: [N] indices into the table rows.
Status adaln_modulate(const TensorView& x, const TensorView& shift, const TensorView& scale,
                      const std::vector<int32_t>& row, const TensorView& y);

}  // namespace vortex::cpu
