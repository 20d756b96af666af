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
  std::vector<PresentedReference> pictures;
  for (const auto& [h, w] : keyframe_sizes) pictures.push_back(PresentedReference::picture(h, w));
  return reference_presentation(prompt, pictures);
}

Result<Presentation> TextConditioner::reference_presentation(std::string_view prompt,
                                                             const std::vector<PresentedReference>& references) const {
  using Kind = PresentedReference::Kind;
  Presentation p;
  const bool visuals = std::any_of(references.begin(), references.end(),
                                   [](const PresentedReference& r) { return r.kind != Kind::kAudio; });
  if (visuals && !vision_) return vision_error_;
  int32_t start = 0, end = 0;
  std::array<int32_t, 2> pads{};  // <|image_pad|>, <|video_pad|>
  if (visuals) {
    VORTEX_ASSIGN_OR_RETURN(start, tokenizer_.token_id("<|vision_start|>"));
    VORTEX_ASSIGN_OR_RETURN(end, tokenizer_.token_id("<|vision_end|>"));
    const auto& config = encoder_->config();
    const std::array<std::pair<const char*, int64_t>, 2> names{
        {{"<|image_pad|>", config.image_token_id}, {"<|video_pad|>", config.video_token_id}}};
    for (size_t k = 0; k < 2; ++k) {
      const bool needed = k == 0 || std::any_of(references.begin(), references.end(),
                                                [](const PresentedReference& r) { return r.kind == Kind::kVideo; });
      if (!needed) continue;
      VORTEX_ASSIGN_OR_RETURN(pads[k], tokenizer_.token_id(names[k].first));
      if (pads[k] != names[k].second) {
        return invalid_argument(tokenizer_path_ + " spells " + names[k].first + " as id " + std::to_string(pads[k]) +
                                ", " + encoder_->source() + "'s config as " + std::to_string(names[k].second));
      }
    }
  }
  const auto label = [&](const std::string& text) -> Status {
    VORTEX_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer_.encode(text));
    p.ids.insert(p.ids.end(), ids.begin(), ids.end());
    p.vision.insert(p.vision.end(), ids.size(), false);
    return ok_status();
  };
  const auto block = [&](int32_t pad, PresentedBlock b) {
    p.ids.push_back(start);
    p.ids.insert(p.ids.end(), static_cast<size_t>(b.grid.tokens()), pad);
    p.ids.push_back(end);
    p.vision.insert(p.vision.end(), static_cast<size_t>(b.grid.tokens() + 2), true);
    p.blocks.push_back(std::move(b));
  };
  // Numbered per modality, in reading order: a picture's label and vision block, a video's label
  // and timestamped blocks (after its soundtrack's label), an audio reference's label alone (its
  // waveform never reaches the text encoder).
  int pictures = 0, videos = 0, audios = 0;
  const auto name_of = [](const PresentedReference& r, const std::string& ordinal) {
    return r.source.empty() ? ordinal : r.source + ": " + ordinal;
  };
  for (const PresentedReference& r : references) {
    if (r.kind == Kind::kAudio || r.has_audio) {
      VORTEX_RETURN_IF_ERROR(label("<Audio " + std::to_string(++audios) + ">: "));
    }
    if (r.kind == Kind::kPicture) {
      ++pictures;
      auto grid = vision_->grid_for(r.height, r.width);
      if (!grid.ok()) return grid.status().with_context(name_of(r, "picture " + std::to_string(pictures)));
      VORTEX_RETURN_IF_ERROR(label("<Picture " + std::to_string(pictures) + ">: "));
      block(pads[0], {*grid, p.visuals++, {}, r.height, r.width});
    } else if (r.kind == Kind::kVideo) {
      const std::string name = name_of(r, "video " + std::to_string(++videos));
      const int64_t temporal = vision_->config().temporal_patch;
      auto sampling = sample_video_frames(r.frames, r.fps, kVideoSampleFps, temporal);
      if (!sampling.ok()) return sampling.status().with_context(name);
      // The processor sizes a video by its sampled frames before they are padded to pairs.
      auto grid = vision_->video_grid_for(sampling->sampled, r.height, r.width);
      if (!grid.ok()) return grid.status().with_context(name);
      VORTEX_RETURN_IF_ERROR(label("<Video " + std::to_string(videos) + ">: "));
      for (size_t b = 0; b < sampling->blocks.size(); ++b) {
        VORTEX_RETURN_IF_ERROR(label(seconds_label(sampling->block_seconds[b])));
        block(pads[1], {*grid, p.visuals, sampling->blocks[b], r.height, r.width});
      }
      ++p.visuals;
    }
  }
  VORTEX_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt_ids, tokenize(prompt));
  p.ids.insert(p.ids.end(), prompt_ids.begin(), prompt_ids.end());
  p.vision.insert(p.vision.end(), prompt_ids.size(), false);
  return p;
}

Result<VisionFeatures> TextConditioner::encode_block(const PresentedBlock& block, const Tensor& visual) {
  const int64_t H = block.height, W = block.width;
  if (block.frames.empty()) {
    if (visual.rank() != 3 || visual.size(0) != H || visual.size(1) != W) {
      return invalid_argument(visual.describe() + " is not the size its presentation was built for (" +
                              std::to_string(H) + " x " + std::to_string(W) + ")");
    }
#if defined(VORTEX_HAVE_CUDA)
    if (cuda_vision_) return cuda_vision_->encode_image(visual);
#endif
    return vision_->encode_image(visual);
  }
  if (visual.dtype() != DType::kU8 || visual.rank() != 4 || visual.size(1) != H || visual.size(2) != W) {
    return invalid_argument(visual.describe() + " is not the frames its presentation was built for (u8 [frames, " +
                            std::to_string(H) + ", " + std::to_string(W) + ", 3])");
  }
  std::vector<Tensor> frames;
  for (const int64_t f : block.frames) {
    if (f >= visual.size(0)) {
      return invalid_argument(std::to_string(visual.size(0)) + " frames given; its presentation reads frame " +
                              std::to_string(f));
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor frame, visual.select(0, f));
    frames.push_back(std::move(frame));
  }
  VORTEX_ASSIGN_OR_RETURN(const Tensor patches, vision_->video_block_patches(frames, block.grid));
#if defined(VORTEX_HAVE_CUDA)
  if (cuda_vision_) return cuda_vision_->encode(patches, block.grid);
#endif
  return vision_->encode(patches, block.grid);
}

Result<Tensor> TextConditioner::encode_presentation(const Presentation& p, const std::vector<Tensor>& visuals) {
  if (!vision_) return vision_error_;
  if (visuals.size() != p.visuals) {
    return invalid_argument(std::to_string(visuals.size()) + " picture(s) and video(s) for a presentation of " +
                            std::to_string(p.visuals));
  }
  VORTEX_RETURN_IF_ERROR(prepare());
  std::vector<VisionFeatures> features;
  // Errors name the visual as the presentation numbers it, per modality.
  std::vector<std::string> names(p.visuals);
  int pictures = 0, videos = 0;
  for (const PresentedBlock& block : p.blocks) {
    std::string& name = names[block.visual];
    if (name.empty()) {
      name = block.frames.empty() ? "picture " + std::to_string(++pictures) : "video " + std::to_string(++videos);
    }
    auto f = encode_block(block, visuals[block.visual]);
    if (!f.ok()) return f.status().with_context(name);
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
