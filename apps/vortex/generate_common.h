// What `vortex generate` and `vortex serve` share: the model a process loads once, the checks a
// request passes before any denoising time is spent, and one request run into PREFIX.safetensors
// (the latents, with the summary in its metadata) and PREFIX.json (the summary).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "decode_media.h"
#include "keyframe_request.h"
#include "models/h3/config.h"
#include "models/h3/generate.h"
#include "models/h3/step_model.h"
#include "models/h3/transformer.h"
#include "text/text_conditioner.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cli {

// A submitted value as an error shows it: its JSON (non-ASCII escaped), cut after 80 characters so
// that a megabyte-long value does not make a megabyte-long message.
std::string shown_value(const nlohmann::json& value);

// The model: where its weights come from and how it runs.
struct ModelOptions {
  std::string model_path;        // a checkpoint, or empty for
  std::string synthetic_preset;  // deterministic synthetic weights of this preset
  uint64_t weights_seed = 0;
  std::string dtype = "bf16";  // the CPU program's; --device cuda runs bf16
  std::string device = "cpu";
  std::string recipe = "bf16";
  std::string adaln_tables = "request";
  std::string vae_encode_precision = "fp32";  // the video VAE encoder's convs (check_vae_encode_precision)
  // --device cuda: reserve the int8fp8 attention workspace so that requests may ask for that mode.
  bool int8fp8_workspace = false;
  // --device cuda: the GPUs, "0,1" or "all" (empty: the current device); more than one runs the
  // transformer sequence-parallel across them (dist/sequence_parallel_h3.h).
  std::string devices;
  // The text encoder that turns a request's prompt into text states (empty: prompts are refused).
  std::string text_encoder_path;
  std::string tokenizer_path;  // empty: tokenizer.json beside the text encoder
  int text_encoder_layer = text::kH3TextEncoderLayer;
  // The vision tower's image processor settings for keyframes (empty: beside the text encoder).
  std::string processor_path;
  // LoRA adapters merged into the transformer's weights at load, in order: "PATH" or "PATH:STRENGTH".
  std::vector<std::string> loras;
  // Keep the weights as read, before any adapter, so that other adapters can be merged into them
  // later (serve --lora-dir); on --device cuda the synthetic weights are then made on the host.
  bool keep_base_weights = false;
};

// One request: the video's geometry, the schedule, the noise and the text: a prompt (encoded by the
// text encoder), text states from a file, or synthetic states.
struct RequestOptions {
  int height = 768;
  int width = 1344;
  int frames = 124;
  int steps = 12;
  uint64_t seed = 0;
  std::string attention = "exact";
  std::vector<int> exact_blocks;
  std::string prompt;     // encoded by the model's text encoder; else
  std::string text_path;  // safetensors with the Qwen3-VL layer-50 states, or empty for
  std::string text_key;   // (the tensor inside text_path; empty: the only one, or prompt_embeds)
  int text_tokens = 32;   // synthetic states of this many tokens
  // fl2va: keyframes (PNGs) the video starts and / or ends on, with a prompt. They are put on the
  // request's height x width canvas, or, when the size was left to its defaults (!size_given), the
  // canvas follows the first keyframe (h3::keyframe_canvas).
  std::vector<KeyframeInput> keyframes;
  bool size_given = true;
  // ref2va: references in the order the model reads them, with a prompt: PNG images, each encoded
  // at its own size (reference_short_edge, the checkpoint's reference_image_short_edge), videos
  // (MP4 and the like: onto H3's 24 fps clock, cut at the generated length, on the canvas of their
  // aspect ratio; their soundtrack too) and WAV soundtracks (any rate, resampled onto the audio VAE's). The canvas is the request's (768 x 1344
  // by default, the pipeline's 16:9).
  std::vector<std::string> references;
  int64_t reference_short_edge = h3::kReferenceImageShortEdge;
  // The names the errors use for the fields (the CLI's flags, or the served request's JSON keys).
  std::function<std::string(const std::string& field)> field_name = [](const std::string& f) { return "--" + f; };
};

// Registers the model's flags (--model or --synthetic, --weights-seed, --device, --dtype, --recipe,
// --adaln-tables, --text-encoder, --tokenizer, --text-encoder-layer) on `cmd`, spelled and explained alike in generate and serve. The function returned
// is for the subcommand's callback: it throws CLI's error unless --model or --synthetic came.
std::function<void()> add_model_options(CLI::App* cmd, ModelOptions& model);

// The config of the model the options name (the preset's, or the checkpoint's: cheap, no weights read).
Result<h3::H3Config> model_config(const ModelOptions& model);

// The text encoder and tokenizer the options name, or null without --text-encoder. The encoder
// runs on --device; on cuda its weights go to the device at its prepare() or first encode.
Result<std::unique_ptr<text::TextConditioner>> load_text_conditioner(const ModelOptions& model,
                                                                     const h3::H3Config& config);

// A request that passed every check that needs no transformer weights: its text (states, or a
// prompt's token ids to encode when it runs), attention plan and packed row count.
struct CheckedRequest {
  Tensor text_states;                // [tokens, text_dim], or undefined when
  std::vector<int32_t> prompt_ids;   // the prompt's tokens (with keyframes: the presentation's), before encode_prompt
  std::string text_encoder;          // what encoded them, for the summary
  double encode_seconds = 0.0;
  h3::AttentionPlan attention;
  h3::VideoGeometry video;  // the request's size, or the keyframes' canvas
  int64_t rows = 0;
  // fl2va: the keyframes on the canvas, the presentation the text encoder takes (its picture rows
  // tagged video), and, after encode_request_keyframes, their conditioning latents.
  PreparedKeyframes keyframes;
  text::Presentation presentation;
  std::vector<int32_t> text_tags;
  std::vector<h3::Keyframe> keyframe_latents;
  // ref2va: the references read (their presentation above), and after encode_request_images their
  // conditioning.
  PreparedReferences references;
  std::vector<h3::Reference> reference_latents;
  double keyframe_encode_seconds = 0.0;  // keyframes' or references' encode
  bool fl2va() const { return !keyframes.pixels.empty(); }
  bool ref2va() const { return !references.items.empty(); }
  // What the text encoder is shown: the keyframes, or the image and video references.
  const std::vector<Tensor>& visuals() const { return ref2va() ? references.visuals : keyframes.pixels; }
  int64_t text_tokens() const { return text_states.defined() ? text_states.size(0) : static_cast<int64_t>(prompt_ids.size()); }
};
// `text` tokenizes a prompt; a request with a prompt and no text encoder is refused.
// `audio_encoder` is the audio VAE encoder's config when audio references can be encoded (null:
// they are refused by name).
Result<CheckedRequest> check_request(const RequestOptions& request, const h3::H3Config& config,
                                     const text::TextConditioner* text = nullptr,
                                     const vae::AudioVaeConfig* audio_encoder = nullptr);

// The decoders take the latents this request will produce (errors prefixed by `what`).
Status check_decoder_takes(const MediaDecoder& decoder, const CheckedRequest& checked, const h3::H3Config& config,
                           const std::string& what);

// Owns whichever model runs the steps.
struct LoadedStepModel {
  std::unique_ptr<h3::H3Transformer> cpu;
  std::unique_ptr<h3::CpuStepModel> cpu_steps;
  std::unique_ptr<h3::StepModel> device;
  std::string source;  // where the weights came from, for the summaries
  nlohmann::json loras = nlohmann::json::array();  // the LoRA adapters merged into them (lora_summary)
  // ModelOptions::keep_base_weights: the weights before any adapter (host; an original layout's
  // fused parts gathered as they are read), the dtype adapters are merged in, and the weights the
  // --lora adapters changed.
  h3::HostWeights base_weights;
  DType merge_dtype = DType::kBF16;
  std::set<std::string> merged_weights;
  h3::StepModel& steps() { return device ? *device : *cpu_steps; }
  // The weights named in `names` become base_weights' with `loras` merged (merge_loras's bits in
  // merge_dtype): merged and written in place on the device; on the CPU merged on the host and the
  // model rebuilt from them, replaced only once that succeeded.
  Status merge_adapters(std::shared_ptr<const h3::LoraStack> loras, const std::set<std::string>& names);
  // --device cuda: the device memory the run used (weight arena, activation arena's peak, and
  // what cudaMemGetInfo reports in use), for the summary JSON.
  std::function<nlohmann::json()> device_memory;
};

// Loads the model; on --device cuda its activation arena holds requests of up to `max_rows` rows.
Result<LoadedStepModel> load_step_model(const ModelOptions& model, int64_t max_rows);

struct RequestRun {
  nlohmann::json summary;  // what PREFIX.json holds
  h3::GenerateResult result;
};

// A prompt's text states: encodes checked.prompt_ids (with keyframes, the presentation and their
// pixels) with `text` into checked.text_states (nothing to do for a request that came with its states).
Status encode_prompt(CheckedRequest& checked, text::TextConditioner* text);

// fl2va / ref2va: the keyframes' or image references' conditioning latents through the video VAE
// encoder (on the CPU or the GPU), into checked.keyframe_latents / reference_latents; nothing to do
// for t2va.
Status encode_request_images(CheckedRequest& checked, const KeyframeEncoder& encoder,
                             const SoundtrackEncoder* audio_encoder = nullptr);

// Denoises one checked request (its text states encoded) on the loaded model and writes
// PREFIX.safetensors and PREFIX.json (each atomically: a failed or cancelled run leaves neither).
// `should_stop` may cancel between steps.
Result<RequestRun> run_request(LoadedStepModel& model, const ModelOptions& model_options,
                               const RequestOptions& request, const CheckedRequest& checked,
                               const std::string& out_prefix, const h3::ProgressCallback& progress,
                               std::function<bool()> should_stop, double load_seconds);

// One line per step when stderr is not a terminal (logs), a redrawn bar when it is.
h3::ProgressCallback progress_printer();

}  // namespace vortex::cli
