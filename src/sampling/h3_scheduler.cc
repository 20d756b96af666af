#include "sampling/h3_scheduler.h"

#include <cmath>

namespace vortex::sampling {

std::vector<float> torch_linspace(float start, float end, int steps) {
  std::vector<float> out(steps);
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  // The two halves are anchored at their own end, which keeps the last value exactly `end`.
  // PyTorch's build contracts `start + step * i` into one fused multiply-add (one rounding);
  // the reference's sigma grids for 2..50 steps match bit for bit only with the fma.
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; ++i) {
    out[i] = i < halfway ? std::fma(step, static_cast<float>(i), start)
                         : std::fma(-step, static_cast<float>(steps - i - 1), end);
  }
  return out;
}

Result<std::vector<float>> sigma_grid(int steps, float shift) {
  if (steps < 2) return invalid_argument("steps must be >= 2 (grid points including the final 0), got " +
                                         std::to_string(steps));
  if (!(shift > 0.0f)) return invalid_argument("shift must be positive");
  std::vector<float> sigmas;
  for (float base : torch_linspace(1.0f, 0.0f, steps)) {
    const float numerator = shift * base;
    const float denominator = 1.0f + (shift - 1.0f) * base;
    const float sigma = numerator / denominator;
    if (sigmas.empty() || sigmas.back() != sigma) sigmas.push_back(sigma);
  }
  return sigmas;
}

std::vector<float> timesteps_from_sigmas(const std::vector<float>& sigmas) {
  std::vector<float> t;
  for (size_t i = 0; i + 1 < sigmas.size(); ++i) t.push_back(1.0f - sigmas[i]);
  return t;
}

Status euler_step(const Tensor& sample, const Tensor& velocity, float timestep, float sigma, float sigma_next) {
  if (sample.dtype() != DType::kF32 || velocity.dtype() != DType::kF32 || sample.shape() != velocity.shape() ||
      !sample.is_contiguous() || !velocity.is_contiguous()) {
    return invalid_argument("euler_step: sample " + sample.describe() + " and velocity " + velocity.describe() +
                            " must be contiguous F32 of one shape");
  }
  float* x = sample.data_as<float>();
  const float* v = velocity.data_as<float>();
  const float sigma_from_t = 1.0f - timestep;  // the reference keeps this apart from the grid sigma
  const float ratio = sigma_next / sigma;
  const float keep = 1.0f - ratio;
  for (int64_t i = 0; i < sample.numel(); ++i) {
    const float denoised = x[i] + sigma_from_t * v[i];
    x[i] = ratio * x[i] + keep * denoised;
  }
  return ok_status();
}

}  // namespace vortex::sampling
