#include "models/h3/keyframes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/portable_math.h"
#include "cpu/image_resize.h"

namespace vortex::h3 {

namespace {

constexpr int64_t kCanvasMultiple = 32;
constexpr double kCanvasShortEdge = 768.0;
constexpr double kCanvasMaxPixels = 768.0 * 1344.0;
constexpr double kMinAspect = 0.25, kMaxAspect = 4.0;


}  // namespace

Result<Canvas> keyframe_canvas(int64_t image_width, int64_t image_height) {
  if (image_width <= 0 || image_height <= 0) {
    return invalid_argument("keyframe size " + std::to_string(image_width) + "x" + std::to_string(image_height) +
                            " must be positive");
  }
  const double ratio = static_cast<double>(image_width) / static_cast<double>(image_height);
  if (!(kMinAspect <= ratio && ratio <= kMaxAspect)) {
    return invalid_argument("keyframe size " + std::to_string(image_width) + "x" + std::to_string(image_height) +
                            ": aspect ratio " + std::to_string(ratio) + " is outside the model's 1:4 to 4:1");
  }
  double width = ratio >= 1.0 ? kCanvasShortEdge * ratio : kCanvasShortEdge;
  double height = ratio >= 1.0 ? kCanvasShortEdge : kCanvasShortEdge / ratio;
  const double area = width * height;
  if (area > kCanvasMaxPixels) {
    // Python's (cap / area) ** 0.5; the square root is correctly rounded, as pow(x, 0.5) is in glibc.
    const double scale = std::sqrt(kCanvasMaxPixels / area);
    width *= scale;
    height *= scale;
  }
  const double m = static_cast<double>(kCanvasMultiple);
  return Canvas{std::max(kCanvasMultiple, python_round(height / m) * kCanvasMultiple),
                std::max(kCanvasMultiple, python_round(width / m) * kCanvasMultiple)};
}

Result<Tensor> fit_keyframe(const Tensor& rgb, const Canvas& canvas, int index) {
  if (!rgb.defined() || rgb.dtype() != DType::kU8 || rgb.rank() != 3 || rgb.size(2) != 3) {
    return invalid_argument("keyframe " + std::to_string(index + 1) + ": pixels " +
                            (rgb.defined() ? rgb.describe() : std::string("(undefined)")) + " must be U8 [H, W, 3]");
  }
  if (canvas.height < 1 || canvas.width < 1) return invalid_argument("keyframe canvas must be at least 1x1");
  const Tensor image = rgb.contiguous();
  const int64_t h = image.size(0), w = image.size(1);
  if (h == canvas.height && w == canvas.width) return image;
  if (index == 0) return cpu::resize_lanczos_rgb8(image, canvas.height, canvas.width);
  const double scale = std::max(static_cast<double>(canvas.width) / static_cast<double>(w),
                                static_cast<double>(canvas.height) / static_cast<double>(h));
  const int64_t rw = std::max(canvas.width, python_round(static_cast<double>(w) * scale));
  const int64_t rh = std::max(canvas.height, python_round(static_cast<double>(h) * scale));
  VORTEX_ASSIGN_OR_RETURN(Tensor resized, cpu::resize_lanczos_rgb8(image, rh, rw));
  const int64_t left = (rw - canvas.width) / 2, top = (rh - canvas.height) / 2;
  Tensor out = Tensor::empty({canvas.height, canvas.width, 3}, DType::kU8);
  for (int64_t y = 0; y < canvas.height; ++y) {
    std::memcpy(out.data_as<uint8_t>() + y * canvas.width * 3,
                resized.data_as<const uint8_t>() + ((top + y) * rw + left) * 3, static_cast<size_t>(canvas.width) * 3);
  }
  return out;
}

Result<Canvas> reference_image_size(int64_t image_width, int64_t image_height, int64_t short_edge) {
  const std::string size = std::to_string(image_width) + "x" + std::to_string(image_height);
  if (image_width <= 0 || image_height <= 0) {
    return invalid_argument("reference image size " + size + " must be positive");
  }
  if (short_edge < kCanvasMultiple) {
    return invalid_argument("reference short edge " + std::to_string(short_edge) + " is below " +
                            std::to_string(kCanvasMultiple));
  }
  if (image_width > 4 * image_height || image_height > 4 * image_width) {
    return invalid_argument("reference image size " + size + ": its aspect ratio is outside the model's 1:4 to 4:1");
  }
  const double scale = static_cast<double>(short_edge) / static_cast<double>(std::min(image_width, image_height));
  // Python's round(side * scale / 32) * 32 in float64, at least 32.
  const auto side = [&](int64_t length) {
    const double m = static_cast<double>(kCanvasMultiple);
    return std::max(kCanvasMultiple, python_round(static_cast<double>(length) * scale / m) * kCanvasMultiple);
  };
  return Canvas{side(image_height), side(image_width)};
}

Result<Tensor> fit_reference_image(const Tensor& rgb, int64_t short_edge) {
  if (!rgb.defined() || rgb.dtype() != DType::kU8 || rgb.rank() != 3 || rgb.size(2) != 3) {
    return invalid_argument("reference image: pixels " + (rgb.defined() ? rgb.describe() : std::string("(undefined)")) +
                            " must be U8 [H, W, 3]");
  }
  VORTEX_ASSIGN_OR_RETURN(const Canvas size, reference_image_size(rgb.size(1), rgb.size(0), short_edge));
  const Tensor image = rgb.contiguous();
  if (image.size(0) == size.height && image.size(1) == size.width) return image;
  return cpu::resize_lanczos_rgb8(image, size.height, size.width);
}

}  // namespace vortex::h3
