// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`: the Qwen2 tokenizer that
// turns an H3 prompt into the token ids the Qwen3-VL text encoder reads.
//
// encode(text) follows the Rust `tokenizers` library on the file's own settings, with no special
// tokens added (the H3 pipeline's call):
//   1. the added tokens (`<|endoftext|>`, `<|vision_start|>`, ...) are cut out of the raw text,
//      leftmost first and longest at one position; each becomes its own id;
//   2. every other span is normalised (NFC), split by the pre-tokenizer's regex (matches and the
//      gaps between them are pieces), and each piece's UTF-8 bytes are spelled in GPT-2's
//      byte-level alphabet;
//   3. each piece is merged by rank (the lowest-ranked adjacent pair first, the leftmost among
//      equal ranks) and the symbols looked up in the vocabulary.
// The file's `id` of an added token is used as written (the Rust library renumbers added tokens
// missing from the vocabulary after it; for the Qwen files the two agree).
//
// Supported settings (anything else is refused at load, naming the field): model BPE without
// dropout, byte fallback, subword prefix or word suffix; normalizer null or NFC; pre-tokenizer a
// Split (Isolated, not inverted) followed by ByteLevel without prefix space or its own regex;
// added tokens without lstrip, rstrip, single_word or normalized. Unicode (NFC, the regex's
// categories) comes from ICU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vortex/status.h"

namespace vortex::text {

class BpeTokenizer {
 public:
  BpeTokenizer();
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // Reads and checks `tokenizer.json` (errors name the path and the field).
  static Result<BpeTokenizer> load(const std::string& tokenizer_json_path);

  // The ids of `text` (UTF-8; invalid UTF-8 is an error naming its byte offset).
  Result<std::vector<int32_t>> encode(std::string_view text) const;

  // The id of a vocabulary entry or an added token, spelled as in the file (e.g. "<|image_pad|>").
  Result<int32_t> token_id(std::string_view token) const;

  // One more than the largest id (vocabulary and added tokens).
  int64_t id_limit() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vortex::text
