// Snake activations of the audio VAE (CPU reference, fp32), in place on time-major x[B, T, C].
//
//   snake       (DAC encoder):     y = x + (α + 1e-9)⁻¹ · sin(α·x)²,        α per channel
//   snake_beta  (BigVGAN decoder): y = x + (eᵝ + 1e-9)⁻¹ · sin(eᵅ·x)²,      α, β per channel, log space
//
// Both reduce to y = x + m · sin(f·x)² with a per-channel frequency f and magnitude m that are
// computed once, in fp32 as the reference computes them (exp, + 1e-9, reciprocal; the exp is
// core/portable_math.h's, since the GPU decoder reads f and m too), and then applied as the
// reference's elementwise ops: f·x, sin (core/portable_math.h's), square, m·s², x + that; one rounding each.
#pragma once

#include <string>
#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::vae {

struct SnakeParams {
  std::vector<float> frequency;  // f[C]
  std::vector<float> magnitude;  // m[C]
  int64_t channels() const { return static_cast<int64_t>(frequency.size()); }
};

// alpha: C values (stored [1, C, 1] by the reference), any float dtype.
Result<SnakeParams> snake_params(const std::string& what, const Tensor& alpha);
// alpha, beta: [C] each, log space.
Result<SnakeParams> snake_beta_params(const std::string& what, const Tensor& alpha, const Tensor& beta);

// x: contiguous F32 [B, T, C] (any rank whose last dim is C works), changed in place.
Status apply_snake(const SnakeParams& params, Tensor& x);

}  // namespace vortex::vae
