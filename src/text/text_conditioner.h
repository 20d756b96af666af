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
  // "cpu", or "cuda": the layers' weights go to the device (cuda_qwen3_text_encoder.h) at
  // prepare() or the first encode; load() reads nothing but the config and the index.
  std::string device = "cpu";
};

class CudaQwen3TextEncoder;

class TextConditioner {
 public:
  static Result<std::unique_ptr<TextConditioner>> load(const TextConditionerOptions& options);

  // The prompt's token ids, each checked against the encoder's vocabulary. An empty prompt, or one
  // that gives no token, is an error: H3 needs at least one text row.
  Result<std::vector<int32_t>> tokenize(std::string_view prompt) const;

  // On cuda: uploads the layers' weights now (a server does at start, so that no request waits
  // for it); nothing on the cpu, or when done already.
  Status prepare();

  // [ids.size(), hidden] BF16 text states (host), computed on the device the options named.
  // Not safe to call from two threads at once (the CUDA encoder's buffers are reused).
  Result<Tensor> encode(const std::vector<int32_t>& ids);

  int64_t hidden() const { return encoder_->config().hidden; }
  // Device bytes of the resident encoder's weights (0 on the CPU).
  size_t device_weight_bytes() const;
  // "<checkpoint> layer <n> on <device>, tokenizer <path>" for summaries.
  std::string describe() const;

  ~TextConditioner();

 private:
  TextConditioner() = default;
  BpeTokenizer tokenizer_;
  // On the heap: the CUDA encoder keeps a pointer to it.
  std::unique_ptr<Qwen3TextEncoder> encoder_;
  std::unique_ptr<CudaQwen3TextEncoder> cuda_encoder_;
  std::string tokenizer_path_;
  std::string device_;
};

}  // namespace vortex::text
