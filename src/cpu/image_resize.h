// Separable resampling of 8-bit RGB images, bit for bit as two references do it:
//   resize_lanczos_rgb8   Pillow's Image.resize with LANCZOS: the H3 pipeline stretches or
//                         cover-crops keyframes onto the canvas with it, and the conditioning
//                         latents follow every pixel.
//   resize_bicubic_rgb8   PyTorch's interpolate(mode="bicubic", antialias=True) on a uint8 image,
//                         the resize torchvision's F.resize runs on uint8 tensors: the Qwen3-VL
//                         image and video processors bring pictures and video frames to their
//                         smart_resize size with it.
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
//
// PyTorch's uint8 antialiased resize (aten's separable upsample kernels) computes the same taps and
// normalised double weights for its filter, Keys' cubic with a = -0.5 on |x| < 2:
// ((a + 2)·x − (a + 3))·x² + 1 below 1, ((a·x − 5a)·x + 8a)·x − 4a from 1 to 2. It converts them to
// int16 with p fraction bits chosen per axis: the first p of 0..21 at which round(w_max · 2^(p+1))
// reaches 2^15 (22 if none), w_max the axis's largest weight, so that w_max · 2^p fits an int16.
// The passes are Pillow's with p fraction bits in place of 22, in the same order, with the same
// clipping.
#pragma once

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cpu {

// rgb: U8 [H, W, 3] contiguous. Returns U8 [height, width, 3]; the same size is a copy.
Result<Tensor> resize_lanczos_rgb8(const Tensor& rgb, int64_t height, int64_t width);
Result<Tensor> resize_bicubic_rgb8(const Tensor& rgb, int64_t height, int64_t width);

}  // namespace vortex::cpu
