// Input checks, quantisers and the temp file of the media writers (see media_common.h).
#include "media/media_common.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vortex::media {

Result<Tensor> host_f32(const Tensor& tensor, const std::string& what, int rank) {
  if (!tensor.defined()) return invalid_argument(what + ": undefined tensor");
  if (tensor.device() != Device::kCpu) {
    return invalid_argument(what + ": " + tensor.describe() + " is on " + device_name(tensor.device()) +
                            "; copy it to the host first");
  }
  if (tensor.rank() != rank) {
    return invalid_argument(what + ": rank " + std::to_string(tensor.rank()) + " (" + tensor.describe() +
                            "), expected rank " + std::to_string(rank));
  }
  switch (tensor.dtype()) {
    case DType::kF32: return tensor.contiguous();
    case DType::kBF16:
    case DType::kF16: return tensor.to(DType::kF32);
    default:
      return invalid_argument(what + ": dtype " + dtype_name(tensor.dtype()) + " (" + tensor.describe() +
                              "), expected F32 (or BF16/F16)");
  }
}

Status check_finite(const Tensor& f32, const std::string& what) {
  const float* p = f32.data_as<const float>();
  const int64_t n = f32.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(p[i])) continue;
    // Flat index -> coordinates, last dimension fastest.
    std::vector<int64_t> at(f32.rank());
    for (int64_t d = f32.rank() - 1, rem = i; d >= 0; --d) {
      at[d] = rem % f32.shape()[static_cast<int>(d)];
      rem /= f32.shape()[static_cast<int>(d)];
    }
    std::string coords;
    for (size_t d = 0; d < at.size(); ++d) coords += (d ? ", " : "") + std::to_string(at[d]);
    const char* kind = std::isnan(p[i]) ? "NaN" : (p[i] > 0 ? "+inf" : "-inf");
    return invalid_argument(what + ": element " + std::to_string(i) + " [" + coords + "] of " + f32.describe() +
                            " is " + kind);
  }
  return ok_status();
}

Result<Tensor> checked_video(const Tensor& video, const std::string& what) {
  VORTEX_ASSIGN_OR_RETURN(Tensor v, host_f32(video, what, 4));
  if (v.size(0) != 3) {
    return invalid_argument(what + ": shape " + v.shape().to_string() + ": dim 0 (channels) is " +
                            std::to_string(v.size(0)) + ", expected 3 (RGB) in [3, F, H, W]");
  }
  static const char* kNames[] = {"channels", "frames F", "height H", "width W"};
  for (int d = 1; d < 4; ++d) {
    if (v.size(d) < 1) {
      return invalid_argument(what + ": shape " + v.shape().to_string() + ": dim " + std::to_string(d) + " (" +
                              kNames[d] + ") is empty");
    }
  }
  VORTEX_RETURN_IF_ERROR(check_finite(v, what));
  return v;
}

Result<Tensor> checked_audio(const Tensor& audio, const std::string& what, int max_channels) {
  VORTEX_ASSIGN_OR_RETURN(Tensor a, host_f32(audio, what, 2));
  if (a.size(0) < 1 || a.size(0) > max_channels) {
    return invalid_argument(what + ": shape " + a.shape().to_string() + ": dim 0 (channels) is " +
                            std::to_string(a.size(0)) + ", expected 1.." + std::to_string(max_channels) +
                            " in [C, S]");
  }
  VORTEX_RETURN_IF_ERROR(check_finite(a, what));
  return a;
}

void planes_to_rgb(const float* r, const float* g, const float* b, int64_t n, uint8_t* rgb) {
  for (int64_t i = 0; i < n; ++i) {
    rgb[3 * i + 0] = unit_to_u8(r[i]);
    rgb[3 * i + 1] = unit_to_u8(g[i]);
    rgb[3 * i + 2] = unit_to_u8(b[i]);
  }
}

TempFile::TempFile(std::string path) : final_(std::move(path)) {
  tmp_ = final_ + ".tmp-" + std::to_string(::getpid());
}

TempFile::~TempFile() {
  if (!committed_) ::unlink(tmp_.c_str());
}

Status TempFile::commit() {
  // The data must be on disk before the rename makes it visible, or a crash could expose a hole.
  const int fd = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(final_ + ": cannot reopen " + tmp_ + " to fsync it: " + std::strerror(errno));
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  if (!synced) return io_error(tmp_ + ": fsync failed: " + std::strerror(sync_errno));
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    return io_error(final_ + ": cannot rename " + tmp_ + " over it: " + std::strerror(errno));
  }
  committed_ = true;
  return ok_status();
}

}  // namespace vortex::media
