// One quoting rule for every reader's and the server's messages (quote.h).
#include "core/quote.h"

#include <cstdio>

namespace vortex {
namespace {

// The length of the well-formed UTF-8 sequence at text[i] (1 to 4), or 0 when the bytes there are
// not one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
size_t utf8_sequence_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

void append_escaped(std::string& out, unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\x%02X", c);
  out += buf;
}

}  // namespace

std::string quote(const std::string& text) {
  constexpr size_t kMaxShown = 160;
  std::string out = "'";
  size_t i = 0;
  while (i < text.size() && i < kMaxShown) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0 || c < 0x20 || c == 0x7F) {
      append_escaped(out, c);
      ++i;
    } else {
      // A whole character or none: a sequence is never cut at the length limit.
      if (i + length > kMaxShown && length > 1) break;
      out.append(text, i, length);
      i += length;
    }
  }
  out += '\'';
  if (i < text.size()) out += " (" + std::to_string(text.size()) + " bytes, shortened)";
  return out;
}

}  // namespace vortex
