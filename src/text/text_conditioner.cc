#include "text/text_conditioner.h"

#include <filesystem>

namespace vortex::text {

Result<std::unique_ptr<TextConditioner>> TextConditioner::load(const TextConditionerOptions& options) {
  namespace fs = std::filesystem;
  std::string tokenizer_path = options.tokenizer_path;
  if (tokenizer_path.empty()) {
    const fs::path dir = fs::is_directory(options.encoder_path) ? fs::path(options.encoder_path)
                                                                : fs::path(options.encoder_path).parent_path();
    tokenizer_path = (dir / "tokenizer.json").string();
  }
  VORTEX_ASSIGN_OR_RETURN(BpeTokenizer tokenizer, BpeTokenizer::load(tokenizer_path));
  VORTEX_ASSIGN_OR_RETURN(Qwen3TextEncoder encoder, Qwen3TextEncoder::load(options.encoder_path, options.layer));
  return std::unique_ptr<TextConditioner>(
      new TextConditioner(std::move(tokenizer), std::move(encoder), std::move(tokenizer_path)));
}

Result<std::vector<int32_t>> TextConditioner::tokenize(std::string_view prompt) const {
  if (prompt.empty()) return invalid_argument("prompt: empty (H3 needs at least one text token)");
  VORTEX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_.encode(prompt));
  if (ids.empty()) return invalid_argument("prompt: gives no tokens");
  const int64_t vocab = encoder_.config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      return invalid_argument("prompt: token " + std::to_string(i) + " has id " + std::to_string(ids[i]) +
                              ", outside the text encoder's vocabulary of " + std::to_string(vocab) + " (" +
                              tokenizer_path_ + " does not belong to " + encoder_.source() + ")");
    }
  }
  return ids;
}

std::string TextConditioner::describe() const {
  return encoder_.source() + " layer " + std::to_string(encoder_.layer()) + ", tokenizer " + tokenizer_path_;
}

}  // namespace vortex::text
