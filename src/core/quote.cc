// One quoting rule for every reader's messages (quote.h).
#include "core/quote.h"

#include <algorithm>
#include <cstdio>

namespace vortex {

std::string quote(const std::string& text) {
  constexpr size_t kMaxShown = 160;
  size_t shown = std::min(text.size(), kMaxShown);
  // Do not cut a UTF-8 sequence in half: back up to the start of the character.
  while (shown < text.size() && shown > 0 && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80) {
    --shown;
  }
  std::string out = "'";
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '\'';
  if (shown < text.size()) out += " (" + std::to_string(text.size()) + " bytes, shortened)";
  return out;
}

}  // namespace vortex
