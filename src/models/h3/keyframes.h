// Keyframe images onto the request's canvas, as the reference pipeline puts them there
// (MiniMaxH3ResizeStep): the canvas from the first keyframe's size, the first keyframe stretched
// to it, a following one cover-cropped; and ref2va's image references onto their own size
// (MiniMaxH3Ref2VASetupStep). Pixels are Pillow's LANCZOS (cpu/image_resize.h).
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

// The released checkpoint's reference_image_short_edge: an image reference is encoded at this
// short edge whatever canvas the request generates at (upscaled if need be, no area cap).
constexpr int64_t kReferenceImageShortEdge = 2048;

// An image reference's size: scale = short_edge / min(w, h), each side round(side · scale / 32) · 32
// (half to even, at least 32). The aspect ratio must lie in [1/4, 4]: an error names it otherwise.
Result<Canvas> reference_image_size(int64_t image_width, int64_t image_height,
                                    int64_t short_edge = kReferenceImageShortEdge);

// rgb: U8 [H, W, 3] resized to reference_image_size (as is when it is that size already).
Result<Tensor> fit_reference_image(const Tensor& rgb, int64_t short_edge = kReferenceImageShortEdge);

}  // namespace vortex::h3
