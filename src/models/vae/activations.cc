#include "models/vae/activations.h"

#include <cmath>

#include "core/parallel.h"
#include "core/portable_math.h"

namespace vortex::vae {

namespace {

Result<std::vector<float>> channel_values(const std::string& what, const Tensor& t) {
  if (!t.defined() || t.device() != Device::kCpu || !dtype_is_float(t.dtype())) {
    return invalid_argument("tensor '" + what + "' must be a float CPU tensor");
  }
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(element_as_double(t, i));
  return out;
}

}  // namespace

Result<SnakeParams> snake_params(const std::string& what, const Tensor& alpha) {
  VORTEX_ASSIGN_OR_RETURN(std::vector<float> a, channel_values(what + ".alpha", alpha));
  SnakeParams p;
  p.frequency = a;
  for (float v : a) p.magnitude.push_back(1.0f / (v + 1e-9f));
  return p;
}

Result<SnakeParams> snake_beta_params(const std::string& what, const Tensor& alpha, const Tensor& beta) {
  VORTEX_ASSIGN_OR_RETURN(std::vector<float> a, channel_values(what + ".alpha", alpha));
  VORTEX_ASSIGN_OR_RETURN(std::vector<float> b, channel_values(what + ".beta", beta));
  if (a.size() != b.size()) {
    return invalid_argument("snake_beta '" + what + "': alpha has " + std::to_string(a.size()) + " channels, beta " +
                            std::to_string(b.size()));
  }
  SnakeParams p;
  for (size_t c = 0; c < a.size(); ++c) {
    p.frequency.push_back(portable_expf(a[c]));
    p.magnitude.push_back(1.0f / (portable_expf(b[c]) + 1e-9f));
  }
  return p;
}

Status apply_snake(const SnakeParams& params, Tensor& x) {
  const int64_t C = params.channels();
  if (!x.defined() || x.dtype() != DType::kF32 || !x.is_contiguous() || x.rank() < 1 || x.size(-1) != C ||
      static_cast<int64_t>(params.magnitude.size()) != C) {
    return invalid_argument("snake: x " + (x.defined() ? x.describe() : std::string("(undefined)")) +
                            " must be contiguous F32 with " + std::to_string(C) + " channels last");
  }
  if (C == 0) return ok_status();
  const int64_t rows = x.numel() / C;
  float* xd = x.data_as<float>();
  const float* f = params.frequency.data();
  const float* m = params.magnitude.data();
  parallel_for(
      0, rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = xd + r * C;
          for (int64_t c = 0; c < C; ++c) {
            const float s = portable_sinf(f[c] * row[c]);
            row[c] = row[c] + m[c] * (s * s);
          }
        }
      },
      std::max<int64_t>(1, 8192 / C));
  return ok_status();
}

}  // namespace vortex::vae
