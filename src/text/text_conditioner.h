// Prompt → H3 text states: the tokenizer and the Qwen3-VL text encoder, loaded once and used for
// every request (generate, serve, encode-text). The presentation is the H3 pipeline's for t2va:
// the prompt verbatim, no chat template, no special tokens added.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe_tokenizer.h"
#include "text/qwen3_text_encoder.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::text {

struct TextConditionerOptions {
  std::string encoder_path;    // the Qwen3-VL checkpoint folder (config.json, model*.safetensors)
  std::string tokenizer_path;  // tokenizer.json; empty: the one in encoder_path
  int layer = kH3TextEncoderLayer;
};

class TextConditioner {
 public:
  static Result<std::unique_ptr<TextConditioner>> load(const TextConditionerOptions& options);

  // The prompt's token ids, each checked against the encoder's vocabulary. An empty prompt, or one
  // that gives no token, is an error: H3 needs at least one text row.
  Result<std::vector<int32_t>> tokenize(std::string_view prompt) const;

  // [ids.size(), hidden] BF16 text states.
  Result<Tensor> encode(const std::vector<int32_t>& ids) const { return encoder_.encode(ids); }

  int64_t hidden() const { return encoder_.config().hidden; }
  // "<checkpoint> layer <n>" for summaries.
  std::string describe() const;

 private:
  TextConditioner(BpeTokenizer tokenizer, Qwen3TextEncoder encoder, std::string tokenizer_path)
      : tokenizer_(std::move(tokenizer)), encoder_(std::move(encoder)), tokenizer_path_(std::move(tokenizer_path)) {}
  BpeTokenizer tokenizer_;
  Qwen3TextEncoder encoder_;
  std::string tokenizer_path_;
};

}  // namespace vortex::text
