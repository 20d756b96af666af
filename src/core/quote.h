// Untrusted text (a tensor name from a file's header, a chunk tag of a media file) as it appears
// in an error message.
#pragma once

#include <string>

namespace vortex {

// 'text' for an error message: bytes below 0x20, 0x7F and every byte that is not part of a
// well-formed UTF-8 character escaped as \xNN, and text past 160 bytes shortened (never inside a
// character; the full length said), so that a hostile file or request can neither break the
// one-line message rule, nor make a message megabytes long, nor put invalid UTF-8 into a JSON
// error (which the JSON writer would refuse).
std::string quote(const std::string& text);

}  // namespace vortex
