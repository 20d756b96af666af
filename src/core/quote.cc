// One quoting rule for every reader's and the server's messages (quote.h).
#include "core/quote.h"

#include <cstdio>

#include "core/utf8.h"

namespace vortex {
namespace {

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
