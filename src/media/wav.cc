// 16-bit PCM WAVE writer (see wav.h).
#include "media/wav.h"

#include <cstdint>
#include <limits>

#include "formats/safetensors.h"
#include "media/media_common.h"

namespace vortex::media {

namespace {

void put_u16(std::string& out, uint16_t v) {
  out += static_cast<char>(v & 0xff);
  out += static_cast<char>(v >> 8);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// Far above any real rate; keeps the u32 byte-rate field from overflowing.
constexpr int kMaxSampleRate = 768000;

}  // namespace

Status write_wav(const std::string& path, const Tensor& audio, int sample_rate) {
  const std::string what = path + ": audio";
  VORTEX_ASSIGN_OR_RETURN(const Tensor a, checked_audio(audio, what, 2));
  if (sample_rate <= 0 || sample_rate > kMaxSampleRate) {
    return invalid_argument(path + ": sample_rate " + std::to_string(sample_rate) + " is outside 1.." +
                            std::to_string(kMaxSampleRate));
  }
  const int64_t channels = a.size(0), samples = a.size(1);
  const uint64_t data_bytes = static_cast<uint64_t>(channels) * static_cast<uint64_t>(samples) * 2;
  // RIFF sizes are u32 and the RIFF chunk size counts 36 header bytes besides the data.
  if (data_bytes > std::numeric_limits<uint32_t>::max() - 36) {
    return invalid_argument(what + ": " + a.describe() + " is " + std::to_string(data_bytes) +
                            " bytes of PCM, over the 4 GiB limit of a WAVE file");
  }
  const uint32_t block_align = static_cast<uint32_t>(channels) * 2;

  std::string out;
  out.reserve(44 + data_bytes);
  out += "RIFF";
  put_u32(out, static_cast<uint32_t>(36 + data_bytes));
  out += "WAVE";
  out += "fmt ";
  put_u32(out, 16);                  // fmt chunk size for plain PCM
  put_u16(out, 1);                   // WAVE_FORMAT_PCM
  put_u16(out, static_cast<uint16_t>(channels));
  put_u32(out, static_cast<uint32_t>(sample_rate));
  put_u32(out, static_cast<uint32_t>(sample_rate) * block_align);  // bytes per second
  put_u16(out, static_cast<uint16_t>(block_align));
  put_u16(out, 16);                  // bits per sample
  out += "data";
  put_u32(out, static_cast<uint32_t>(data_bytes));
  const float* p = a.data_as<const float>();  // [C, S]
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t c = 0; c < channels; ++c) put_u16(out, static_cast<uint16_t>(unit_to_s16(p[c * samples + s])));
  }
  return write_file_atomically(path, out);
}

}  // namespace vortex::media
