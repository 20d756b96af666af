#include "text/text_conditioner.h"

#include <filesystem>

#if defined(VORTEX_HAVE_CUDA)
#include "cuda/runtime.h"
#include "text/cuda_qwen3_text_encoder.h"
#endif

namespace vortex::text {

#if !defined(VORTEX_HAVE_CUDA)
// Without CUDA the pointer is always null; its deleter still needs a complete type.
class CudaQwen3TextEncoder {};
#endif

TextConditioner::~TextConditioner() = default;

Result<std::unique_ptr<TextConditioner>> TextConditioner::load(const TextConditionerOptions& options) {
  namespace fs = std::filesystem;
  if (options.device != "cpu" && options.device != "cuda") {
    return invalid_argument("text encoder device: '" + options.device + "' (cpu or cuda)");
  }
  std::string tokenizer_path = options.tokenizer_path;
  if (tokenizer_path.empty()) {
    const fs::path dir = fs::is_directory(options.encoder_path) ? fs::path(options.encoder_path)
                                                                : fs::path(options.encoder_path).parent_path();
    tokenizer_path = (dir / "tokenizer.json").string();
  }
  std::unique_ptr<TextConditioner> t(new TextConditioner());
  VORTEX_ASSIGN_OR_RETURN(t->tokenizer_, BpeTokenizer::load(tokenizer_path));
  VORTEX_ASSIGN_OR_RETURN(Qwen3TextEncoder encoder, Qwen3TextEncoder::load(options.encoder_path, options.layer));
  t->encoder_ = std::make_unique<Qwen3TextEncoder>(std::move(encoder));
  t->tokenizer_path_ = std::move(tokenizer_path);
  t->device_ = options.device;
  if (options.device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("the text encoder on cuda"));
#else
    return unimplemented("the text encoder on cuda: this build has no CUDA backend");
#endif
  }
  return t;
}

Status TextConditioner::prepare() {
#if defined(VORTEX_HAVE_CUDA)
  if (device_ == "cuda" && !cuda_encoder_) {
    VORTEX_ASSIGN_OR_RETURN(cuda_encoder_, CudaQwen3TextEncoder::create(*encoder_));
  }
#endif
  return ok_status();
}

Result<std::vector<int32_t>> TextConditioner::tokenize(std::string_view prompt) const {
  if (prompt.empty()) return invalid_argument("prompt: empty (H3 needs at least one text token)");
  VORTEX_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_.encode(prompt));
  if (ids.empty()) return invalid_argument("prompt: gives no tokens");
  const int64_t vocab = encoder_->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      return invalid_argument("prompt: token " + std::to_string(i) + " has id " + std::to_string(ids[i]) +
                              ", outside the text encoder's vocabulary of " + std::to_string(vocab) + " (" +
                              tokenizer_path_ + " does not belong to " + encoder_->source() + ")");
    }
  }
  return ids;
}

Result<Tensor> TextConditioner::encode(const std::vector<int32_t>& ids) {
  VORTEX_RETURN_IF_ERROR(prepare());
#if defined(VORTEX_HAVE_CUDA)
  if (cuda_encoder_) return cuda_encoder_->encode(ids);
#endif
  return encoder_->encode(ids);
}

size_t TextConditioner::device_weight_bytes() const {
#if defined(VORTEX_HAVE_CUDA)
  if (cuda_encoder_) return cuda_encoder_->weight_bytes();
#endif
  return 0;
}

std::string TextConditioner::describe() const {
  return encoder_->source() + " layer " + std::to_string(encoder_->layer()) + " on " + device_ + ", tokenizer " +
         tokenizer_path_;
}

}  // namespace vortex::text
