// vortex inspect on a Qwen3-VL text encoder folder (what --text-encoder takes): its widths, the
// layers H3 reads, their bytes on the host and on --device cuda, and whether a tokenizer is beside it.
#pragma once

#include <string>

namespace vortex::cli {

// Whether `path` is such a folder (or a file in one): a config.json whose model_type is qwen3_vl
// or qwen3, or that holds a text_config.
bool is_text_encoder_checkpoint(const std::string& path);

// Prints the description (text, or one JSON object); returns the exit code (one-line error on
// failure, naming the tensor or field).
int inspect_text_encoder(const std::string& path, bool json);

}  // namespace vortex::cli
