#include "generate_common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>

#include "core/quote.h"
#include "cpu/gemm.h"
#include "formats/safetensors.h"
#include "lora_options.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/model_source.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"
#include "sampling/h3_scheduler.h"
#if defined(VORTEX_HAVE_CUDA)
#include "cuda/runtime.h"
#include "models/h3/cuda_lora_merge.h"
#include "models/h3/cuda_transformer.h"
#if defined(VORTEX_HAVE_NCCL)
#include "dist/sequence_parallel_h3.h"
#endif
#endif

namespace vortex::cli {

namespace {

Result<Tensor> read_text_states(const RequestOptions& r, int text_dim) {
  if (r.text_path.empty()) {
    if (r.text_tokens < 1) return invalid_argument(r.field_name("text-tokens") + " must be >= 1");
    return h3::seeded_normal({r.text_tokens, text_dim}, r.seed, h3::kSyntheticTextStream);
  }
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(r.text_path));
  std::string key = r.text_key;
  if (key.empty()) {
    if (file.names().size() == 1) {
      key = file.names()[0];
    } else if (file.has("prompt_embeds")) {
      key = "prompt_embeds";
    } else {
      return invalid_argument(r.text_path + ": holds " + std::to_string(file.names().size()) +
                              " tensors; name one with " + r.field_name("text-key"));
    }
  }
  if (!file.has(key)) return invalid_argument(r.text_path + ": no tensor " + quote(key));
  VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(key));
  if (t.rank() == 3 && t.size(0) == 1) {
    VORTEX_ASSIGN_OR_RETURN(t, t.select(0, 0));
  }
  if (t.rank() != 2 || t.size(1) != text_dim) {
    return invalid_argument(r.text_path + ": tensor " + quote(key) + " is " + t.describe() + ", expected [tokens, " +
                            std::to_string(text_dim) + "]");
  }
  if (t.dtype() == DType::kF16) return t.to(DType::kF32);
  return t;
}

// Reads the --lora adapters for the model `weights` (kept in loaded.base_weights when asked to):
// loaded.loras records them, loaded.merged_weights the weights they change. Null when there are none.
Result<std::shared_ptr<const h3::LoraStack>> read_lora_stack(const ModelOptions& m, const h3::HostWeights& weights,
                                                             const h3::H3Config& config, DType dtype,
                                                             LoadedStepModel& loaded) {
  if (m.keep_base_weights) {
    loaded.base_weights = weights;
    loaded.merge_dtype = dtype;
  }
  if (m.loras.empty()) return std::shared_ptr<const h3::LoraStack>();
  VORTEX_ASSIGN_OR_RETURN(LoraOptions read, read_lora_options(m.loras, config));
  loaded.loras = read.summary;
  loaded.merged_weights = read.targets();
  size_t modules = 0;
  for (const auto& adapter : read.adapters) modules += adapter.modules.size();
  std::fprintf(stderr, "vortex: --lora: merging %zu modules of %zu adapter%s ...\n", modules, read.adapters.size(),
               read.adapters.size() == 1 ? "" : "s");
  return std::make_shared<const h3::LoraStack>(std::move(static_cast<h3::LoraStack&>(read)));
}

// The CPU program's merge: on the host, into `tensors`.
Status merge_lora_options(const ModelOptions& m, h3::NamedTensors& tensors, const h3::H3Config& config, DType dtype,
                          LoadedStepModel& loaded) {
  VORTEX_ASSIGN_OR_RETURN(const auto stack, read_lora_stack(m, tensors, config, dtype, loaded));
  if (!stack) return ok_status();
  // The merge of an adapter on every block of the released model takes seconds to minutes on the host.
  const auto start = std::chrono::steady_clock::now();
  VORTEX_RETURN_IF_ERROR(h3::merge_loras(tensors, stack->applications(), dtype).with_context("--lora"));
  std::fprintf(stderr, "vortex: --lora: merged in %.1f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ok_status();
}

// ", 2 LoRA adapters merged" for the source line.
std::string loras_phrase(const nlohmann::json& loras) {
  if (loras.empty()) return "";
  return ", " + std::to_string(loras.size()) + (loras.size() == 1 ? " LoRA adapter" : " LoRA adapters") + " merged";
}

Status load_transformer(const ModelOptions& m, DType dtype, LoadedStepModel& loaded) {
  const auto merge = [&](h3::NamedTensors& tensors, const h3::H3Config& config) {
    return merge_lora_options(m, tensors, config, dtype, loaded);
  };
  if (!m.model_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(h3::LoadedModel model, h3::load_model(m.model_path, dtype, merge));
    loaded.source = m.model_path + " (" + h3::layout_name(model.layout) + " layout" + loras_phrase(loaded.loras) + ")";
    VORTEX_ASSIGN_OR_RETURN(loaded.cpu, h3::H3Transformer::create(std::move(model.weights)));
    return ok_status();
  }
  VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::config_preset(m.synthetic_preset));
  VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, h3::synthetic_weights(config, dtype, m.weights_seed));
  VORTEX_RETURN_IF_ERROR(merge(tensors, config));
  VORTEX_ASSIGN_OR_RETURN(h3::H3Weights weights, h3::assemble_weights(tensors, config, dtype));
  loaded.source = "synthetic preset '" + m.synthetic_preset + "' (weights seed " + std::to_string(m.weights_seed) +
                  loras_phrase(loaded.loras) + ")";
  VORTEX_ASSIGN_OR_RETURN(loaded.cpu, h3::H3Transformer::create(std::move(weights)));
  return ok_status();
}

#if defined(VORTEX_HAVE_CUDA)
// ", sequence-parallel on GPUs 0,1" for a group of several.
std::string gpus_phrase(const std::vector<int>& devices) {
  if (devices.size() < 2) return "";
  std::string list;
  for (const int d : devices) list += (list.empty() ? "" : ",") + std::to_string(d);
  return ", sequence-parallel on GPUs " + list;
}

Result<std::vector<int>> dist_device_list(const std::string& text) {
#if defined(VORTEX_HAVE_NCCL)
  return dist::parse_device_list(text);
#else
  (void)text;
  return unimplemented("this build has no NCCL: it runs on one GPU (leave --devices out)");
#endif
}

Result<std::unique_ptr<h3::StepModel>> sequence_parallel_model(
    const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for, int64_t rows,
    const std::vector<int>& devices, const h3::CudaModelOptions& options) {
#if defined(VORTEX_HAVE_NCCL)
  VORTEX_ASSIGN_OR_RETURN(auto model, dist::SequenceParallelH3::create(config, filler_for, rows, devices, options));
  return std::unique_ptr<h3::StepModel>(std::move(model));
#else
  (void)config, (void)filler_for, (void)rows, (void)devices, (void)options;
  return unimplemented("--devices: this build has no NCCL");
#endif
}

// The CUDA model's --lora adapters: merged into `weights` here under VORTEX_VARIANT_LORA_MERGE=host
// (null returned; the whole model gathered on the host for it), else returned for weight_filler to
// merge on the device.
Result<std::shared_ptr<const h3::LoraStack>> cuda_lora_stack(const ModelOptions& m, h3::HostWeights& weights,
                                                             const h3::H3Config& config, LoadedStepModel& loaded) {
  VORTEX_ASSIGN_OR_RETURN(const bool on_device, h3::lora_merge_on_device());
  if (on_device) return read_lora_stack(m, weights, config, DType::kBF16, loaded);
  VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, weights.all());
  VORTEX_RETURN_IF_ERROR(merge_lora_options(m, tensors, config, DType::kBF16, loaded));
  weights = h3::HostWeights(std::move(tensors));
  return std::shared_ptr<const h3::LoraStack>();
}

// The host weights' filler: the --lora adapters (if any) merge on the device as the weights upload.
h3::WeightFiller weight_filler(const h3::HostWeights& weights, const std::shared_ptr<const h3::LoraStack>& loras,
                               cudaStream_t stream) {
  if (!loras) return h3::host_weight_filler(weights, stream);
  h3::WeightFiller merging = h3::lora_merging_filler(weights, loras, DType::kBF16, stream);
  return [merging](const h3::TensorSpec& spec, const Tensor& dst) { return merging(spec, dst).with_context("--lora"); };
}

// The CUDA model: weights from the checkpoint (through pinned staging) or made on the device.
Result<std::unique_ptr<h3::StepModel>> load_cuda_model(const ModelOptions& m, int64_t rows, LoadedStepModel& loaded) {
  h3::CudaModelOptions model_options;
  model_options.int8fp8_attention = m.int8fp8_workspace;
  model_options.recipe = m.recipe == "fp8" ? h3::LinearRecipe::kFp8 : h3::LinearRecipe::kBf16;
  model_options.adaln_tables = m.adaln_tables == "step" ? h3::AdaLnTables::kPerStep : h3::AdaLnTables::kPerRequest;
  if (m.dtype != "bf16") return invalid_argument("--device cuda runs the bf16 program; use --dtype bf16");
  std::vector<int> devices;
  if (!m.devices.empty()) {
    auto parsed = dist_device_list(m.devices);
    if (!parsed.ok()) return parsed.status().with_context("--devices");
    devices = std::move(*parsed);
    if (devices.size() == 1) VORTEX_CUDA_CHECK(cudaSetDevice(devices[0]));
  }
  // One GPU: the model on the current device. Several: one rank per GPU, each loading the whole
  // model through its own stream.
  const auto make = [&](const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for)
      -> Result<std::unique_ptr<h3::StepModel>> {
    if (devices.size() > 1) return sequence_parallel_model(config, filler_for, rows, devices, model_options);
    VORTEX_ASSIGN_OR_RETURN(auto model, h3::CudaH3Transformer::create(config, filler_for(nullptr), rows, nullptr,
                                                                      model_options));
    return std::unique_ptr<h3::StepModel>(std::move(model));
  };
  if (!m.model_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(const h3::ModelSource checkpoint, h3::ModelSource::open(m.model_path));
    VORTEX_ASSIGN_OR_RETURN(h3::CheckpointLayout layout, h3::detect_layout(checkpoint.names()));
    VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::resolve_config(checkpoint));
    // The tensors are views of the files. Quantized weights (fp8, NVFP4, a GGUF file's blocks) stay
    // as stored and load dequantized to bf16 one at a time as each uploads (host_weight_filler, or
    // lora_merging_filler, which merges adapters into the dequantized weight on the device; the fp8
    // recipe quantizes them again), and an original layout's fused layers are split as each part
    // uploads (HostWeights), unless adapters merge on the host (VORTEX_VARIANT_LORA_MERGE=host),
    // which needs them all first.
    VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, checkpoint.tensors());
    const Status valid = h3::validate_checkpoint_tensors(tensors, layout, config);
    if (!valid.ok()) return valid.with_context(m.model_path);
    VORTEX_ASSIGN_OR_RETURN(const bool merge_on_device, h3::lora_merge_on_device());
    if ((!m.loras.empty() || m.keep_base_weights) && !merge_on_device) {
      auto dequantized = h3::dequantize_scaled_weights(tensors, DType::kBF16);
      if (!dequantized.ok()) return dequantized.status().with_context(m.model_path);
      tensors = std::move(*dequantized);
    }
    h3::HostWeights weights;
    if (layout == h3::CheckpointLayout::kOriginal) {
      auto original = h3::HostWeights::original(std::move(tensors), config);
      if (!original.ok()) return original.status().with_context(m.model_path);
      weights = std::move(*original);
    } else {
      weights = h3::HostWeights(std::move(tensors));
    }
    VORTEX_ASSIGN_OR_RETURN(const auto stack, cuda_lora_stack(m, weights, config, loaded));
    loaded.source = m.model_path + " (" + h3::layout_name(layout) + " layout, cuda" + gpus_phrase(devices) +
                    loras_phrase(loaded.loras) + ")";
    return make(config, [&](cudaStream_t stream) { return weight_filler(weights, stack, stream); });
  }
  VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::config_preset(m.synthetic_preset));
  if (!m.loras.empty() || m.keep_base_weights) {
    // The adapters merge from the host's base weights, so the synthetic weights are made there
    // (the same bits as the device makes them; synthetic.h), then uploaded like a checkpoint's.
    VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, h3::synthetic_weights(config, DType::kBF16, m.weights_seed));
    h3::HostWeights weights(std::move(tensors));
    VORTEX_ASSIGN_OR_RETURN(const auto stack, cuda_lora_stack(m, weights, config, loaded));
    loaded.source = "synthetic preset '" + m.synthetic_preset + "' (weights seed " + std::to_string(m.weights_seed) +
                    ", cuda" + gpus_phrase(devices) + loras_phrase(loaded.loras) + ")";
    return make(config, [&](cudaStream_t stream) { return weight_filler(weights, stack, stream); });
  }
  loaded.source = "synthetic preset '" + m.synthetic_preset + "' (weights seed " + std::to_string(m.weights_seed) +
                  ", made on the device" + gpus_phrase(devices) + ")";
  return make(config, [&](cudaStream_t stream) { return h3::synthetic_weight_filler(m.weights_seed, stream); });
}
#endif

}  // namespace

std::string shown_value(const nlohmann::json& value) {
  constexpr size_t kMaxShown = 80;
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  if (text.size() <= kMaxShown) return text;
  return text.substr(0, kMaxShown) + "... (" + std::to_string(text.size()) + " characters)";
}

std::function<void()> add_model_options(CLI::App* cmd, ModelOptions& m) {
  auto* model = cmd->add_option("--model", m.model_path, "Checkpoint: .safetensors file, index JSON or folder");
  auto* synthetic = cmd->add_option("--synthetic", m.synthetic_preset,
                                    "Use deterministic synthetic weights of a preset (h3, test, small, mid)");
  model->excludes(synthetic);
  cmd->add_option("--weights-seed", m.weights_seed, "Seed of the synthetic weights (transformer and VAEs)")
      ->capture_default_str();
  cmd->add_option("--device", m.device, "Where the transformer runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", m.dtype, "Activation and weight dtype")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--devices", m.devices,
                  "--device cuda: the GPUs, e.g. 0,1 or all (default: GPU 0); more than one runs the transformer "
                  "sequence-parallel across them (any recipe and attention mode; the GPU count must divide the "
                  "attention heads)");
  cmd->add_option("--recipe", m.recipe,
                  "Block linears: bf16, or fp8 (--device cuda; e4m3 weights and activations, approximate: "
                  "~1.6e-3 rel-L2 vs bf16 per block)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--adaln-tables", m.adaln_tables,
                  "--device cuda: AdaLN modulation tables computed once per request (the 26 GB of AdaLN weights "
                  "never stay on the device) or per step from resident weights; bitwise the same result")
      ->check(CLI::IsMember({"request", "step"}))
      ->capture_default_str();
  cmd->add_option("--vae-encode-precision", m.vae_encode_precision, kVaeEncodePrecisionHelp)->capture_default_str();
  cmd->add_option("--text-encoder", m.text_encoder_path,
                  "Qwen3-VL checkpoint folder (config.json, model*.safetensors, tokenizer.json) that encodes --prompt "
                  "(on --device)");
  cmd->add_option("--tokenizer", m.tokenizer_path, "tokenizer.json for --prompt (default: the text encoder's)");
  cmd->add_option("--text-encoder-layer", m.text_encoder_layer,
                  "The text encoder's layer whose output conditions H3 (the released model: 50)")
      ->capture_default_str();
  cmd->add_option("--image-processor", m.processor_path,
                  "Keyframes: the vision tower's preprocessor_config.json, or its folder (default: in --text-encoder, "
                  "then a processor/ folder beside it)");
  cmd->add_option("--lora", m.loras, kLoraHelp);
  const std::string name = cmd->get_name();
  return [model, synthetic, name] {
    if (model->count() == 0 && synthetic->count() == 0) {
      throw CLI::ValidationError(name, "one of --model or --synthetic is required");
    }
  };
}

Result<h3::H3Config> model_config(const ModelOptions& model) {
  if (model.model_path.empty()) return h3::config_preset(model.synthetic_preset);
  VORTEX_ASSIGN_OR_RETURN(const h3::ModelSource checkpoint, h3::ModelSource::open(model.model_path));
  return h3::resolve_config(checkpoint);
}

Result<std::unique_ptr<text::TextConditioner>> load_text_conditioner(const ModelOptions& m,
                                                                     const h3::H3Config& config) {
  if (m.text_encoder_path.empty()) {
    if (!m.tokenizer_path.empty()) return invalid_argument("--tokenizer is for --text-encoder, which is not given");
    if (!m.processor_path.empty()) {
      return invalid_argument("--image-processor is for --text-encoder's vision tower; --text-encoder is not given");
    }
    return std::unique_ptr<text::TextConditioner>();
  }
  VORTEX_ASSIGN_OR_RETURN(auto conditioner, text::TextConditioner::load(
                                                {m.text_encoder_path, m.tokenizer_path, m.text_encoder_layer,
                                                 m.device, m.processor_path}));
  if (conditioner->hidden() != config.text_dim) {
    return invalid_argument("--text-encoder " + m.text_encoder_path + ": its hidden size " +
                            std::to_string(conditioner->hidden()) + " is not the transformer's text_dim " +
                            std::to_string(config.text_dim));
  }
  return conditioner;
}

namespace {

// A presentation into checked: its ids, and one tag per text row (the vision blocks' rows tagged
// video).
Status take_presentation(text::Presentation presentation, CheckedRequest& checked) {
  checked.presentation = std::move(presentation);
  checked.prompt_ids = checked.presentation.ids;
  for (const bool vision : checked.presentation.vision) checked.text_tags.push_back(vision ? h3::kVideoTag : h3::kTextTag);
  return ok_status();
}

// fl2va's text: the keyframes on their canvas and the presentation that shows them to the text
// encoder before the prompt; its picture rows are tagged video.
Status check_keyframes(const RequestOptions& request, const text::TextConditioner* text, CheckedRequest& checked) {
  const std::string keyframes = request.field_name("first-frame") + " / " + request.field_name("last-frame");
  if (request.prompt.empty() || !request.text_path.empty()) {
    return invalid_argument(keyframes + ": keyframes are shown to the text encoder with the prompt; give " +
                            request.field_name("prompt") + " (not text states)");
  }
  if (!text) {
    return invalid_argument(keyframes + ": this model has no text encoder (start it with --text-encoder)");
  }
  std::optional<h3::Canvas> canvas;
  if (request.size_given) canvas = h3::Canvas{request.height, request.width};
  VORTEX_ASSIGN_OR_RETURN(checked.keyframes, prepare_keyframes(request.keyframes, canvas));
  const h3::Canvas& c = checked.keyframes.canvas;
  checked.video.height = static_cast<int>(c.height);
  checked.video.width = static_cast<int>(c.width);
  const std::vector<std::array<int64_t, 2>> sizes(checked.keyframes.pixels.size(), {c.height, c.width});
  auto presentation = text->keyframe_presentation(request.prompt, sizes);
  if (!presentation.ok()) return presentation.status().with_context(request.field_name("prompt"));
  return take_presentation(std::move(*presentation), checked);
}

// ref2va's text: the references read (images at their own sizes, videos on H3's clock and their
// canvas, soundtracks), their counts within the release's limits, and the presentation that shows
// them to the text encoder before the prompt (a picture's "<Picture i>: " label and vision block, as
// a keyframe is shown; a video's "<Video k>: " label, after "<Audio j>: " when it has sound, and its
// timestamped blocks; a soundtrack's "<Audio j>: " label); the vision rows are tagged video.
Status check_references(const RequestOptions& request, const text::TextConditioner* text,
                        const vae::AudioVaeConfig* audio, CheckedRequest& checked) {
  const std::string references = request.field_name("reference");
  if (request.prompt.empty() || !request.text_path.empty()) {
    return invalid_argument(references + ": references are shown to the text encoder with the prompt; give " +
                            request.field_name("prompt") + " (not text states)");
  }
  if (!text) return invalid_argument(references + ": this model has no text encoder (start it with --text-encoder)");
  auto prepared = prepare_references(request.references, request.reference_short_edge, audio, checked.video.num_frames);
  if (!prepared.ok()) return prepared.status().with_context(references);
  checked.references = std::move(*prepared);
  const PreparedReferences& refs = checked.references;
  for (auto [kind, limit, name] : {std::tuple{h3::ReferenceKind::kImage, h3::kMaxImageReferences, "image"},
                                   std::tuple{h3::ReferenceKind::kVideo, h3::kMaxVideoReferences, "video"},
                                   std::tuple{h3::ReferenceKind::kAudio, h3::kMaxAudioReferences, "audio"}}) {
    if (refs.count(kind) > limit) {
      return invalid_argument(references + ": " + std::to_string(refs.count(kind)) + " " + name +
                              " references; at most " + std::to_string(limit) + " are accepted");
    }
  }
  if (refs.items.size() > static_cast<size_t>(h3::kMaxReferences)) {
    return invalid_argument(references + ": " + std::to_string(refs.items.size()) + " in all; at most " +
                            std::to_string(h3::kMaxReferences) + " are accepted");
  }
  if (refs.visuals.empty()) {
    return invalid_argument(references + ": an audio reference needs an image or video reference beside it");
  }
  std::vector<text::PresentedReference> presented;
  for (const PreparedReference& r : refs.items) {
    switch (r.kind) {
      case h3::ReferenceKind::kAudio: presented.push_back(text::PresentedReference::audio()); break;
      case h3::ReferenceKind::kImage:
        presented.push_back(text::PresentedReference::picture(r.pixels.size(0), r.pixels.size(1)));
        break;
      case h3::ReferenceKind::kVideo:
        presented.push_back(text::PresentedReference::video(r.pixels.size(0), h3::kFps, r.pixels.size(1),
                                                            r.pixels.size(2), r.has_soundtrack()));
        break;
    }
    presented.back().source = r.path;  // the conditioner's refusals name the file
  }
  auto presentation = text->reference_presentation(request.prompt, presented);
  if (!presentation.ok()) return presentation.status().with_context(references);
  return take_presentation(std::move(*presentation), checked);
}

// The layout the checked request will run on (its row count sizes the device arena).
Result<h3::PackedLayout> request_layout(const CheckedRequest& checked, const h3::H3Config& config) {
  VORTEX_ASSIGN_OR_RETURN(h3::LatentGeometry g, h3::resolve_geometry(checked.video, config));
  if (checked.fl2va()) return h3::build_keyframe_layout(checked.text_tags, g, config, checked.keyframes.anchors);
  if (checked.ref2va()) {
    std::vector<h3::ReferenceBlock> blocks;
    for (const PreparedReference& r : checked.references.items) {
      h3::ReferenceBlock block{r.kind, r.latent_frames, 0, 0, r.soundtrack_latents};
      if (r.kind != h3::ReferenceKind::kAudio) {
        // The spatial axes: an image's [H, W, 3], a video's [F, H, W, 3].
        const int rank = r.pixels.rank();
        block.latent_height = static_cast<int>(r.pixels.size(rank - 3) / h3::kVaeSpatialRatio);
        block.latent_width = static_cast<int>(r.pixels.size(rank - 2) / h3::kVaeSpatialRatio);
      }
      blocks.push_back(block);
    }
    return h3::build_ref2va_layout(checked.text_tags, blocks, g, config);
  }
  return h3::build_t2va_layout(checked.text_tokens(), g, config);
}

}  // namespace

Result<CheckedRequest> check_request(const RequestOptions& request, const h3::H3Config& config,
                                     const text::TextConditioner* text, const vae::AudioVaeConfig* audio_encoder) {
  CheckedRequest checked;
  auto plan = h3::AttentionPlan::parse(request.attention, request.exact_blocks, config.num_layers);
  if (!plan.ok()) return plan.status().with_context(request.field_name("exact-blocks"));
  checked.attention = *plan;
  checked.video = {request.height, request.width, request.frames};
  if (!request.keyframes.empty() && !request.references.empty()) {
    return invalid_argument(request.field_name("reference") +
                            ": references (ref2va) and keyframes (fl2va) are different tasks; give one");
  }
  if (!request.keyframes.empty()) {
    // A given canvas is checked before any keyframe is read.
    if (request.size_given) VORTEX_RETURN_IF_ERROR(h3::resolve_geometry(checked.video, config).status());
    VORTEX_RETURN_IF_ERROR(check_keyframes(request, text, checked));
  } else if (!request.references.empty()) {
    VORTEX_RETURN_IF_ERROR(h3::resolve_geometry(checked.video, config).status());
    VORTEX_RETURN_IF_ERROR(check_references(request, text, audio_encoder, checked));
  } else if (!request.prompt.empty()) {
    if (!request.text_path.empty()) {
      return invalid_argument(request.field_name("prompt") + " and text states both given; send one");
    }
    if (!text) {
      return invalid_argument(request.field_name("prompt") +
                              ": this model has no text encoder (start it with --text-encoder)");
    }
    auto ids = text->tokenize(request.prompt);
    if (!ids.ok()) return ids.status().with_context(request.field_name("prompt"));
    checked.prompt_ids = std::move(*ids);
  } else {
    VORTEX_ASSIGN_OR_RETURN(checked.text_states, read_text_states(request, config.text_dim));
  }
  VORTEX_ASSIGN_OR_RETURN(const h3::PackedLayout layout, request_layout(checked, config));
  checked.rows = layout.num_rows;
  VORTEX_RETURN_IF_ERROR(sampling::sigma_grid(request.steps, 1.0f).status());
  return checked;
}

Status check_decoder_takes(const MediaDecoder& decoder, const CheckedRequest& checked, const h3::H3Config& config,
                           const std::string& what) {
  VORTEX_ASSIGN_OR_RETURN(h3::LatentGeometry g, h3::resolve_geometry(checked.video, config));
  const Shape video{config.in_channels, g.latent_frames, g.latent_height, g.latent_width};
  const Shape audio{h3::kAudioChannels, g.audio_latents, config.audio_in_channels};
  return decoder.check_shapes(video, audio, what);
}

Result<LoadedStepModel> load_step_model(const ModelOptions& m, int64_t max_rows) {
  LoadedStepModel loaded;
  if (m.recipe != "bf16" && m.device != "cuda") {
    return invalid_argument("--recipe " + m.recipe + " runs on --device cuda only (the CPU runs the reference program)");
  }
  if (!m.devices.empty() && m.device != "cuda") return invalid_argument("--devices is for --device cuda");
  if (m.device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("--device cuda"));
    VORTEX_ASSIGN_OR_RETURN(loaded.device, load_cuda_model(m, max_rows, loaded));
#if defined(VORTEX_HAVE_NCCL)
    if (const auto* group = dynamic_cast<const dist::SequenceParallelH3*>(loaded.device.get())) {
      loaded.device_memory = [group]() -> nlohmann::json {
        nlohmann::json ranks = nlohmann::json::array();
        for (int r = 0; r < group->size(); ++r) {
          ranks.push_back({{"weights_bytes", group->weight_bytes(r)},
                           {"activations_peak_bytes", group->activation_peak_bytes(r)},
                           {"exchange_bytes", group->exchange_bytes(r)}});
        }
        return {{"ranks", ranks}};
      };
    }
#endif
    if (const auto* cuda_model = dynamic_cast<const h3::CudaH3Transformer*>(loaded.device.get())) {
      loaded.device_memory = [cuda_model]() -> nlohmann::json {
        size_t free_bytes = 0, total_bytes = 0;
        const bool known = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
        return {{"weights_bytes", cuda_model->weight_bytes()},
                {"activations_peak_bytes", cuda_model->activation_peak_bytes()},
                {"in_use_bytes (cudaMemGetInfo)", known ? nlohmann::json(total_bytes - free_bytes) : nlohmann::json()}};
      };
    }
    return loaded;
#else
    (void)max_rows;
    return unimplemented("--device cuda: this build has no CUDA backend");
#endif
  }
  const DType dtype = m.dtype == "f32" ? DType::kF32 : DType::kBF16;
  VORTEX_RETURN_IF_ERROR(load_transformer(m, dtype, loaded));
  loaded.cpu_steps = std::make_unique<h3::CpuStepModel>(*loaded.cpu);
  return loaded;
}

Status LoadedStepModel::merge_adapters(std::shared_ptr<const h3::LoraStack> loras, const std::set<std::string>& names) {
  if (device) return device->merge_adapters(base_weights, std::move(loras), merge_dtype, names);
  VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors weights, base_weights.all());
  VORTEX_RETURN_IF_ERROR(h3::merge_loras(weights, loras->applications(), merge_dtype));
  VORTEX_ASSIGN_OR_RETURN(h3::H3Weights assembled, h3::assemble_weights(weights, cpu->config(), cpu->dtype()));
  VORTEX_ASSIGN_OR_RETURN(std::unique_ptr<h3::H3Transformer> rebuilt, h3::H3Transformer::create(std::move(assembled)));
  cpu_steps = std::make_unique<h3::CpuStepModel>(*rebuilt);
  cpu = std::move(rebuilt);
  return ok_status();
}

Status encode_prompt(CheckedRequest& checked, text::TextConditioner* text) {
  if (checked.text_states.defined()) return ok_status();
  if (!text) return invalid_argument("the request's prompt needs a text encoder");
  const auto start = std::chrono::steady_clock::now();
  if (checked.fl2va() || checked.ref2va()) {
    VORTEX_ASSIGN_OR_RETURN(checked.text_states, text->encode_presentation(checked.presentation, checked.visuals()));
  } else {
    VORTEX_ASSIGN_OR_RETURN(checked.text_states, text->encode(checked.prompt_ids));
  }
  checked.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  checked.text_encoder = text->describe();
  return ok_status();
}

Status encode_request_images(CheckedRequest& checked, const KeyframeEncoder& encoder,
                             const SoundtrackEncoder* audio_encoder) {
  if (!checked.fl2va() && !checked.ref2va()) return ok_status();
  const auto start = std::chrono::steady_clock::now();
  if (checked.fl2va()) {
    VORTEX_ASSIGN_OR_RETURN(checked.keyframe_latents, encode_keyframes(checked.keyframes, encoder));
  } else {
    VORTEX_ASSIGN_OR_RETURN(checked.reference_latents, encode_references(checked.references, encoder, audio_encoder));
  }
  checked.keyframe_encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ok_status();
}

Result<RequestRun> run_request(LoadedStepModel& model, const ModelOptions& m, const RequestOptions& r,
                               const CheckedRequest& checked, const std::string& out_prefix,
                               const h3::ProgressCallback& progress, std::function<bool()> should_stop,
                               double load_seconds) {
  if (!checked.text_states.defined()) return internal_error("run_request: the prompt was not encoded");
  if (checked.fl2va() && checked.keyframe_latents.size() != checked.keyframes.pixels.size()) {
    return internal_error("run_request: the keyframes were not encoded");
  }
  if (checked.ref2va() && checked.reference_latents.size() != checked.references.items.size()) {
    return internal_error("run_request: the references were not encoded");
  }
  const Tensor& text_states = checked.text_states;
  h3::GenerateOptions options;
  options.video = checked.video;
  options.steps = r.steps;
  options.seed = r.seed;
  options.attention = checked.attention;
  options.should_stop = std::move(should_stop);
  RequestRun run;
  if (checked.fl2va()) {
    VORTEX_ASSIGN_OR_RETURN(run.result, h3::generate_fl2va(model.steps(), text_states, checked.text_tags,
                                                           checked.keyframe_latents, options, progress));
  } else if (checked.ref2va()) {
    VORTEX_ASSIGN_OR_RETURN(run.result, h3::generate_ref2va(model.steps(), text_states, checked.text_tags,
                                                            checked.reference_latents, options, progress));
  } else {
    VORTEX_ASSIGN_OR_RETURN(run.result, h3::generate_t2va(model.steps(), text_states, options, progress));
  }
  const h3::GenerateResult& result = run.result;

  const h3::LatentChecksum video = h3::latent_checksum(result.video_latents);
  const h3::LatentChecksum audio = h3::latent_checksum(result.audio_latents);
  const DType dtype = m.dtype == "f32" ? DType::kF32 : DType::kBF16;
  run.summary = {
      {"model", model.source},
      {"loras", model.loras},
      {"config", model.steps().config().to_json()},
      {"backend", m.device},
      {"cpu_gemm", cpu::gemm_variant_name(cpu::default_gemm_variant())},
      {"dtype", dtype_name(dtype)},
      {"attention", {{"mode", r.attention}, {"exact_blocks", r.exact_blocks}}},
      {"recipe", m.recipe},
      {"adaln_tables", m.device == "cuda" ? m.adaln_tables : "step"},
      {"vae_encode_precision", checked.fl2va() || checked.ref2va() ? nlohmann::json(m.vae_encode_precision)
                                                                   : nlohmann::json()},
      {"request",
       {{"task", checked.fl2va() ? "fl2va" : checked.ref2va() ? "ref2va" : "t2va"},
        {"height", checked.video.height}, {"width", checked.video.width}, {"frames", r.frames}, {"steps", r.steps}, {"seed", r.seed},
        {"text_tokens", text_states.size(0)},
        {"text", !r.prompt.empty() ? "prompt" : r.text_path.empty() ? "synthetic" : r.text_path}}},
      {"rows",
       {{"text", result.layout.num_text}, {checked.ref2va() ? "references" : "keyframes", result.layout.num_condition},
        {"audio", result.layout.num_audio}, {"video", result.layout.num_video},
        {"total", result.layout.num_rows}}},
      {"forwards", result.run.forwards},
      {"checksums",
       {{"video", {{"sha256", video.sha256}, {"sum", video.sum}}}, {"audio", {{"sha256", audio.sha256}, {"sum", audio.sum}}}}},
      {"seconds", {{"load", load_seconds}, {"encode_prompt", checked.encode_seconds},
                   {checked.ref2va() ? "encode_references" : "encode_keyframes", checked.keyframe_encode_seconds}, {"denoise", result.run.seconds}}},
  };
  if (!r.prompt.empty()) {
    run.summary["request"]["prompt"] = r.prompt;
    run.summary["request"]["prompt_tokens"] = checked.prompt_ids;
    run.summary["text_encoder"] = checked.text_encoder;
  }
  if (checked.fl2va()) {
    nlohmann::json keyframes = nlohmann::json::array();
    for (size_t k = 0; k < checked.keyframes.paths.size(); ++k) {
      keyframes.push_back({{"image", checked.keyframes.paths[k]},
                           {"anchor", checked.keyframes.anchors[k] == h3::KeyframeAnchor::kFirst ? "first" : "last"}});
    }
    run.summary["request"]["keyframes"] = keyframes;
  }
  if (checked.ref2va()) {
    nlohmann::json references = nlohmann::json::array();
    for (const PreparedReference& r : checked.references.items) {
      nlohmann::json entry;
      if (r.kind == h3::ReferenceKind::kImage) {
        entry = {{"image", r.path}, {"height", r.pixels.size(0)}, {"width", r.pixels.size(1)}};
      } else if (r.kind == h3::ReferenceKind::kVideo) {
        // The file's rate and frames, then what H3's clock and canvas made of them.
        entry = {{"video", r.path},         {"fps", r.source_fps},        {"source_frames", r.source_frames},
                 {"frames", r.pixels.size(0)}, {"encoded_frames", r.encoded_frames}, {"latent_frames", r.latent_frames},
                 {"height", r.pixels.size(1)}, {"width", r.pixels.size(2)}};
      } else {
        entry = {{"audio", r.path}};
      }
      if (r.has_soundtrack()) {
        // The file's own rate: what it was resampled from onto the audio VAE's.
        entry["sample_rate"] = r.soundtrack.sample_rate;
        entry["latents"] = r.soundtrack_latents;
      }
      references.push_back(std::move(entry));
    }
    run.summary["request"]["references"] = references;
    run.summary["request"]["reference_short_edge"] = r.reference_short_edge;
  }
  if (model.device_memory) run.summary["device_memory"] = model.device_memory();
  const std::map<std::string, std::string> metadata = {{"vortex", run.summary.dump()}};
  VORTEX_RETURN_IF_ERROR(write_safetensors(out_prefix + ".safetensors",
                                           {{"video_latents", result.video_latents}, {"audio_latents", result.audio_latents}},
                                           metadata));
  VORTEX_RETURN_IF_ERROR(write_file_atomically(out_prefix + ".json", run.summary.dump(2) + "\n"));
  return run;
}

h3::ProgressCallback progress_printer() {
  const bool tty = isatty(fileno(stderr));
  return [tty](const h3::StepProgress& p) {
    const double per_step = p.elapsed_seconds / p.step;
    const double eta = per_step * (p.total - p.step);
    if (tty) {
      const int width = 30, filled = width * p.step / p.total;
      std::fprintf(stderr, "\r[%.*s%.*s] step %d/%d  %.2f s/step  eta %.0f s ", filled,
                   "##############################", width - filled, "..............................", p.step,
                   p.total, per_step, eta);
      if (p.step == p.total) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "step %d/%d  %.3f s  (eta %.0f s)\n", p.step, p.total, p.step_seconds, eta);
    }
  };
}

}  // namespace vortex::cli
