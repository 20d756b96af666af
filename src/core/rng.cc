#include "core/rng.h"

namespace vortex {

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t first_element) {
  // One Philox call per block of four; the first and last blocks of the range may be partial.
  int64_t i = 0;
  while (i < n) {
    const uint64_t element = static_cast<uint64_t>(first_element + i);
    const F32x4 z = normal4_at_block(seed, stream, element / 4);
    for (uint64_t lane = element % 4; lane < 4 && i < n; ++lane) out[i++] = z.v[lane];
  }
}

}  // namespace vortex
