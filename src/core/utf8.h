// UTF-8 well-formedness (RFC 3629): what the prompt tokenizer refuses and what quote() escapes.
#pragma once

#include <cstddef>
#include <string_view>

namespace vortex {

// The length (1 to 4) of the well-formed UTF-8 character starting at s[i], or 0 when the bytes
// there are not one: a stray continuation byte, an overlong form, a surrogate, a code point past
// U+10FFFF, or a sequence cut short by the end of s. i < s.size().
size_t utf8_sequence_length(std::string_view s, size_t i);

// The byte offset of the first byte that does not start a well-formed character, or npos.
size_t first_invalid_utf8(std::string_view s);

}  // namespace vortex
