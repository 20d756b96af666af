// vortex generate: t2va denoising to latents (fl2va with --first-frame / --last-frame, ref2va with
// --reference), with
// per-modality checksums; with --media, the latents are then decoded to a WAV or an MP4 exactly as
// `vortex decode` does (decode_media).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "decode_media.h"
#include "generate_common.h"
#include "models/h3/generate.h"

namespace vortex::cli {

namespace {

struct GenerateArgs {
  ModelOptions model;
  RequestOptions request;
  std::string out;
  MediaRequest media;  // media.out is --media; empty: latents only
  std::string first_frame, last_frame;
  // fl2va or ref2va: the video VAE encodes pictures.
  bool encodes_images() const { return !request.keyframes.empty() || !request.references.empty(); }
  // ref2va with a soundtrack, or a video that may carry one: the audio VAE encodes it.
  bool encodes_audio() const {
    return std::any_of(request.references.begin(), request.references.end(), [](const std::string& path) {
      const auto kind = reference_kind_of(path);
      return kind == h3::ReferenceKind::kAudio || kind == h3::ReferenceKind::kVideo;
    });
  }
};

// The decoders' half of the VAE options: with keyframes or references, the video VAE also encodes
// them, so it may come without --media, or beside a WAV-only --media.
MediaRequest decode_part(const GenerateArgs& args) {
  MediaRequest m = args.media;
  if (args.encodes_images() && !m.out.ends_with(".mp4")) {
    m.video_vae_path.clear();
    m.synthetic_video_vae.clear();
  }
  if (args.encodes_audio() && m.out.empty()) {
    m.audio_vae_path.clear();
    m.synthetic_audio_vae.clear();
  }
  return m;
}

// With --media, the decoders, loaded and checked against the latent shapes this request will
// produce before any denoising time is spent.
Result<std::optional<MediaDecoder>> load_media_decoder(const GenerateArgs& args, const CheckedRequest& checked,
                                                       const h3::H3Config& config) {
  const MediaRequest m = decode_part(args);
  if (m.out.empty()) {
    if (any_vae_option(m)) {
      return invalid_argument("the VAE options decode the latents into --media PATH.wav|PATH.mp4, which is not given");
    }
    return std::optional<MediaDecoder>();
  }
  // The cheap checks before a checkpoint is read.
  VORTEX_RETURN_IF_ERROR(check_media_request(m));
  VORTEX_ASSIGN_OR_RETURN(MediaDecoder decoder, MediaDecoder::load(m));
  VORTEX_RETURN_IF_ERROR(check_decoder_takes(decoder, checked, config, "--media " + m.out));
  return std::optional<MediaDecoder>(std::move(decoder));
}

// --out PREFIX names files, PREFIX.safetensors and PREFIX.json, in a folder that must exist: checked
// before any weight is read, so a typo cannot cost a whole denoise.
Status check_out_prefix(const std::string& prefix) {
  namespace fs = std::filesystem;
  const fs::path path(prefix);
  if (!path.has_filename()) {
    return invalid_argument("--out " + prefix + ": must name a file prefix (PREFIX.safetensors, PREFIX.json), not a folder");
  }
  const fs::path folder = path.parent_path();
  std::error_code ec;
  if (!folder.empty() && !fs::is_directory(folder, ec)) {
    return invalid_argument("--out " + prefix + ": the folder " + folder.string() + " does not exist");
  }
  if (::access(folder.empty() ? "." : folder.c_str(), W_OK) != 0) {
    return invalid_argument("--out " + prefix + ": the folder " + (folder.empty() ? "." : folder.string()) +
                            " is not writable");
  }
  return ok_status();
}

int run_generate(const GenerateArgs& args) {
  const auto load_start = std::chrono::steady_clock::now();
  if (Status out = check_out_prefix(args.out); !out.ok()) return report_error(out);
  if (Status precision = check_vae_encode_precision(args.model.vae_encode_precision, args.model.device);
      !precision.ok()) {
    return report_error(precision);
  }
  // Everything about the request before the weights load (a real checkpoint is 40 GB); the text
  // states come first, since their row count sizes the device arena.
  auto config = model_config(args.model);
  if (!config.ok()) return report_error(config.status());
  auto text = load_text_conditioner(args.model, *config);
  if (!text.ok()) return report_error(text.status());
  // The audio VAE's encoder only when the request has a soundtrack (without one named, the check says so).
  Result<std::optional<SoundtrackEncoder>> audio_encoder = std::optional<SoundtrackEncoder>();
  if (args.encodes_audio()) audio_encoder = SoundtrackEncoder::load(args.media, args.model.device);
  if (!audio_encoder.ok()) return report_error(audio_encoder.status().with_context("--reference"));
  auto checked =
      check_request(args.request, *config, text->get(), *audio_encoder ? &(*audio_encoder)->config() : nullptr);
  if (!checked.ok()) return report_error(checked.status());
  if (args.encodes_images()) {
    const Status named = check_keyframe_encoder_named(args.media.video_vae_path, args.media.synthetic_video_vae);
    if (!named.ok()) {
      return report_error(named.with_context(checked->ref2va() ? "--reference" : "--first-frame / --last-frame"));
    }
  }
  auto media = load_media_decoder(args, *checked, *config);
  if (!media.ok()) return report_error(media.status());
  // The prompt is encoded before the transformer loads, and the encoder let go after it: on
  // --device cuda the two never hold device memory at once.
  double encode_seconds = 0.0;
  if (!args.request.prompt.empty()) {
    const auto encode_start = std::chrono::steady_clock::now();
    std::fprintf(stderr, "encoding the prompt: %zu tokens through %s\n", checked->prompt_ids.size(),
                 (*text)->describe().c_str());
    if (Status encoded = encode_prompt(*checked, text->get()); !encoded.ok()) return report_error(encoded);
    text->reset();
    if (checked->fl2va() || checked->ref2va()) {
      auto encoder = KeyframeEncoder::load(args.media.video_vae_path, args.media.synthetic_video_vae,
                                           args.media.weights_seed, args.model.device, args.model.vae_encode_precision);
      if (!encoder.ok()) return report_error(encoder.status());
      const SoundtrackEncoder* audio = *audio_encoder ? &**audio_encoder : nullptr;
      if (Status encoded = encode_request_images(*checked, *encoder, audio); !encoded.ok()) return report_error(encoded);
      audio_encoder->reset();
    }
    encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
  }
  auto model = load_step_model(args.model, checked->rows);
  if (!model.ok()) return report_error(model.status());
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count() - encode_seconds;

  auto run = run_request(*model, args.model, args.request, *checked, args.out, progress_printer(), nullptr, load_seconds);
  if (!run.ok()) return report_error(run.status());
  const h3::GenerateResult& result = run->result;
  const nlohmann::json& sums = run->summary["checksums"];
  std::printf("video latents %s  sha256 %s  sum %.9g\n", result.video_latents.describe().c_str(),
              sums["video"]["sha256"].get<std::string>().c_str(), sums["video"]["sum"].get<double>());
  std::printf("audio latents %s  sha256 %s  sum %.9g\n", result.audio_latents.describe().c_str(),
              sums["audio"]["sha256"].get<std::string>().c_str(), sums["audio"]["sum"].get<double>());
  std::printf("%d forwards over %lld rows in %.2f s; wrote %s.safetensors and %s.json\n", result.run.forwards,
              static_cast<long long>(result.layout.num_rows), result.run.seconds, args.out.c_str(), args.out.c_str());
  if (*media) {
    std::fflush(stdout);  // the latents lines before the decode's progress
    const Status written =
        (*media)->decode(&result.video_latents, result.audio_latents, args.out + ".safetensors");
    if (!written.ok()) return report_error(written);
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Denoise video and audio latents from a prompt or text states (t2va), a prompt and keyframes (fl2va), or a "
      "prompt and references: images, videos, soundtracks (ref2va)");
  const auto check_model_given = add_model_options(cmd, args->model);
  auto* prompt = cmd->add_option("--prompt", args->request.prompt, "The prompt, encoded by --text-encoder");
  auto* text_states =
      cmd->add_option("--text", args->request.text_path, "Text states (Qwen3-VL layer-50 hidden states) as safetensors")
          ->excludes(prompt);
  cmd->add_option("--text-key", args->request.text_key, "Tensor name inside --text (default: the only tensor)");
  auto* text_tokens =
      cmd->add_option("--text-tokens", args->request.text_tokens, "Synthetic text states: number of tokens (without --text)")
          ->excludes(prompt)
          ->capture_default_str();
  for (auto [flag, path, what] : {std::tuple{"--first-frame", &args->first_frame, "starts"},
                                  std::tuple{"--last-frame", &args->last_frame, "ends"}}) {
    cmd->add_option(flag, *path,
                    std::string("fl2va: a PNG the video ") + what +
                        " on, shown to the text encoder with --prompt and encoded by the video VAE "
                        "(--video-vae or --synthetic-video-vae; on the CPU)")
        ->excludes(text_states)
        ->excludes(text_tokens);
  }
  cmd->add_option("--reference", args->request.references,
                  "ref2va: a reference, repeated in the order the model reads them (at most 12): a PNG image (at "
                  "most 9; shown to the text encoder with --prompt and encoded by the video VAE at its own size), "
                  "a video (.mp4, .mov, .mkv, .webm, .m4v; at most 3; put on the 24 fps clock, cut at --frames, "
                  "on the canvas of its aspect ratio; its soundtrack encoded too) or a WAV soundtrack (at most 3, "
                  "beside an image or video). Soundtracks are resampled onto the audio VAE's rate and encoded by "
                  "--audio-vae or --synthetic-audio-vae. Run it on the checkpoint's transformer_ref partition "
                  "(--model .../transformer_ref)")
      ->excludes(text_states)
      ->excludes(text_tokens);
  cmd->add_option("--reference-short-edge", args->request.reference_short_edge,
                  "ref2va: the short edge a reference image is encoded at (the checkpoint's "
                  "reference_image_short_edge)")
      ->capture_default_str();
  auto* height = cmd->add_option("--height", args->request.height,
                                 "Video height in pixels (with keyframes and no --height / --width: the first "
                                 "keyframe's canvas)")
                     ->capture_default_str();
  auto* width = cmd->add_option("--width", args->request.width, "Video width in pixels")->capture_default_str();
  cmd->add_option("--frames", args->request.frames, "Frames at 24 fps, of the form 17n + 5")->capture_default_str();
  cmd->add_option("--steps", args->request.steps, "Sigma grid points including the final 0 (steps - 1 forwards)")
      ->capture_default_str();
  cmd->add_option("--seed", args->request.seed, "Noise seed (Philox)")->capture_default_str();
  cmd->add_option("--attention", args->request.attention,
                  "Attention mode: exact, or int8fp8 (approximate: ~0.04 rel-L2 vs exact per attention)")
      ->check(CLI::IsMember({"exact", "int8fp8"}))
      ->capture_default_str();
  cmd->add_option("--exact-blocks", args->request.exact_blocks, "With --attention int8fp8: blocks that stay exact (e.g. 0,1,49)")
      ->delimiter(',');
  cmd->add_option("--out", args->out, "Output prefix: writes PREFIX.safetensors and PREFIX.json")->required();
  args->media.out_flag = "--media";
  cmd->add_option("--media", args->media.out,
                  "Then decode the latents to PATH.wav (soundtrack) or PATH.mp4 (picture and sound), as vortex decode");
  add_vae_options(cmd, args->media);
  cmd->callback([args, &action, check_model_given, prompt, height, width] {
    check_model_given();
    // An empty --prompt is a mistake to name, not a request for synthetic text states.
    const bool empty_prompt = prompt->count() > 0 && args->request.prompt.empty();
    args->request.size_given = height->count() + width->count() > 0;
    const bool half_size = height->count() + width->count() == 1;
    if (!args->first_frame.empty()) args->request.keyframes.push_back({args->first_frame, h3::KeyframeAnchor::kFirst});
    if (!args->last_frame.empty()) args->request.keyframes.push_back({args->last_frame, h3::KeyframeAnchor::kLast});
    action = [args, empty_prompt, half_size] {
      if (empty_prompt) return report_error(invalid_argument("--prompt: empty (H3 needs at least one text token)"));
      if (half_size && !args->request.keyframes.empty()) {
        return report_error(invalid_argument(
            "--height / --width: with keyframes give both (the canvas) or neither (the first keyframe's canvas)"));
      }
      args->model.int8fp8_workspace = args->request.attention == "int8fp8";
      args->media.weights_seed = args->model.weights_seed;
      args->media.device = args->model.device;  // the decoders run where the transformer ran
      return run_generate(*args);
    };
  });
}

}  // namespace vortex::cli
