// The whole-model workloads of `vortex bench` at the canonical shape (768 x 1344, 124 frames, 100
// text tokens: 37,810 packed rows), synthetic weights made on the device:
//
//   h3-forward  one forward (50 blocks, output norm and heads; refiner prepared once) per recipe:
//               bf16, then fp8; the diffusers transformer as peer (eager, its own random weights).
//               The fp8 manifest states the recipe's error on the forward's velocities.
//   h3-denoise  the canonical 12-evaluation denoise per configuration (bf16; fp8; fp8 with int8fp8
//               attention), timed per step, plus the error of fp8 against bf16 after a 2-step
//               trajectory and after the whole denoise, both from the same noise.
//   h3-denoise-sp  the denoise sequence-parallel over every GPU of the machine
//               (dist/sequence_parallel_h3.h), bf16 and fp8 + int8fp8, each with the one-GPU
//               denoise of its configuration in the same call as its peer; the error against it
//               after 2 and 12 steps, stated.
//
// Each manifest records the device memory: the weight arena, the activation arena, and what
// cudaMemGetInfo reports in use with the model loaded (context, cuBLASLt workspace and the
// timer's L2-flush buffer included).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "bench/cuda_bench_util.h"
#include "bench/cuda_gpu_monitor.h"
#include "bench/cuda_workloads.h"
#include "formats/safetensors.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#if defined(VORTEX_HAVE_NCCL)
#include "dist/sequence_parallel_h3.h"
#endif

namespace vortex::bench {

namespace {

constexpr uint64_t kDenoiseNoiseSeed = 1;  // the canonical generate request's seed

// fp8 outputs (velocities, latents) against bf16's from the same weights and inputs: the recipe's
// error, stated; the bound only catches a broken recipe (the block alone is 1.6e-3 from bf16).
constexpr double kFp8ErrorBound = 5e-2;

struct Canonical {
  h3::H3Config config;
  h3::PackedLayout layout;
  Tensor text;
};

Result<Canonical> canonical_request(uint64_t seed) {
  Canonical c;
  c.config = *h3::config_preset("h3");
  VORTEX_ASSIGN_OR_RETURN(c.layout, h3::canonical_t2va_layout(c.config));
  c.text = h3::seeded_normal({h3::kCanonicalTextTokens, c.config.text_dim}, seed, h3::kSyntheticTextStream);
  return c;
}

std::string recipe_name(h3::LinearRecipe recipe) { return recipe == h3::LinearRecipe::kFp8 ? "fp8" : "bf16"; }

nlohmann::json recipe_description(h3::LinearRecipe recipe) {
  if (recipe == h3::LinearRecipe::kBf16) return "bf16 (cuBLASLt bf16 GEMMs, fp32 accumulate)";
  return "fp8 (e4m3 block weights per output channel, e4m3 activations per token from fused producers, "
         "cuBLASLt outer-vector scales; the out projection: weight scales per output channel x 128 inputs, "
         "attention-output scales per 128 tokens x head written by the attention pass, cuBLASLt VEC128 x "
         "BLK128x128 scales; fp32 accumulate)";
}

Result<nlohmann::json> memory_json(const h3::CudaH3Transformer& model) {
  VORTEX_ASSIGN_OR_RETURN(const size_t in_use_bytes, device_bytes_in_use());
  const int64_t in_use = static_cast<int64_t>(in_use_bytes), weights = static_cast<int64_t>(model.weight_bytes());
  return nlohmann::json{{"weights", weights},
                        {"activations_arena", model.activation_peak_bytes()},
                        {"in_use (cudaMemGetInfo, model loaded)", in_use},
                        {"in_use_beyond_weights", in_use - weights}};
}

Result<std::unique_ptr<h3::CudaH3Transformer>> make_model(const BenchOptions& o, const Canonical& c,
                                                          h3::LinearRecipe recipe, bool int8fp8,
                                                          h3::AdaLnTables tables) {
  h3::CudaModelOptions options;
  options.recipe = recipe;
  options.adaln_tables = tables;
  options.int8fp8_attention = int8fp8;
  VORTEX_ASSIGN_OR_RETURN(const BlockFusions fusions, block_fusions_from_env());
  options.fused_norms = fusions.fused_norms;
  options.fold_ffn_residual = fusions.fold_ffn_residual;
  return h3::CudaH3Transformer::create(c.config, h3::synthetic_weight_filler(o.seed, nullptr), c.layout.num_rows,
                                       nullptr, options);
}

}  // namespace

Result<std::vector<Manifest>> bench_forward(const BenchOptions& o) {
  VORTEX_ASSIGN_OR_RETURN(const Canonical c, canonical_request(o.seed));
  const h3::PackedLayout& layout = c.layout;
  const h3::H3Config& config = c.config;
  h3::StepInputs in;
  in.video_rows = h3::seeded_normal({layout.num_video, config.video_patch_dim()}, o.seed, h3::kVideoNoiseStream);
  in.audio_rows = h3::seeded_normal({layout.num_audio, config.audio_in_channels}, o.seed, h3::kAudioNoiseStream);
  in.timesteps = h3::assign_row_timesteps(layout, 0.55f, 0.7f);
  const double n = static_cast<double>(layout.num_rows), C = config.hidden_size, inner = config.inner_dim(),
               f = config.ffn_dim;
  const double block_flops = 2 * n * C * (3 * inner) + 2 * n * inner * C + 2 * n * C * (2 * f) + 2 * n * f * C +
                             4 * n * n * config.num_attention_heads * config.attention_head_dim;
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(const BlockFusions fused, block_fusions_from_env());

  std::vector<Manifest> manifests;
  h3::StepOutputs bf16_out;
  for (h3::LinearRecipe recipe : {h3::LinearRecipe::kBf16, h3::LinearRecipe::kFp8}) {
    VORTEX_ASSIGN_OR_RETURN(auto model, make_model(o, c, recipe, /*int8fp8=*/false, h3::AdaLnTables::kPerStep));
    VORTEX_RETURN_IF_ERROR(model->prepare(layout, c.text));
    h3::StepOutputs out;
    auto body = [&]() -> Status {
      VORTEX_ASSIGN_OR_RETURN(out, model->forward(in));
      return ok_status();
    };
    VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
    const h3::StepOutputs timed = out;
    VORTEX_RETURN_IF_ERROR(body());

    Manifest m;
    m.workload = recipe == h3::LinearRecipe::kBf16 ? "h3-forward" : "h3-forward-fp8";
    m.samples = samples;
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json memory, memory_json(*model));
    m.derived = {{"tflops_blocks", config.num_layers * block_flops / (samples.median() * 1e-3) / 1e12},
                 {"device_bytes", memory}};
    m.workload_section = {{"name", m.workload}, {"rows", layout.num_rows}, {"blocks", config.num_layers},
                          {"refiner", "prepared once per request, not timed"}, {"recipe", recipe_name(recipe)},
                          {"weights", "synthetic (models/h3/synthetic_rule.h)"}, {"timesteps", in.timesteps.timesteps},
                          {"seed", o.seed}};
    m.protocol = protocol_json(o);
    m.protocol["timed"] = "host rows in -> host velocities out (uploads, 50 blocks, heads, downloads)";
    VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
    // The FFN residual fold needs tables per request; this forward's are per step.
    m.implementation = {{"backend", "cuda"}, {"recipe", recipe_description(recipe)},
                        {"attention", "exact (cuda::attention default)"},
                        {"fusions", fusions_description({fused.fused_norms, false})},
                        {"adaln", "per step: one GEMM per block from resident AdaLN weights, as the peer does"},
                        {"graphs", "each forward's device work replayed from one CUDA graph"}};
    // Repeated forwards must agree bit for bit and stay finite; the fp8 recipe's error is measured
    // against the bf16 forward from the same weights and inputs (block parity with diffusers is the
    // h3-block manifest's: 62 GB of weights cannot be handed to a peer).
    m.correctness = compare(out.video_velocity, timed.video_velocity,
                            "run-to-run: the last timed forward vs a further forward (bitwise expected)", 0.0);
    bool finite = true;
    for (int64_t i = 0; i < out.video_velocity.numel(); ++i) finite = finite && std::isfinite(out.video_velocity.data_as<float>()[i]);
    m.correctness.passed = m.correctness.passed && finite;
    if (recipe == h3::LinearRecipe::kBf16) {
      bf16_out = out;
    } else {
      m.derived["error_vs_bf16_forward"] = {
          {"video_velocity", error_json(out.video_velocity, bf16_out.video_velocity)},
          {"audio_velocity", error_json(out.audio_velocity, bf16_out.audio_velocity)}};
      if (m.correctness.passed) {
        m.correctness = compare(out.video_velocity, bf16_out.video_velocity,
                                "the bf16 forward's video velocity (same weights and inputs): the recipe's error",
                                kFp8ErrorBound);
      }
    }
    manifests.push_back(std::move(m));
  }

  if (!o.peer_command.empty()) {
    // The peer builds the diffusers transformer with its own random weights, so it times the same
    // shapes and layout but checks nothing; vortex's models are freed by now so that it fits.
    std::filesystem::create_directories(o.work_dir);
    Tensor pos = Tensor::empty({layout.num_rows, 3}, DType::kF64);
    std::memcpy(pos.data(), layout.positions.data(), layout.positions.size() * sizeof(double));
    std::vector<int64_t> tags(layout.tags.begin(), layout.tags.end()),
        rows(in.timesteps.row_index.begin(), in.timesteps.row_index.end());
    const Tensor timestep =
        Tensor::from_f32(in.timesteps.timesteps, {static_cast<int64_t>(in.timesteps.timesteps.size())});
    const h3::NamedTensors io = {
        {"in.hidden_states", in.video_rows},
        {"in.audio_hidden_states", in.audio_rows},
        {"in.encoder_hidden_states", c.text},
        {"in.timestep", timestep},
        {"in.timestep_indices", Tensor::from_i64(rows, {layout.num_rows})},
        {"in.token_tags", Tensor::from_i64(tags, {layout.num_rows})},
        {"in.position_ids", pos},
        {"in.video_indices", Tensor::from_i64(layout.video_indices, {layout.num_video})},
        {"in.audio_indices", Tensor::from_i64(layout.audio_indices, {layout.num_audio})},
        {"in.text_indices", Tensor::from_i64(layout.text_indices, {layout.num_text})},
    };
    const std::string path = o.work_dir + "/h3_forward_io.safetensors";
    VORTEX_RETURN_IF_ERROR(write_safetensors(path, io, {{"config", config.to_json_string()}}));
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "h3-forward", path));
    for (Manifest& m : manifests) add_peer_ratios(m, peer);
  }
  return manifests;
}

namespace {

struct DenoiseRun {
  h3::GenerateResult trajectory;  // 2 forwards
  h3::GenerateResult full;        // the canonical 12 forwards
  std::vector<double> step_ms;
  nlohmann::json gpu;  // SM clock and power over the 12 steps
  nlohmann::json memory;
};

// Runs the 2-step trajectory and the 12-step denoise on `model`; `memory` reports its device bytes.
Result<DenoiseRun> denoise_on(h3::StepModel& model, const Canonical& c, const std::string& label, bool int8fp8,
                              const std::function<Result<nlohmann::json>()>& memory) {
  h3::GenerateOptions g;
  g.video = h3::VideoGeometry{};  // the canonical request
  g.seed = kDenoiseNoiseSeed;
  g.attention.mode = int8fp8 ? h3::AttentionMode::kInt8Fp8 : h3::AttentionMode::kExact;
  DenoiseRun run;
  g.steps = 3;  // sigma grid points: 2 forwards
  VORTEX_ASSIGN_OR_RETURN(run.trajectory, h3::generate_t2va(model, c.text, g));
  g.steps = 13;  // 12 forwards, as the canonical generate request
  int device = 0;
  VORTEX_CUDA_CHECK(cudaGetDevice(&device));
  const std::unique_ptr<GpuMonitor> monitor = GpuMonitor::start(device);
  VORTEX_ASSIGN_OR_RETURN(run.full, h3::generate_t2va(model, c.text, g, [&](const h3::StepProgress& p) {
                            run.step_ms.push_back(p.step_seconds * 1e3);
                            std::fprintf(stderr, "vortex bench h3-denoise (%s): step %d/%d %.2f s\n", label.c_str(),
                                         p.step, p.total, p.step_seconds);
                          }));
  run.gpu = monitor->stop();
  VORTEX_ASSIGN_OR_RETURN(run.memory, memory());
  return run;
}

Result<DenoiseRun> run_denoise(const BenchOptions& o, const Canonical& c, h3::LinearRecipe recipe, bool int8fp8) {
  VORTEX_ASSIGN_OR_RETURN(auto model, make_model(o, c, recipe, int8fp8, h3::AdaLnTables::kPerRequest));
  const h3::CudaH3Transformer& loaded = *model;
  return denoise_on(*model, c, recipe_name(recipe) + (int8fp8 ? " + int8fp8" : ""), int8fp8,
                    [&] { return memory_json(loaded); });
}

nlohmann::json latent_error(const h3::GenerateResult& a, const h3::GenerateResult& reference) {
  return {{"video_latents", error_json(a.video_latents, reference.video_latents)},
          {"audio_latents", error_json(a.audio_latents, reference.audio_latents)}};
}

nlohmann::json checksums(const h3::GenerateResult& r) {
  return {{"video", checksum_json(r.video_latents)}, {"audio", checksum_json(r.audio_latents)}};
}

}  // namespace

Result<std::vector<Manifest>> bench_denoise(const BenchOptions& o) {
  VORTEX_ASSIGN_OR_RETURN(const Canonical c, canonical_request(o.seed));
  VORTEX_ASSIGN_OR_RETURN(const BlockFusions fused, block_fusions_from_env());
  struct Configuration {
    const char* workload;
    h3::LinearRecipe recipe;
    bool int8fp8;
  };
  const Configuration configurations[] = {{"h3-denoise", h3::LinearRecipe::kBf16, false},
                                          {"h3-denoise-fp8", h3::LinearRecipe::kFp8, false},
                                          {"h3-denoise-fp8-int8fp8", h3::LinearRecipe::kFp8, true}};
  std::vector<Manifest> manifests;
  const h3::VideoGeometry video;  // the canonical request, as run_denoise generates it
  DenoiseRun bf16;
  for (const Configuration& conf : configurations) {
    VORTEX_ASSIGN_OR_RETURN(DenoiseRun run, run_denoise(o, c, conf.recipe, conf.int8fp8));
    Manifest m;
    m.workload = conf.workload;
    m.samples.ms = run.step_ms;
    m.samples.gpu = run.gpu;
    double total_ms = 0;
    for (double ms : run.step_ms) total_ms += ms;
    m.derived = {{"denoise_seconds (12 forwards + Euler steps, host wall clock)", total_ms * 1e-3},
                 {"denoise_seconds_incl_prepare (text refiner, uploads)", run.full.run.seconds},
                 {"device_bytes", run.memory},
                 {"checksums", checksums(run.full)}};
    m.workload_section = {{"name", m.workload}, {"rows", c.layout.num_rows}, {"blocks", c.config.num_layers},
                          {"video", {video.height, video.width, video.num_frames}},
                          {"text_tokens", h3::kCanonicalTextTokens},
                          {"steps", 13}, {"forwards", run.full.run.forwards}, {"noise_seed", kDenoiseNoiseSeed},
                          {"weights", "synthetic (models/h3/synthetic_rule.h)"}, {"weights_seed", o.seed}};
    m.protocol = {{"samples", "the wall-clock time of each of the 12 denoising steps of one request (forward, "
                              "host Euler update); the median step is primary"},
                  {"timer", "std::chrono::steady_clock around each step"},
                  {"primary", "median"}};
    VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
    m.implementation = {{"backend", "cuda"}, {"recipe", recipe_description(conf.recipe)},
                        {"attention", conf.int8fp8 ? "int8fp8 in every block" : "exact"},
                        {"fusions", fusions_description(fused)},
                        {"adaln", "tables per request (planned before the first step; no AdaLN weight on the device)"},
                        {"graphs", "each forward's device work replayed from one CUDA graph"}};
    if (conf.recipe == h3::LinearRecipe::kBf16 && !conf.int8fp8) {
      m.correctness.comparator = "none: the reference configuration the others are measured against";
      m.correctness.passed = true;
      bf16 = std::move(run);
    } else {
      m.derived["error_vs_bf16_after_2_steps"] = latent_error(run.trajectory, bf16.trajectory);
      m.derived["error_vs_bf16_after_12_steps"] = latent_error(run.full, bf16.full);
      m.correctness = compare(run.trajectory.video_latents, bf16.trajectory.video_latents,
                              "the bf16 exact 2-step trajectory's video latents (same noise): the error stated",
                              kFp8ErrorBound);
    }
    manifests.push_back(std::move(m));
  }
  return manifests;
}

Result<std::vector<Manifest>> bench_denoise_sequence_parallel(const BenchOptions& o) {
#if defined(VORTEX_HAVE_NCCL)
  VORTEX_ASSIGN_OR_RETURN(const Canonical c, canonical_request(o.seed));
  VORTEX_ASSIGN_OR_RETURN(const std::vector<int> devices, dist::parse_device_list("all"));
  if (devices.size() < 2) {
    return invalid_argument("h3-denoise-sp needs two or more GPUs; this machine has " + std::to_string(devices.size()));
  }
  VORTEX_ASSIGN_OR_RETURN(const BlockFusions fused, block_fusions_from_env());
  struct Configuration {
    const char* workload;
    h3::LinearRecipe recipe;
    bool int8fp8;
  };
  std::vector<Manifest> manifests;
  for (const Configuration conf : {Configuration{"h3-denoise-sp", h3::LinearRecipe::kBf16, false},
                                   Configuration{"h3-denoise-sp-fp8-int8fp8", h3::LinearRecipe::kFp8, true}}) {
    // The one-GPU reference first, freed before the group loads (rank 0 shares its device).
    VORTEX_ASSIGN_OR_RETURN(DenoiseRun one, run_denoise(o, c, conf.recipe, conf.int8fp8));
    h3::CudaModelOptions options;
    options.recipe = conf.recipe;
    options.int8fp8_attention = conf.int8fp8;
    options.adaln_tables = h3::AdaLnTables::kPerRequest;
    options.fused_norms = fused.fused_norms;
    options.fold_ffn_residual = fused.fold_ffn_residual;
    VORTEX_ASSIGN_OR_RETURN(auto group, dist::SequenceParallelH3::create(
                                            c.config, [&](cudaStream_t s) { return h3::synthetic_weight_filler(o.seed, s); },
                                            c.layout.num_rows, devices, options));
    const dist::SequenceParallelH3& loaded = *group;
    const std::string label = recipe_name(conf.recipe) + (conf.int8fp8 ? " + int8fp8, " : ", ") +
                              std::to_string(devices.size()) + " GPUs";
    VORTEX_ASSIGN_OR_RETURN(DenoiseRun run, denoise_on(*group, c, label, conf.int8fp8, [&]() -> Result<nlohmann::json> {
                              nlohmann::json ranks = nlohmann::json::array();
                              for (int r = 0; r < loaded.size(); ++r) {
                                ranks.push_back({{"weights", loaded.weight_bytes(r)},
                                                 {"activations_arena", loaded.activation_peak_bytes(r)},
                                                 {"exchange_buffers", loaded.exchange_bytes(r)}});
                              }
                              return nlohmann::json{{"ranks", ranks}};
                            }));
    group.reset();
    Manifest m;
    m.workload = conf.workload;
    m.samples.ms = run.step_ms;
    m.samples.gpu = run.gpu;
    double total_ms = 0, one_ms = 0;
    for (double ms : run.step_ms) total_ms += ms;
    for (double ms : one.step_ms) one_ms += ms;
    m.derived = {{"denoise_seconds (12 forwards + Euler steps, host wall clock)", total_ms * 1e-3},
                 {"one_gpu_denoise_seconds (same call)", one_ms * 1e-3},
                 {"gpus", devices.size()},
                 {"device_bytes", run.memory},
                 {"checksums", checksums(run.full)},
                 {"one_gpu_checksums", checksums(one.full)},
                 {"error_vs_one_gpu_after_2_steps", latent_error(run.trajectory, one.trajectory)},
                 {"error_vs_one_gpu_after_12_steps", latent_error(run.full, one.full)}};
    const h3::VideoGeometry video;
    m.workload_section = {{"name", m.workload}, {"rows", c.layout.num_rows}, {"blocks", c.config.num_layers},
                          {"video", {video.height, video.width, video.num_frames}},
                          {"text_tokens", h3::kCanonicalTextTokens}, {"steps", 13},
                          {"forwards", run.full.run.forwards}, {"noise_seed", kDenoiseNoiseSeed},
                          {"gpus", devices.size()}, {"weights", "synthetic (models/h3/synthetic_rule.h)"},
                          {"weights_seed", o.seed}};
    m.protocol = {{"samples", "the wall-clock time of each of the 12 denoising steps of one request (forward on "
                              "every GPU, host Euler update); the median step is primary"},
                  {"timer", "std::chrono::steady_clock around each step"},
                  {"primary", "median"},
                  {"gpu_samples", "SM clock and power of GPU 0"}};
    VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
    m.implementation = {{"backend", "cuda, sequence-parallel (DeepSpeed-Ulysses) through NCCL"},
                        {"recipe", recipe_description(conf.recipe)},
                        {"attention", std::string(conf.int8fp8 ? "int8fp8 in every block" : "exact") +
                                          "; q/k/v heads gathered over every row, attention per head group, rows "
                                          "scattered back"},
                        {"fusions", fusions_description(fused)},
                        {"adaln", "tables per request (planned before the first step; no AdaLN weight on the device)"},
                        {"graphs", "each rank's forward replayed from one CUDA graph (collectives inside)"}};
    m.correctness = compare(run.trajectory.video_latents, one.trajectory.video_latents,
                            "the one-GPU 2-step trajectory's video latents (same configuration and noise, same call)",
                            1e-2);
    std::vector<double> one_sorted = one.step_ms, sorted = run.step_ms;
    std::sort(one_sorted.begin(), one_sorted.end());
    std::sort(sorted.begin(), sorted.end());
    const double one_median = one_sorted[one_sorted.size() / 2], median = sorted[sorted.size() / 2];
    m.peers = nlohmann::json::array(
        {{{"name", "vortex-1-gpu"}, {"median_ms", one_median}, {"ratio_peer_over_vortex", one_median / median}}});
    manifests.push_back(std::move(m));
  }
  return manifests;
#else
  (void)o;
  return unimplemented("h3-denoise-sp: this build has no NCCL");
#endif
}

}  // namespace vortex::bench
