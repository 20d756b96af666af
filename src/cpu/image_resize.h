// Image resampling as Pillow does it (Image.resize with LANCZOS on an 8-bit RGB image), bit for bit:
// the H3 pipeline stretches or cover-crops keyframes onto the canvas with it, and the conditioning
// latents follow every pixel.
//
// Pillow's algorithm (libImaging/Resample.c), restated: each axis gets per-output-pixel filter
// taps. For an axis of n input pixels resized to m: scale = n / m, filterscale = max(scale, 1),
// support = 3 · filterscale (Lanczos-3); output pixel i is centred at (i + 0.5) · scale, reads input
// pixels [xmin, xmax) with xmin = max(0, int(center - support + 0.5)), xmax = min(n, int(center +
// support + 0.5)), weights lanczos((x - center + 0.5) / filterscale) with lanczos(x) = sinc(x) ·
// sinc(x / 3) on |x| < 3 (x = -3 included), normalised to sum 1, then converted to fixed point with
// 22 fraction bits, rounded half away from zero. A pass sums uint8 · coefficient in int32 from
// 2^21 (the rounding half) and clips to [0, 255] after the shift. The horizontal pass runs first
// (only over the rows the vertical pass will read), its 8-bit result feeds the vertical pass; an
// axis whose size does not change is not resampled.
#pragma once

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// rgb: U8 [H, W, 3] contiguous. Returns U8 [height, width, 3]; the same size is a copy.
Result<Tensor> resize_lanczos_rgb8(const Tensor& rgb, int64_t height, int64_t width);

}  // namespace vortex::cpu
