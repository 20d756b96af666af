// PNG writers (libpng): one RGB frame, or every frame of a video as numbered files; and an RGB reader.
// Built only when libpng and libav* are found (VORTEX_HAVE_MEDIA).
#pragma once

#include <string>

#include "vortex/tensor.h"

namespace vortex::media {

// Writes one frame as an 8-bit RGB PNG (no alpha, default zlib level). `frame` is either
//   f32 [3, H, W] planes with values in [0, 1] (bf16/f16 accepted): each value is clipped to
//   [0, 1] and mapped to round(x * 255), half up; or
//   u8 [H, W, 3] interleaved RGB, written as is.
// Strided views are fine. The file appears atomically (`<path>.tmp-<pid>`, fsync, rename) and
// nothing is left behind on failure. Errors: invalid_argument naming the tensor and field
// (device, dtype, rank, shape, the first NaN/inf element); io_error when writing fails.
Status write_png(const std::string& path, const Tensor& frame);

// Writes each frame of `video` f32 [3, F, H, W] (values in [0, 1], clipped) as
// `dir/frame_00000.png`, `frame_00001.png`, ... (five digits, more past 99999), creating `dir`
// when missing. The whole video is checked (shape, NaN/inf) before any file is written; frames
// are encoded in parallel. On any failure the frames this call wrote are removed again.
Status write_png_frames(const std::string& dir, const Tensor& video);

// Reads a PNG as u8 [H, W, 3] interleaved RGB (a keyframe). Palette and gray images are expanded
// to RGB and 16-bit samples cut to their high byte (what PIL's RGB conversion keeps); an alpha
// channel or a transparent color is refused (the reference does not flatten it), as are sides over
// 16384. Errors: not_found when the file cannot be opened; invalid_argument naming the file and
// what is wrong (no PNG signature, truncated data near byte N, libpng's message).
Result<Tensor> read_png_rgb8(const std::string& path);

}  // namespace vortex::media
