// The H3 sampler: rectified-flow Euler (eta = 0) over a shifted sigma grid, data-ward velocity.
//
// Grid: torch.linspace(1, 0, steps) in float32, shifted by s*sigma / (1 + (s-1)*sigma), consecutive
// duplicates removed; `steps` counts grid points including the final 0, so a request makes
// len(grid) - 1 forwards. Timestep t = 1 - sigma (t = 1 is clean). Video uses shift 12 and audio
// shift 3: two grids stepped in one loop, one forward per step.
// Step: x0 = x + (1 - t) * v;  x_next = r * x + (1 - r) * x0 with r = sigma_next / sigma, all fp32,
// each operation rounded as the reference's separate tensor ops round it.
#pragma once

#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::sampling {

constexpr float kVideoShift = 12.0f;
constexpr float kAudioShift = 3.0f;

// float32 torch.linspace(start, end, steps) as PyTorch's CPU kernel computes it.
std::vector<float> torch_linspace(float start, float end, int steps);

// Errors: steps < 2, shift <= 0.
Result<std::vector<float>> sigma_grid(int steps, float shift);
std::vector<float> timesteps_from_sigmas(const std::vector<float>& sigmas);  // 1 - sigma[:-1]

// sample: F32 [N, C] updated in place; velocity: F32 [N, C].
Status euler_step(const Tensor& sample, const Tensor& velocity, float timestep, float sigma, float sigma_next);

}  // namespace vortex::sampling
