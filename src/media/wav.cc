// WAVE writer and reader (see wav.h).
#include "media/wav.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/quote.h"
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

namespace {

uint32_t get_u32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

uint16_t get_u16(const std::string& b, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(b[at]) | (static_cast<uint8_t>(b[at + 1]) << 8));
}

// One sample of `bits` at `p` (little-endian) as ffmpeg's conversion to float gives it.
float pcm_sample(const uint8_t* p, int bits, bool is_float) {
  if (is_float) {
    if (bits == 32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    double d;
    std::memcpy(&d, p, 8);
    return static_cast<float>(d);
  }
  switch (bits) {
    case 8: return static_cast<float>(static_cast<int>(p[0]) - 128) * (1.0f / 128.0f);
    case 16: return static_cast<float>(static_cast<int16_t>(p[0] | (p[1] << 8))) * (1.0f / 32768.0f);
    case 24: {
      const int32_t v = static_cast<int32_t>((static_cast<uint32_t>(p[0]) << 8) | (static_cast<uint32_t>(p[1]) << 16) |
                                             (static_cast<uint32_t>(p[2]) << 24));
      return static_cast<float>(v) * (1.0f / 2147483648.0f);  // as ffmpeg: the 24 bits shifted into s32
    }
    default: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<float>(v) * (1.0f / 2147483648.0f);
    }
  }
}

}  // namespace

Result<Waveform> read_wav(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (b.size() < 12 || b.compare(0, 4, "RIFF") != 0 || b.compare(8, 4, "WAVE") != 0) {
    return invalid_argument(path + ": byte 0: not a RIFF/WAVE file");
  }
  int format = 0, channels = 0, bits = 0, rate = 0;
  bool have_fmt = false;
  size_t at = 12;
  while (at + 8 <= b.size()) {
    const std::string id = b.substr(at, 4);
    const uint64_t size = get_u32(b, at + 4);
    const size_t body = at + 8;
    if (body + size > b.size()) {
      if (id != "data") {
        return invalid_argument(path + ": byte " + std::to_string(at) + ": chunk " + quote(id) + " of " +
                                std::to_string(size) + " bytes runs past the end of the file");
      }
    }
    if (id == "fmt ") {
      if (size < 16) return invalid_argument(path + ": byte " + std::to_string(at) + ": 'fmt ' chunk is too short");
      format = get_u16(b, body);
      channels = get_u16(b, body + 2);
      rate = static_cast<int>(get_u32(b, body + 4));
      bits = get_u16(b, body + 14);
      if (format == 0xFFFE && size >= 26) format = get_u16(b, body + 24);  // the sub-format GUID's first field
      have_fmt = true;
    } else if (id == "data") {
      if (!have_fmt) return invalid_argument(path + ": byte " + std::to_string(at) + ": 'data' before 'fmt '");
      const bool is_float = format == 3;
      if ((format != 1 && format != 3) || (format == 1 && bits != 8 && bits != 16 && bits != 24 && bits != 32) ||
          (format == 3 && bits != 32 && bits != 64)) {
        return invalid_argument(path + ": format " + std::to_string(format) + " with " + std::to_string(bits) +
                                " bits is not PCM (8/16/24/32) or IEEE float (32/64)");
      }
      if (channels < 1 || rate < 1) {
        return invalid_argument(path + ": " + std::to_string(channels) + " channels at " + std::to_string(rate) +
                                " Hz");
      }
      const size_t frame = static_cast<size_t>(channels) * (bits / 8);
      // A data chunk cut short (a stream that was never finalised) keeps its whole frames.
      const size_t bytes = std::min<size_t>(size, b.size() - body) / frame * frame;
      const int64_t samples = static_cast<int64_t>(bytes / frame);
      if (samples < 1) return invalid_argument(path + ": byte " + std::to_string(at) + ": no samples");
      Waveform w;
      w.sample_rate = rate;
      w.samples = Tensor::empty({channels, samples}, DType::kF32);
      float* out = w.samples.data_as<float>();
      const uint8_t* p = reinterpret_cast<const uint8_t*>(b.data() + body);
      for (int64_t s = 0; s < samples; ++s) {
        for (int c = 0; c < channels; ++c, p += bits / 8) out[c * samples + s] = pcm_sample(p, bits, is_float);
      }
      return w;
    }
    at = body + size + (size & 1);  // chunks are padded to an even size
  }
  return invalid_argument(path + ": no 'data' chunk");
}

}  // namespace vortex::media
