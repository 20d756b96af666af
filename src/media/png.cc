// PNG writers and the RGB reader on libpng (see png.h). Frames are encoded into memory and written
// with the shared atomic file write, and files are read whole before decoding, so libpng never
// touches the file system.
#include "media/png.h"

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/parallel.h"
#include "formats/safetensors.h"
#include "media/media_common.h"

namespace vortex::media {

namespace {

// Where libpng's callbacks put the encoded bytes and the text of a fatal error.
struct PngSink {
  std::string bytes;
  char error[256] = {0};
};

void on_error(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->error, sizeof(sink->error), "%s", message);
  png_longjmp(png, 1);
}

// Warnings (e.g. about ancillary chunks) are not failures; they would only be noise on stderr.
void on_warning(png_structp, png_const_charp) {}

void on_write(png_structp png, png_bytep data, size_t size) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  bool appended = true;
  try {
    sink->bytes.append(reinterpret_cast<const char*>(data), size);
  } catch (...) {
    appended = false;
  }
  // png_error longjmps; it must not run inside the catch block, which would leak the exception.
  if (!appended) png_error(png, "out of memory while encoding");
}

void on_flush(png_structp) {}

// Encodes interleaved RGB rows into sink->bytes. libpng reports errors by longjmp to the setjmp
// below, so this frame holds no object with a destructor and nothing it changes after setjmp.
bool encode_rgb(const uint8_t* rgb, uint32_t width, uint32_t height, PngSink* sink) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, sink, on_error, on_warning);
  if (png == nullptr) {
    std::snprintf(sink->error, sizeof(sink->error), "png_create_write_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    std::snprintf(sink->error, sizeof(sink->error), "png_create_info_struct failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, sink, on_write, on_flush);
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (uint32_t y = 0; y < height; ++y) {
    png_write_row(png, const_cast<png_bytep>(rgb + static_cast<size_t>(y) * width * 3));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

Result<std::string> encode_png(const uint8_t* rgb, int64_t width, int64_t height, const std::string& what) {
  // PNG dimensions are 31-bit; libpng's own default limit (1,000,000) reports anything smaller.
  if (width > 0x7fffffff || height > 0x7fffffff) {
    return invalid_argument(what + ": " + std::to_string(height) + "x" + std::to_string(width) +
                            " is larger than PNG allows");
  }
  PngSink sink;
  if (!encode_rgb(rgb, static_cast<uint32_t>(width), static_cast<uint32_t>(height), &sink)) {
    return invalid_argument(what + ": libpng: " + sink.error);
  }
  return std::move(sink.bytes);
}

Status write_png_u8(const std::string& path, const Tensor& frame) {
  const std::string what = path + ": frame";
  if (frame.device() != Device::kCpu) {
    return invalid_argument(what + ": " + frame.describe() + " is on " + device_name(frame.device()) +
                            "; copy it to the host first");
  }
  if (frame.rank() != 3 || frame.size(2) != 3 || frame.size(0) < 1 || frame.size(1) < 1) {
    return invalid_argument(what + ": shape " + frame.shape().to_string() + ", expected u8 [H, W, 3] with H, W >= 1");
  }
  const Tensor dense = frame.contiguous();
  VORTEX_ASSIGN_OR_RETURN(const std::string bytes,
                          encode_png(dense.data_as<const uint8_t>(), dense.size(1), dense.size(0), what));
  return write_file_atomically(path, bytes);
}

// What the reader's callbacks read from, what it decodes into, and the text of a failure.
struct PngSource {
  const std::string* bytes = nullptr;
  size_t offset = 0;
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::vector<png_bytep> rows;
  char error[256] = {0};
};

constexpr uint32_t kMaxReadSide = 16384;

void on_read(png_structp png, png_bytep data, size_t size) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->bytes->size() - src->offset < size) png_error(png, "the file ends inside the image data (truncated)");
  std::memcpy(data, src->bytes->data() + src->offset, size);
  src->offset += size;
}

void on_read_error(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof(src->error), "%s", message);
  png_longjmp(png, 1);
}

// Decodes src->bytes into src->rgb as 8-bit interleaved RGB (palette and gray expanded, 16-bit
// samples cut to their high byte); refuses alpha. As in encode_rgb, errors arrive by longjmp.
bool decode_rgb(PngSource* src) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, on_read_error, on_warning);
  if (png == nullptr) {
    std::snprintf(src->error, sizeof(src->error), "png_create_read_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(src->error, sizeof(src->error), "png_create_info_struct failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, src, on_read);
  png_read_info(png, info);
  src->width = png_get_image_width(png, info);
  src->height = png_get_image_height(png, info);
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if ((color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0) {
    png_error(png, "the image has an alpha channel or a transparent color; flatten it onto a background first");
  }
  if (src->width > kMaxReadSide || src->height > kMaxReadSide) {
    png_error(png, "the image is larger than 16384 pixels on a side");
  }
  if (depth == 16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_gray_to_rgb(png);
  }
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(src->width) * 3) png_error(png, "unexpected row layout");
  src->rgb.resize(static_cast<size_t>(src->width) * src->height * 3);
  src->rows.resize(src->height);
  for (uint32_t y = 0; y < src->height; ++y) src->rows[y] = src->rgb.data() + static_cast<size_t>(y) * src->width * 3;
  png_read_image(png, src->rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

}  // namespace

Result<Tensor> read_png_rgb8(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < 8 || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) != 0) {
    return invalid_argument(path + ": not a PNG file (no PNG signature in bytes 0-7)");
  }
  PngSource src;
  src.bytes = &bytes;
  if (!decode_rgb(&src)) {
    return invalid_argument(path + ": " + src.error + " (near byte " + std::to_string(src.offset) + ")");
  }
  Tensor out = Tensor::empty({src.height, src.width, 3}, DType::kU8);
  std::memcpy(out.data(), src.rgb.data(), src.rgb.size());
  return out;
}

Status write_png(const std::string& path, const Tensor& frame) {
  if (frame.defined() && frame.dtype() == DType::kU8) return write_png_u8(path, frame);
  const std::string what = path + ": frame";
  VORTEX_ASSIGN_OR_RETURN(const Tensor f, host_f32(frame, what, 3));
  if (f.size(0) != 3 || f.size(1) < 1 || f.size(2) < 1) {
    return invalid_argument(what + ": shape " + f.shape().to_string() +
                            ", expected f32 [3, H, W] (RGB planes) with H, W >= 1, or u8 [H, W, 3]");
  }
  VORTEX_RETURN_IF_ERROR(check_finite(f, what));
  const int64_t height = f.size(1), width = f.size(2), plane = height * width;
  const float* p = f.data_as<const float>();
  std::vector<uint8_t> rgb(static_cast<size_t>(plane) * 3);
  planes_to_rgb(p, p + plane, p + 2 * plane, plane, rgb.data());
  VORTEX_ASSIGN_OR_RETURN(const std::string bytes, encode_png(rgb.data(), width, height, what));
  return write_file_atomically(path, bytes);
}

Status write_png_frames(const std::string& dir, const Tensor& video) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor v, checked_video(video, dir + ": video"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create the frame directory: " + ec.message());
  const int64_t frames = v.size(1), height = v.size(2), width = v.size(3), plane = height * width;
  const float* p = v.data_as<const float>();  // [3, F, H, W]
  const int64_t channel_stride = frames * plane;

  std::vector<std::string> paths(static_cast<size_t>(frames));
  for (int64_t f = 0; f < frames; ++f) {
    char name[32];
    std::snprintf(name, sizeof(name), "frame_%05lld.png", static_cast<long long>(f));
    paths[f] = (std::filesystem::path(dir) / name).string();
  }
  std::vector<Status> statuses(static_cast<size_t>(frames));
  parallel_for(0, frames, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> rgb(static_cast<size_t>(plane) * 3);
    for (int64_t f = begin; f < end; ++f) {
      const float* r = p + f * plane;
      planes_to_rgb(r, r + channel_stride, r + 2 * channel_stride, plane, rgb.data());
      Result<std::string> bytes = encode_png(rgb.data(), width, height, paths[f]);
      statuses[f] = bytes.ok() ? write_file_atomically(paths[f], *bytes) : bytes.status();
    }
  });
  for (int64_t f = 0; f < frames; ++f) {
    if (statuses[f].ok()) continue;
    // No partial frame sequence: remove what this call did write.
    for (int64_t g = 0; g < frames; ++g) {
      if (statuses[g].ok()) std::filesystem::remove(paths[g], ec);
    }
    return statuses[f];
  }
  return ok_status();
}

}  // namespace vortex::media
