#include "text/text_conditioner.h"

#include <algorithm>
#include <filesystem>

#include "text/hf_files.h"

#if defined(VORTEX_HAVE_CUDA)
#include "cuda/runtime.h"
#include "text/cuda_qwen3_text_encoder.h"
#include "text/cuda_qwen3_vision_encoder.h"
#endif

namespace vortex::text {

#if !defined(VORTEX_HAVE_CUDA)
// Without CUDA the pointers are always null; their deleters still need complete types.
class CudaQwen3TextEncoder {};
class CudaQwen3VisionEncoder {};
#endif

TextConditioner::~TextConditioner() = default;

Result<std::unique_ptr<TextConditioner>> TextConditioner::load(const TextConditionerOptions& options) {
  namespace fs = std::filesystem;
  if (options.device != "cpu" && options.device != "cuda") {
    return invalid_argument("text encoder device: '" + options.device + "' (cpu or cuda)");
  }
  // Named first: a missing folder would otherwise surface as its absent tokenizer.json.
  if (!fs::exists(options.encoder_path)) {
    return not_found("text encoder: " + options.encoder_path + " does not exist");
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
  t->load_vision(options);
  if (options.device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("the text encoder on cuda"));
#else
    return unimplemented("the text encoder on cuda: this build has no CUDA backend");
#endif
  }
  return t;
}

void TextConditioner::load_vision(const TextConditionerOptions& options) {
  namespace fs = std::filesystem;
  std::string processor = options.processor_path;
  if (processor.empty()) {
    const fs::path dir = model_folder(options.encoder_path);
    processor = dir.string();
    const fs::path beside = dir.parent_path() / "processor";
    if (!fs::exists(dir / "preprocessor_config.json") && !fs::exists(dir / "processor_config.json") &&
        fs::is_directory(beside)) {
      processor = beside.string();
    }
  }
  auto vision = Qwen3VisionEncoder::load(options.encoder_path, processor);
  if (!vision.ok()) {
    vision_error_ = vision.status().with_context("keyframes need the text encoder's vision tower");
    return;
  }
  vision_ = std::make_unique<Qwen3VisionEncoder>(std::move(*vision));
}

Result<Presentation> TextConditioner::keyframe_presentation(
    std::string_view prompt, const std::vector<std::array<int64_t, 2>>& keyframe_sizes) const {
  return reference_presentation(prompt, std::vector<PresentedReference>(keyframe_sizes.begin(), keyframe_sizes.end()));
}

Result<Presentation> TextConditioner::reference_presentation(std::string_view prompt,
                                                             const std::vector<PresentedReference>& references) const {
  Presentation p;
  const bool pictures =
      std::any_of(references.begin(), references.end(), [](const PresentedReference& r) { return r.has_value(); });
  if (pictures && !vision_) return vision_error_;
  int32_t start = 0, pad = 0, end = 0;
  if (pictures) {
    VORTEX_ASSIGN_OR_RETURN(start, tokenizer_.token_id("<|vision_start|>"));
    VORTEX_ASSIGN_OR_RETURN(pad, tokenizer_.token_id("<|image_pad|>"));
    VORTEX_ASSIGN_OR_RETURN(end, tokenizer_.token_id("<|vision_end|>"));
    if (pad != encoder_->config().image_token_id) {
      return invalid_argument(tokenizer_path_ + " spells <|image_pad|> as id " + std::to_string(pad) + ", " +
                              encoder_->source() + "'s config as " + std::to_string(encoder_->config().image_token_id));
    }
  }
  const auto label = [&](const std::string& text) -> Status {
    VORTEX_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer_.encode(text));
    p.ids.insert(p.ids.end(), ids.begin(), ids.end());
    p.vision.insert(p.vision.end(), ids.size(), false);
    return ok_status();
  };
  // Numbered per modality, in reading order: a picture's label and vision block, an audio
  // reference's label alone (its waveform never reaches the text encoder).
  int images = 0, audios = 0;
  for (const PresentedReference& r : references) {
    if (!r) {
      VORTEX_RETURN_IF_ERROR(label("<Audio " + std::to_string(++audios) + ">: "));
      continue;
    }
    ++images;
    auto grid = vision_->grid_for((*r)[0], (*r)[1]);
    if (!grid.ok()) return grid.status().with_context("picture " + std::to_string(images));
    VORTEX_RETURN_IF_ERROR(label("<Picture " + std::to_string(images) + ">: "));
    p.ids.push_back(start);
    p.ids.insert(p.ids.end(), static_cast<size_t>(grid->tokens()), pad);
    p.ids.push_back(end);
    p.vision.insert(p.vision.end(), static_cast<size_t>(grid->tokens() + 2), true);
    p.grids.push_back(*grid);
  }
  VORTEX_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt_ids, tokenize(prompt));
  p.ids.insert(p.ids.end(), prompt_ids.begin(), prompt_ids.end());
  p.vision.insert(p.vision.end(), prompt_ids.size(), false);
  return p;
}

Result<Tensor> TextConditioner::encode_presentation(const Presentation& p, const std::vector<Tensor>& keyframes) {
  if (!vision_) return vision_error_;
  if (keyframes.size() != p.grids.size()) {
    return invalid_argument(std::to_string(keyframes.size()) + " keyframe image(s) for a presentation of " +
                            std::to_string(p.grids.size()));
  }
  VORTEX_RETURN_IF_ERROR(prepare());
  std::vector<VisionFeatures> features;
  for (size_t k = 0; k < keyframes.size(); ++k) {
#if defined(VORTEX_HAVE_CUDA)
    auto f = cuda_vision_ ? cuda_vision_->encode_image(keyframes[k]) : vision_->encode_image(keyframes[k]);
#else
    auto f = vision_->encode_image(keyframes[k]);
#endif
    if (!f.ok()) return f.status().with_context("keyframe " + std::to_string(k + 1));
    if (f->grid.height != p.grids[k].height || f->grid.width != p.grids[k].width) {
      return invalid_argument("keyframe " + std::to_string(k + 1) + " is not the size its presentation was built for");
    }
    features.push_back(std::move(*f));
  }
#if defined(VORTEX_HAVE_CUDA)
  if (cuda_encoder_) return cuda_encoder_->encode(p.ids, features);
#endif
  return encoder_->encode(p.ids, features);
}

Status TextConditioner::prepare() {
#if defined(VORTEX_HAVE_CUDA)
  if (device_ == "cuda" && !cuda_encoder_) {
    VORTEX_ASSIGN_OR_RETURN(cuda_encoder_, CudaQwen3TextEncoder::create(*encoder_));
  }
  if (device_ == "cuda" && vision_ && !cuda_vision_) {
    VORTEX_ASSIGN_OR_RETURN(cuda_vision_, CudaQwen3VisionEncoder::create(*vision_));
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
  if (cuda_encoder_) return cuda_encoder_->weight_bytes() + (cuda_vision_ ? cuda_vision_->weight_bytes() : 0);
#endif
  return 0;
}

std::string TextConditioner::describe() const {
  return encoder_->source() + " layer " + std::to_string(encoder_->layer()) + " on " + device_ + ", tokenizer " +
         tokenizer_path_;
}

}  // namespace vortex::text
