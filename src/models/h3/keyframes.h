// Keyframe images onto the request's canvas, as the reference pipeline puts them there
// (MiniMaxH3ResizeStep): the canvas from the first keyframe's size, the first keyframe stretched
// to it, a following one cover-cropped. Pixels are Pillow's LANCZOS (cpu/image_resize.h).
#pragma once

#include <cstdint>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

struct Canvas {
  int64_t height = 0;
  int64_t width = 0;
};

// The released checkpoint's canvas rules (resolve_canvas_size): the short edge set to 768, the area
// capped at 768 · 1344 by scaling both sides by sqrt(cap / area), each side then rounded to the
// nearest multiple of 32 (half to even, at least 32). The aspect ratio must lie in [1/4, 4]: an
// error names it otherwise.
Result<Canvas> keyframe_canvas(int64_t image_width, int64_t image_height);

// rgb: U8 [H, W, 3]. A keyframe already at the canvas size is returned as is. Keyframe 0 (the one
// the canvas follows) is stretched onto the canvas; any later one is scaled by the larger of the
// canvas/image axis ratios to sizes max(canvas, round(side · scale)) and its centre cropped
// ((size - canvas) // 2 from the top left).
Result<Tensor> fit_keyframe(const Tensor& rgb, const Canvas& canvas, int index);

}  // namespace vortex::h3
