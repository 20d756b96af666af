// Helpers shared by the safetensors reader, writer and sharded-checkpoint code (not public API).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/quote.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::safetensors_detail {

// An nlohmann exception's what() without its "[json.exception.parse_error.101] " tag, made safe
// for a one-line message.
std::string json_error_text(const char* what);

// What the writer needs of its input, checked before any file is created or removed: defined
// host tensors, names unique, UTF-8 and not the reserved "__metadata__", metadata in UTF-8.
// `where` prefixes the messages.
Status check_writable(const std::string& where,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata);

}  // namespace vortex::safetensors_detail
