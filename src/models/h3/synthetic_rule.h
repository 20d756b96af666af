// How each synthetic weight is made (DESIGN section 1: the canonical benchmark weights): a pure
// function of the tensor's diffusers name, shared by the host writer (synthetic.cc) and the
// device filler (cuda/synthetic_fill.cu), so that a checkpoint written on the CPU and weights
// filled straight on the GPU are bit-identical.
//
//   matrices [O, I]:  Philox normal(seed, stream = fnv1a64(name), element) * 1/sqrt(I)
//   modulation (`*.adaln_proj.linear.weight`, `norm_out.linear.weight`): * 0.1/sqrt(I)
//   biases: 0;  1-D norm weights: 1
// The product is formed in fp32 and then rounded to the storage dtype (RNE).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "models/h3/weights.h"

namespace vortex::h3 {

inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct SyntheticInit {
  enum class Kind { kNormal, kConstant } kind = Kind::kNormal;
  float scale = 1.0f;     // kNormal: multiplier of the standard normal
  float constant = 0.0f;  // kConstant: the value
  uint64_t stream = 0;
};

inline SyntheticInit synthetic_init(const TensorSpec& spec) {
  SyntheticInit init;
  init.stream = fnv1a64(spec.name);
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return spec.name.size() >= s.size() && spec.name.compare(spec.name.size() - s.size(), s.size(), s) == 0;
  };
  if (spec.shape.rank() == 1) {
    init.kind = SyntheticInit::Kind::kConstant;
    init.constant = ends_with(".bias") ? 0.0f : 1.0f;
    return init;
  }
  const double fan_in = static_cast<double>(spec.shape[1]);
  const bool modulation = ends_with(".adaln_proj.linear.weight") || spec.name == "norm_out.linear.weight";
  init.scale = static_cast<float>((modulation ? 0.1 : 1.0) / std::sqrt(fan_in));
  return init;
}

}  // namespace vortex::h3
