// vortex generate: t2va denoising to latents, with per-modality checksums; with --media, the
// latents are then decoded to a WAV or an MP4 exactly as `vortex decode` does (decode_media).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "cpu/gemm.h"
#include "decode_media.h"
#include "formats/safetensors.h"
#include "models/h3/generate.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"
#include "sampling/h3_scheduler.h"
#if defined(VORTEX_HAVE_CUDA)
#include "cuda/runtime.h"
#include "models/h3/cuda_transformer.h"
#endif

namespace vortex::cli {

namespace {

struct GenerateArgs {
  std::string model_path;
  std::string synthetic_preset;
  uint64_t weights_seed = 0;
  std::string dtype = "bf16";
  std::string device = "cpu";
  std::string text_path;
  std::string text_key;
  int text_tokens = 32;
  int height = 768;
  int width = 1344;
  int frames = 124;
  int steps = 12;
  uint64_t seed = 0;
  std::string attention = "exact";
  std::string recipe = "bf16";
  std::string adaln_tables = "request";
  std::vector<int> exact_blocks;
  std::string out;
  MediaRequest media;  // media.out is --media; empty: latents only
};

Result<Tensor> read_text_states(const GenerateArgs& args, int text_dim) {
  if (args.text_path.empty()) {
    if (args.text_tokens < 1) return invalid_argument("--text-tokens must be >= 1");
    return h3::seeded_normal({args.text_tokens, text_dim}, args.seed, h3::kSyntheticTextStream);
  }
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(args.text_path));
  std::string key = args.text_key;
  if (key.empty()) {
    if (file.names().size() == 1) {
      key = file.names()[0];
    } else if (file.has("prompt_embeds")) {
      key = "prompt_embeds";
    } else {
      return invalid_argument(args.text_path + ": holds " + std::to_string(file.names().size()) +
                              " tensors; name one with --text-key");
    }
  }
  if (!file.has(key)) return invalid_argument(args.text_path + ": no tensor '" + key + "'");
  VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(key));
  if (t.rank() == 3 && t.size(0) == 1) {
    VORTEX_ASSIGN_OR_RETURN(t, t.select(0, 0));
  }
  if (t.rank() != 2 || t.size(1) != text_dim) {
    return invalid_argument(args.text_path + ": tensor '" + key + "' is " + t.describe() + ", expected [tokens, " +
                            std::to_string(text_dim) + "]");
  }
  if (t.dtype() == DType::kF16) return t.to(DType::kF32);
  return t;
}

// Owns whichever model runs the steps.
struct LoadedStepModel {
  std::unique_ptr<h3::H3Transformer> cpu;
  std::unique_ptr<h3::CpuStepModel> cpu_steps;
  std::unique_ptr<h3::StepModel> device;
  h3::StepModel& steps() { return device ? *device : *cpu_steps; }
  // --device cuda: the device memory the run used (weight arena, activation arena's peak, and
  // what cudaMemGetInfo reports in use), for the summary JSON.
  std::function<nlohmann::json()> device_memory;
};

Result<std::unique_ptr<h3::H3Transformer>> load_transformer(const GenerateArgs& args, DType dtype,
                                                           std::string& source) {
  if (!args.model_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(h3::LoadedModel loaded, h3::load_model(args.model_path, dtype));
    source = args.model_path + " (" + h3::layout_name(loaded.layout) + " layout)";
    return h3::H3Transformer::create(std::move(loaded.weights));
  }
  VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::config_preset(args.synthetic_preset));
  VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, h3::synthetic_weights(config, dtype, args.weights_seed));
  VORTEX_ASSIGN_OR_RETURN(h3::H3Weights weights, h3::assemble_weights(tensors, config, dtype));
  source = "synthetic preset '" + args.synthetic_preset + "' (weights seed " + std::to_string(args.weights_seed) + ")";
  return h3::H3Transformer::create(std::move(weights));
}

#if defined(VORTEX_HAVE_CUDA)
// The CUDA model: weights from the checkpoint (through pinned staging) or made on the device.
Result<std::unique_ptr<h3::StepModel>> load_cuda_model(const GenerateArgs& args, int64_t rows, std::string& source) {
  h3::CudaModelOptions model_options;
  model_options.int8fp8_attention = args.attention == "int8fp8";
  model_options.recipe = args.recipe == "fp8" ? h3::LinearRecipe::kFp8 : h3::LinearRecipe::kBf16;
  model_options.adaln_tables = args.adaln_tables == "step" ? h3::AdaLnTables::kPerStep : h3::AdaLnTables::kPerRequest;
  if (args.dtype != "bf16") return invalid_argument("--device cuda runs the bf16 program; use --dtype bf16");
  if (!args.model_path.empty()) {
    VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint checkpoint, ShardedCheckpoint::open(args.model_path));
    VORTEX_ASSIGN_OR_RETURN(h3::CheckpointLayout layout, h3::detect_layout(checkpoint.names()));
    VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::resolve_config(args.model_path, checkpoint));
    VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors tensors, h3::read_all(checkpoint));
    if (layout == h3::CheckpointLayout::kOriginal) {
      VORTEX_ASSIGN_OR_RETURN(tensors, h3::original_to_diffusers(tensors, config));
    }
    VORTEX_RETURN_IF_ERROR(h3::validate_against_schema(tensors, config));
    source = args.model_path + " (" + h3::layout_name(layout) + " layout, cuda)";
    VORTEX_ASSIGN_OR_RETURN(auto model, h3::CudaH3Transformer::create(config, h3::host_weight_filler(tensors, nullptr),
                                                                      rows, nullptr, model_options));
    return std::unique_ptr<h3::StepModel>(std::move(model));
  }
  VORTEX_ASSIGN_OR_RETURN(h3::H3Config config, h3::config_preset(args.synthetic_preset));
  source = "synthetic preset '" + args.synthetic_preset + "' (weights seed " + std::to_string(args.weights_seed) +
           ", made on the device)";
  VORTEX_ASSIGN_OR_RETURN(auto model, h3::CudaH3Transformer::create(
                                          config, h3::synthetic_weight_filler(args.weights_seed, nullptr), rows,
                                          nullptr, model_options));
  return std::unique_ptr<h3::StepModel>(std::move(model));
}
#endif

// Rows of the packed sequence a request needs, for sizing the device arena up front.
Result<int64_t> request_rows(const GenerateArgs& args, const h3::H3Config& config, int64_t text_rows) {
  VORTEX_ASSIGN_OR_RETURN(h3::LatentGeometry g, h3::resolve_geometry({args.height, args.width, args.frames}, config));
  VORTEX_ASSIGN_OR_RETURN(h3::PackedLayout layout, h3::build_t2va_layout(text_rows, g, config));
  return layout.num_rows;
}

Result<LoadedStepModel> load_step_model(const GenerateArgs& args, DType dtype, int64_t text_rows, std::string& source) {
  LoadedStepModel loaded;
  if (args.recipe != "bf16" && args.device != "cuda") {
    return invalid_argument("--recipe " + args.recipe + " runs on --device cuda only (the CPU runs the reference program)");
  }
  if (args.device == "cuda") {
#if defined(VORTEX_HAVE_CUDA)
    VORTEX_RETURN_IF_ERROR(cuda::require_hopper_device("--device cuda"));
    h3::H3Config config;
    if (!args.model_path.empty()) {
      VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint checkpoint, ShardedCheckpoint::open(args.model_path));
      VORTEX_ASSIGN_OR_RETURN(config, h3::resolve_config(args.model_path, checkpoint));
    } else {
      VORTEX_ASSIGN_OR_RETURN(config, h3::config_preset(args.synthetic_preset));
    }
    VORTEX_ASSIGN_OR_RETURN(int64_t rows, request_rows(args, config, text_rows));
    VORTEX_ASSIGN_OR_RETURN(loaded.device, load_cuda_model(args, rows, source));
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
    return unimplemented("--device cuda: this build has no CUDA backend");
#endif
  }
  VORTEX_ASSIGN_OR_RETURN(loaded.cpu, load_transformer(args, dtype, source));
  loaded.cpu_steps = std::make_unique<h3::CpuStepModel>(*loaded.cpu);
  return loaded;
}

// One line per step when stderr is not a terminal (logs), a redrawn bar when it is.
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

// With --media, the decoders, loaded and checked against the latent shapes this request will
// produce before any denoising time is spent.
Result<std::optional<MediaDecoder>> load_media_decoder(const GenerateArgs& args, const h3::H3Config& config) {
  const MediaRequest& m = args.media;
  if (m.out.empty()) {
    if (!m.audio_vae_path.empty() || !m.synthetic_audio_vae.empty() || !m.video_vae_path.empty() ||
        !m.synthetic_video_vae.empty()) {
      return invalid_argument("the VAE options decode the latents into --media PATH.wav|PATH.mp4, which is not given");
    }
    return std::optional<MediaDecoder>();
  }
  // The cheap checks before a checkpoint is read.
  VORTEX_RETURN_IF_ERROR(check_media_request(m));
  VORTEX_ASSIGN_OR_RETURN(h3::LatentGeometry g, h3::resolve_geometry({args.height, args.width, args.frames}, config));
  VORTEX_ASSIGN_OR_RETURN(MediaDecoder decoder, MediaDecoder::load(m));
  const Shape video{config.in_channels, g.latent_frames, g.latent_height, g.latent_width};
  const Shape audio{h3::kAudioChannels, g.audio_latents, config.audio_in_channels};
  VORTEX_RETURN_IF_ERROR(decoder.check_shapes(video, audio, "--media " + m.out));
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
  const DType dtype = args.dtype == "f32" ? DType::kF32 : DType::kBF16;
  std::string source;
  const auto load_start = std::chrono::steady_clock::now();
  if (Status out = check_out_prefix(args.out); !out.ok()) return report_error(out);
  // The text states come first: their row count sizes the device arena.
  auto preset_or_file_config = [&]() -> Result<h3::H3Config> {
    if (args.model_path.empty()) return h3::config_preset(args.synthetic_preset);
    VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint checkpoint, ShardedCheckpoint::open(args.model_path));
    return h3::resolve_config(args.model_path, checkpoint);
  };
  auto early_config = preset_or_file_config();
  if (!early_config.ok()) return report_error(early_config.status());
  auto plan = h3::AttentionPlan::parse(args.attention, args.exact_blocks, early_config->num_layers);
  if (!plan.ok()) return report_error(plan.status().with_context("--exact-blocks"));  // CLI checked the mode
  auto text = read_text_states(args, early_config->text_dim);
  if (!text.ok()) return report_error(text.status());
  // The request's geometry and step count, also before the weights load (a real checkpoint is 40 GB).
  if (auto rows = request_rows(args, *early_config, text->size(0)); !rows.ok()) return report_error(rows.status());
  if (auto grid = sampling::sigma_grid(args.steps, 1.0f); !grid.ok()) return report_error(grid.status());
  auto media = load_media_decoder(args, *early_config);
  if (!media.ok()) return report_error(media.status());
  auto model = load_step_model(args, dtype, text->size(0), source);
  if (!model.ok()) return report_error(model.status());
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const h3::H3Config& config = model->steps().config();

  h3::GenerateOptions options;
  options.video = {args.height, args.width, args.frames};
  options.steps = args.steps;
  options.seed = args.seed;
  options.attention = *plan;
  auto result = h3::generate_t2va(model->steps(), *text, options, progress_printer());
  if (!result.ok()) return report_error(result.status());

  const h3::LatentChecksum video = h3::latent_checksum(result->video_latents);
  const h3::LatentChecksum audio = h3::latent_checksum(result->audio_latents);
  nlohmann::json summary = {
      {"model", source},
      {"config", config.to_json()},
      {"backend", args.device},
      {"cpu_gemm", cpu::gemm_variant_name(cpu::default_gemm_variant())},
      {"dtype", dtype_name(dtype)},
      {"attention", {{"mode", args.attention}, {"exact_blocks", args.exact_blocks}}},
      {"recipe", args.recipe},
      {"adaln_tables", args.device == "cuda" ? args.adaln_tables : "step"},
      {"request",
       {{"height", args.height}, {"width", args.width}, {"frames", args.frames}, {"steps", args.steps},
        {"seed", args.seed}, {"text_tokens", text->size(0)}, {"text", args.text_path.empty() ? "synthetic" : args.text_path}}},
      {"rows",
       {{"text", result->layout.num_text}, {"audio", result->layout.num_audio}, {"video", result->layout.num_video},
        {"total", result->layout.num_rows}}},
      {"forwards", result->run.forwards},
      {"checksums",
       {{"video", {{"sha256", video.sha256}, {"sum", video.sum}}}, {"audio", {{"sha256", audio.sha256}, {"sum", audio.sum}}}}},
      {"seconds", {{"load", load_seconds}, {"denoise", result->run.seconds}}},
  };
  if (model->device_memory) summary["device_memory"] = model->device_memory();
  const std::map<std::string, std::string> metadata = {{"vortex", summary.dump()}};
  Status written = write_safetensors(args.out + ".safetensors",
                                     {{"video_latents", result->video_latents}, {"audio_latents", result->audio_latents}},
                                     metadata);
  if (!written.ok()) return report_error(written);
  written = write_file_atomically(args.out + ".json", summary.dump(2) + "\n");
  if (!written.ok()) return report_error(written);
  std::printf("video latents %s  sha256 %s  sum %.9g\n", result->video_latents.describe().c_str(),
              video.sha256.c_str(), video.sum);
  std::printf("audio latents %s  sha256 %s  sum %.9g\n", result->audio_latents.describe().c_str(),
              audio.sha256.c_str(), audio.sum);
  std::printf("%d forwards over %lld rows in %.2f s; wrote %s.safetensors and %s.json\n", result->run.forwards,
              static_cast<long long>(result->layout.num_rows), result->run.seconds, args.out.c_str(), args.out.c_str());
  if (*media) {
    std::fflush(stdout);  // the latents lines before the decode's progress
    written = (*media)->decode(&result->video_latents, result->audio_latents, args.out + ".safetensors");
    if (!written.ok()) return report_error(written);
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Denoise video and audio latents from text states (t2va)");
  auto* model = cmd->add_option("--model", args->model_path, "Checkpoint: .safetensors file, index JSON or folder");
  auto* synthetic = cmd->add_option("--synthetic", args->synthetic_preset,
                                    "Use deterministic synthetic weights of a preset (h3, test, small, mid)");
  model->excludes(synthetic);
  cmd->add_option("--weights-seed", args->weights_seed, "Seed of the synthetic weights (transformer and VAEs)")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "Where the transformer runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "Activation and weight dtype")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--text", args->text_path, "Text states (Qwen3-VL layer-50 hidden states) as safetensors");
  cmd->add_option("--text-key", args->text_key, "Tensor name inside --text (default: the only tensor)");
  cmd->add_option("--text-tokens", args->text_tokens, "Synthetic text states: number of tokens (without --text)")
      ->capture_default_str();
  cmd->add_option("--height", args->height, "Video height in pixels")->capture_default_str();
  cmd->add_option("--width", args->width, "Video width in pixels")->capture_default_str();
  cmd->add_option("--frames", args->frames, "Frames at 24 fps, of the form 17n + 5")->capture_default_str();
  cmd->add_option("--steps", args->steps, "Sigma grid points including the final 0 (steps - 1 forwards)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Noise seed (Philox)")->capture_default_str();
  cmd->add_option("--attention", args->attention,
                  "Attention mode: exact, or int8fp8 (approximate: ~0.04 rel-L2 vs exact per attention)")
      ->check(CLI::IsMember({"exact", "int8fp8"}))
      ->capture_default_str();
  cmd->add_option("--recipe", args->recipe,
                  "Block linears: bf16, or fp8 (--device cuda; e4m3 weights and activations, approximate: "
                  "~1.6e-3 rel-L2 vs bf16 per block)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--adaln-tables", args->adaln_tables,
                  "--device cuda: AdaLN modulation tables computed once per request (the 26 GB of AdaLN weights "
                  "never stay on the device) or per step from resident weights; bitwise the same result")
      ->check(CLI::IsMember({"request", "step"}))
      ->capture_default_str();
  cmd->add_option("--exact-blocks", args->exact_blocks, "With --attention int8fp8: blocks that stay exact (e.g. 0,1,49)")
      ->delimiter(',');
  cmd->add_option("--out", args->out, "Output prefix: writes PREFIX.safetensors and PREFIX.json")->required();
  args->media.out_flag = "--media";
  cmd->add_option("--media", args->media.out,
                  "Then decode the latents to PATH.wav (soundtrack) or PATH.mp4 (picture and sound), as vortex decode");
  add_vae_options(cmd, args->media);
  cmd->callback([args, &action, model, synthetic] {
    if (model->count() == 0 && synthetic->count() == 0) {
      throw CLI::ValidationError("generate", "one of --model or --synthetic is required");
    }
    action = [args] {
      args->media.weights_seed = args->weights_seed;
      args->media.device = args->device;  // the decoders run where the transformer ran
      return run_generate(*args);
    };
  });
}

}  // namespace vortex::cli
