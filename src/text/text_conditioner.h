// Prompt → H3 text states: the tokenizer and the Qwen3-VL text encoder, loaded once and used for
// every request (generate, serve, encode-text). The presentation is the H3 pipeline's: for t2va
// the prompt verbatim, no chat template, no special tokens added; for fl2va and image-only ref2va,
// before it, each picture's (keyframe's or image reference's) `"<Picture i>: "` label and vision block (`<|vision_start|>`, one `<|image_pad|>` per
// merged patch, `<|vision_end|>`), whose rows H3 tags as video; each video reference's
// `"<Video k>: "` label and, per vision block of its 2 fps frames (video_sampling.h), a
// `"<t seconds>"` label and a block of `<|video_pad|>`. The pixels go through the Qwen3-VL vision
// tower (qwen3_vision_encoder.h; on cuda, cuda_qwen3_vision_encoder.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe_tokenizer.h"
#include "text/qwen3_text_encoder.h"
#include "text/qwen3_vision_encoder.h"
#include "text/video_sampling.h"
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
  // The vision tower's image processor settings: preprocessor_config.json or a folder holding it
  // (or processor_config.json); empty: the encoder's folder, then a `processor` folder beside it
  // (the H3 checkpoint's layout). Without one, keyframe requests are refused by name.
  std::string processor_path;
};

class CudaQwen3TextEncoder;
class CudaQwen3VisionEncoder;

// One vision block of a presentation: a picture, or a video's temporal_patch sampled frames.
struct PresentedBlock {
  VisionGrid grid;                // the processor's size (the visual is resized to it where they differ)
  size_t visual = 0;              // which of encode_presentation's visuals it reads
  std::vector<int64_t> frames;    // a video block's frame indices into that visual; empty: a picture
  int64_t height = 0, width = 0;  // the visual's (a video's frames') size as presented
};

// A tokenized presentation (TextConditioner::keyframe_presentation, reference_presentation).
struct Presentation {
  std::vector<int32_t> ids;
  std::vector<bool> vision;             // per id: inside a vision block (tagged video by H3)
  std::vector<PresentedBlock> blocks;   // in order
  size_t visuals = 0;                   // the pictures and videos encode_presentation takes
};

// One ref2va reference as the presentation sees it, in reading order.
struct PresentedReference {
  enum class Kind { kPicture, kVideo, kAudio };
  Kind kind = Kind::kAudio;
  int64_t height = 0, width = 0;  // a picture's, a video's frames'
  int64_t frames = 0;             // a video's frame count on H3's clock (at `fps`)
  double fps = 0.0;
  bool has_audio = false;         // a video with its soundtrack: labelled "<Audio j>: " first
  std::string source;             // what the request called it (a file): named before "picture i" in errors
  static PresentedReference picture(int64_t height, int64_t width) {
    return {Kind::kPicture, height, width, 0, 0.0, false, {}};
  }
  static PresentedReference audio() { return {}; }
  static PresentedReference video(int64_t frames, double fps, int64_t height, int64_t width, bool has_audio) {
    return {Kind::kVideo, height, width, frames, fps, has_audio, {}};
  }
};

class TextConditioner {
 public:
  static Result<std::unique_ptr<TextConditioner>> load(const TextConditionerOptions& options);

  // The prompt's token ids, each checked against the encoder's vocabulary. An empty prompt, or one
  // that gives no token, is an error: H3 needs at least one text row.
  Result<std::vector<int32_t>> tokenize(std::string_view prompt) const;

  // The presentation of pictures of these [height, width] sizes: fl2va's keyframes (the request's
  // canvas) or ref2va's image references (each at its own size).
  Result<Presentation> keyframe_presentation(std::string_view prompt,
                                             const std::vector<std::array<int64_t, 2>>& keyframe_sizes) const;
  // ref2va's presentation: per reference in reading order, an image's "<Picture i>: " label and
  // vision block, a video's ("<Audio j>: " first when it has sound) "<Video k>: " label and
  // timestamped blocks, or an audio reference's "<Audio j>: " label alone, numbered per modality.
  // Pictures and videos need the vision tower (videos its video processor); audio labels do not.
  Result<Presentation> reference_presentation(std::string_view prompt,
                                              const std::vector<PresentedReference>& references) const;
  // Its states: the vision tower on each block, then the text encoder with their features. One
  // visual per picture (U8 [H, W, 3]) and video (U8 [F, H, W, 3], its frames on H3's clock), in
  // reading order, at the sizes the presentation was built for.
  Result<Tensor> encode_presentation(const Presentation& presentation, const std::vector<Tensor>& visuals);

  // On cuda: uploads the layers' and the vision tower's weights now (a server does at start, so
  // that no request waits for it); nothing on the cpu, or when done already.
  Status prepare();

  // [ids.size(), hidden] BF16 text states (host), computed on the device the options named.
  // Not safe to call from two threads at once (the CUDA encoder's buffers are reused).
  Result<Tensor> encode(const std::vector<int32_t>& ids);

  int64_t hidden() const { return encoder_->config().hidden; }
  // Device bytes of the resident encoder's and vision tower's weights (0 on the CPU).
  size_t device_weight_bytes() const;
  // "<checkpoint> layer <n> on <device>, tokenizer <path>" for summaries.
  std::string describe() const;

  ~TextConditioner();

 private:
  TextConditioner() = default;
  void load_vision(const TextConditionerOptions& options);
  // One block's features from its visual; errors read after "picture k" / "video k".
  Result<VisionFeatures> encode_block(const PresentedBlock& block, const Tensor& visual);
  BpeTokenizer tokenizer_;
  // On the heap: the CUDA encoder keeps a pointer to it.
  std::unique_ptr<Qwen3TextEncoder> encoder_;
  std::unique_ptr<CudaQwen3TextEncoder> cuda_encoder_;
  std::unique_ptr<Qwen3VisionEncoder> vision_;  // null when none could be loaded; then:
  Status vision_error_ = ok_status();
  std::unique_ptr<CudaQwen3VisionEncoder> cuda_vision_;
  std::string tokenizer_path_;
  std::string device_;
};

}  // namespace vortex::text
