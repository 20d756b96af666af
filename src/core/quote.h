// Untrusted text (a tensor name from a file's header, a chunk tag of a media file) as it appears
// in an error message.
#pragma once

#include <string>

namespace vortex {

// 'text' for an error message: bytes below 0x20 and 0x7F escaped as \xNN and text past 160 bytes
// shortened (at a UTF-8 character boundary, the full length said), so that a hostile file can
// neither break the one-line message rule nor make a message megabytes long.
std::string quote(const std::string& text);

}  // namespace vortex
