// vortex inspect on a LoRA adapter file: the layout it was read as, its partition, where its scales
// come from, and the modules it changes (by kind, rank and scale), checked against a checkpoint's
// config (--model) or the released model's.
#pragma once

#include <string>

namespace vortex::cli {

// Whether `path` is a single .safetensors file whose tensors are LoRA factors.
bool is_lora_file(const std::string& path);

// Prints the description (text, or one JSON object); returns the exit code (one-line error on
// failure, naming the file and the tensor or field). `model`: a checkpoint whose config the adapter is
// read against; empty for the released H3 config.
int inspect_lora(const std::string& path, const std::string& model, bool json);

}  // namespace vortex::cli
