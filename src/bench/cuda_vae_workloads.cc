// The `vae-decode` workload of `vortex bench`: the canonical decodes of both VAEs on one GPU, one
// manifest each; and `vae-encode`, the video VAE encoder on one canonical keyframe and on one clip
// of a video reference, and the audio VAE encoder on one canonical soundtrack reference.
//
//   vae-decode-video  latents [24, 37, 48, 84] -> 124 frames of 768 x 1344 (bf16 mode, the release
//                     config and tiling: 7 chunks x 28 tiles), synthetic weights made on the device;
//                     timed from host latents to finished frames in device memory (validation,
//                     de-normalisation and the upload included).
//   vae-decode-audio  latents [2, 207, 32] -> 2 x 165,600 samples (5.175 s at 32 kHz), fp32,
//                     synthetic weights (synthetic_audio_vae_tensors); timed likewise.
//   vae-encode-keyframe  one 768 x 1344 keyframe's pixels -> moments [48, 1, 48, 84] (fp32, the
//                     release config and tiling: 4 x 7 tiles of 256 x 256), synthetic weights
//                     (synthetic_video_vae_encoder_tensors); timed from host pixels to host moments
//                     (the pixels' upload, the moments' download and the host's stitching included);
//                     derived: one further encode's device time by op and stage.
//   vae-encode-clip   one 17-frame clip of a video reference at 768 x 1344 -> moments [48, 2, 48, 84]
//                     (the unit a reference of 17n + 5 frames is encoded in: ceil(F / 17) clips);
//                     otherwise as the keyframe.
//   vae-encode-video  a 22-frame video reference (17n + 5 with n = 1: two clips, the second padded
//                     with the last frame) -> moments [48, 3, 48, 84] (six latent frames less the
//                     three dropped); otherwise as the clip. Named on its own only: `vae-encode`
//                     leaves it out (about three minutes with the peer).
//   vae-encode-audio  a soundtrack reference of 165,600 samples a channel (5.175 s at 32 kHz, the
//                     canonical clip's duration) -> rows [2 · 207, 32], fp32, synthetic weights
//                     (synthetic_audio_vae_tensors); timed from the host waveform to the rows in
//                     device memory (validation, padding and the upload included).
//
// Correctness: the audio waveform against the CPU decoder on the same weights and latents (rel-L2
// bound 1e-4, DESIGN's fp32 parity bound); the video frames run to run (bitwise) when no peer runs, and
// against the peer's diffusers decode of the same weights and latents when one does (the peer
// reports rel-L2 of the frames minus the ImageNet mean). Peers (bench/peers/pytorch_vae.py) get
// the weights, latents and vortex's output in a safetensors dump; the video model is freed before
// its peer runs. Peak device memory: the three arenas (weights, activations, cuBLASLt workspace)
// as allocated, the planned sizes, and the device memory in use (cudaMemGetInfo) after the decodes.
// The encodes' moments: run to run (bitwise) without a peer, against the peer's diffusers encode
// (fp32, TF32 off) with one. The soundtrack's rows: against the CPU encoder (1e-4), and the peer's
// diffusers encode reported beside it. Every manifest records its output's sha256 and sum
// (run.derived.checksums): two builds that claim the same bits are held to them across runs
// (tools/bench/checksum_history.py, ab_summary.py).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "bench/cuda_bench_util.h"
#include "bench/cuda_workloads.h"
#include "cuda/vae_conv3d.h"
#include "formats/safetensors.h"
#include "models/h3/generate.h"
#include "models/vae/cuda_audio_vae.h"
#include "models/vae/cuda_audio_vae_encoder.h"
#include "models/vae/cuda_video_vae.h"
#include "models/vae/cuda_video_vae_encoder.h"

namespace vortex::bench {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kVideoLatentFrames = 37, kVideoLatentHeight = 48, kVideoLatentWidth = 84;
constexpr int64_t kAudioLatentFrames = 207;
constexpr int64_t kSoundtrackSamples = 165600;
// Philox streams of the benchmark's latents (the weights use the per-tensor name streams).
constexpr uint64_t kVideoLatentStream = 0x56414556, kAudioLatentStream = 0x56414541, kSoundtrackStream = 0x56414557;
// Frames vs the peer's fp16-autocast decode: the bf16 program alone is 2.5e-3 from the fp32
// decoder on the 4-layer test preset; 36 layers and the reference's own fp16 rounding add to it.
constexpr double kVideoPeerBound = 3e-2;
// fp32 against fp32: only the summation order differs. The GPU tests' short clips stay within
// 1e-5; the canonical 207-latent clip measured 1.76e-5 on the H200 (2026-11-29), so the bench uses
// the project's fp32 parity bound.
constexpr double kAudioCpuBound = 1e-4;
// The soundtrack encode: the CPU encoder's own two GEMM orders differ by 7e-5 at the release widths
// (tests/gpu/test_gpu_audio_vae_encoder.cc says how the random stack amplifies them); twice that.
constexpr double kSoundtrackCpuBound = 1.5e-4;
// The keyframe encode against diffusers' fp32 encode without TF32: the GPU test's golden tiles are
// 8.6e-7 from the CPU program; fp32 parity bound. With tf32 convolutions (VORTEX_VARIANT_VAE_CONV=tf32,
// --vae-encode-precision tf32; approximate) the bound is 1e-3: measured 2.2e-4 to 2.4e-4 on an H100,
// where diffusers' own TF32 default is 2.3e-4 to 2.4e-4 from its fp32 encode.
constexpr double kEncodePeerBound = 1e-4, kEncodePeerBoundTf32 = 1e-3;
constexpr int64_t kKeyframeHeight = 768, kKeyframeWidth = 1344;
constexpr uint64_t kKeyframeStream = 0x56414558, kClipStream = 0x56414543;
constexpr int64_t kClipFrames = 17, kVideoFrames = 22;

bool all_within(const Tensor& t, float lo, float hi) {
  const float* d = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!(d[i] >= lo && d[i] <= hi)) return false;  // NaN fails too
  }
  return true;
}

void take_peer_correctness(Manifest& m, const nlohmann::json& peer, double bound) {
  if (!peer.is_object() || !peer.contains("correctness")) return;
  const auto& c = peer["correctness"];
  m.correctness.comparator = c.value("comparator", "peer");
  m.correctness.rel_l2 = c.value("rel_l2", 1.0);
  m.correctness.max_abs = c.value("max_abs", 0.0);
  m.correctness.max_rel = c.value("max_rel", 0.0);
  m.correctness.bound = bound;
  m.correctness.passed = m.correctness.rel_l2 <= bound && std::isfinite(m.correctness.rel_l2);
}

// GEMM and attention FLOPs of the video decode: per tile, the blocks' four linears and attention
// over all N + R + 1 tokens, post_quant_conv / proj_in / proj_out over the N patch tokens.
double video_flops(const vae::VideoVaeConfig& c, int64_t tiles, int64_t tile_tokens) {
  const double n = static_cast<double>(tile_tokens), total = n + c.decoder_num_register_tokens + 1;
  const double dim = c.decoder_dim(), f = c.decoder_ffn_dim(), C = c.latent_channels;
  const double block = 2 * total * dim * (3 * dim + dim + 2 * f) + 2 * total * f * dim + 4 * total * total * dim;
  return static_cast<double>(tiles) *
         (c.decoder_num_layers * block + 2 * n * C * C + 2 * n * C * dim + 2 * n * dim * c.patch_values());
}

Result<Manifest> bench_video(const BenchOptions& o) {
  const vae::VideoVaeConfig config = *vae::video_vae_config_preset("h3");
  const vae::VideoTiling tiling;
  const Shape shape{config.latent_channels, kVideoLatentFrames, kVideoLatentHeight, kVideoLatentWidth};
  VORTEX_ASSIGN_OR_RETURN(const vae::CudaVideoVaeMemory planned,
                          vae::cuda_video_vae_memory(config, DType::kBF16, shape, tiling));
  VORTEX_ASSIGN_OR_RETURN(auto model, vae::CudaVideoVae::create_synthetic(config, o.seed));
  const Tensor latents = h3::seeded_normal(shape, o.seed, kVideoLatentStream);
  Tensor frames;
  auto body = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(frames, model->decode_on_device(latents, tiling));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
  VORTEX_ASSIGN_OR_RETURN(const size_t in_use, device_bytes_in_use());
  VORTEX_ASSIGN_OR_RETURN(const Tensor first, cuda::download(frames, model->stream()));
  VORTEX_RETURN_IF_ERROR(body());
  VORTEX_ASSIGN_OR_RETURN(const Tensor again, cuda::download(frames, model->stream()));

  Manifest m;
  m.workload = "vae-decode-video";
  m.samples = samples;
  const int64_t r = config.spatial_ratio();
  const int64_t chunks = (kVideoLatentFrames + config.token_drop) / config.tokens_chunk_size() - 1;
  const vae::TileSplit rows =
      vae::split_tiles(kVideoLatentHeight * r, tiling.tile_height, tiling.min_overlap_height, r);
  const vae::TileSplit cols = vae::split_tiles(kVideoLatentWidth * r, tiling.tile_width, tiling.min_overlap_width, r);
  const int64_t tiles_per_chunk = static_cast<int64_t>(rows.starts.size() * cols.starts.size());
  const int64_t tile_tokens = (config.tokens_chunk_size() + config.token_overlap()) * (rows.tile / r) * (cols.tile / r);
  const double flops = video_flops(config, chunks * tiles_per_chunk, tile_tokens);
  m.derived = {{"tflops", flops / (samples.median() * 1e-3) / 1e12},
               {"flops", flops},
               {"frames_per_second", static_cast<double>(first.size(1)) / (samples.median() * 1e-3)},
               {"checksums", {{"frames", checksum_json(first)}}},
               {"device_bytes",
                {{"weights", model->weight_bytes()},
                 {"activations_arena_peak", model->activation_peak_bytes()},
                 {"workspace", model->workspace_bytes()},
                 {"planned_total", planned.total()},
                 {"in_use_after_decodes (cudaMemGetInfo, incl. context and timer's L2-flush buffer)", in_use}}}};
  m.workload_section = {{"name", m.workload},
                        {"latents", shape.to_vector()},
                        {"frames", first.shape().to_vector()},
                        {"tiling", {{"tile", tiling.tile_height}, {"min_overlap", tiling.min_overlap_height}}},
                        {"chunks", chunks},
                        {"tiles_per_chunk", tiles_per_chunk},
                        {"tokens_per_tile", tile_tokens + config.decoder_num_register_tokens + 1},
                        {"config", "h3 (release): 36 layers, 32 heads x 64, FFN 8192, patch 4 x 16 x 16"},
                        {"weights", "synthetic on the device (CudaVideoVae::create_synthetic)"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "host latents -> frames in device memory (validation, de-normalisation, upload included)";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  m.implementation = {{"backend", "cuda"},
                      {"recipe", "bf16 block linears and attention, fp32 residual stream, norms and output"},
                      {"attention", "cuda::attention (head dim 64: v1 wgmma kernel)"},
                      {"gemm", "cuBLASLt bf16 (fp32 accumulate); fp32 for post_quant_conv / proj_in"},
                      {"layout", "tiles decoded one at a time; frames composed per chunk in one kernel"}};
  m.correctness = compare(again, first, "run-to-run: a further decode vs the last timed one (bitwise expected)", 0.0);
  if (!all_within(first, 0.0f, 1.0f)) m.correctness.passed = false;

  if (!o.peer_command.empty()) {
    fs::create_directories(o.work_dir);
    VORTEX_ASSIGN_OR_RETURN(vae::NamedTensors io, model->download_weights());
    io.emplace_back("in.latents", latents);
    io.emplace_back("out.frames", first);
    const std::string path = o.work_dir + "/vae_video_io.safetensors";
    VORTEX_RETURN_IF_ERROR(write_safetensors(path, io, {{"config", config.to_json().dump()}}));
    io.clear();
    frames = Tensor();  // it holds the activation arena
    model.reset();      // the peer gets the whole device
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "vae-video", path));
    take_peer_correctness(m, peer, kVideoPeerBound);
    add_peer_ratios(m, peer);
  }
  return m;
}

// The encoder's conv FLOPs on one tile of one clip of `frames` frames: each output frame of each
// causal conv over its real temporal taps only (those past the causal zeros), as the encoder computes it.
double encode_tile_flops(const vae::VideoVaeEncoder& e, int64_t frames, int64_t height, int64_t width) {
  double flops = 0.0;
  int64_t t = frames, h = height, w = width;
  const auto conv = [&](const vae::CausalConv3d& c) {
    const vae::Conv3dGeometry& g = c.geometry;
    const int64_t t_out = vae::conv3d_output_length(t + g.temporal_padding, 0, 0, g.kt, g.st);
    h = vae::conv3d_output_length(h, g.pad_top, g.pad_bottom, g.kh, g.sh);
    w = vae::conv3d_output_length(w, g.pad_left, g.pad_right, g.kw, g.sw);
    int64_t taps = 0;
    for (int64_t f = 0; f < t_out; ++f) taps += g.kt - std::clamp<int64_t>(g.temporal_padding - f * g.st, 0, g.kt);
    flops += 2.0 * static_cast<double>(h * w * c.out_channels * c.in_channels * g.kh * g.kw * taps);
    t = t_out;
  };
  conv(e.conv_in);
  for (const vae::VideoEncoderLevel& level : e.levels) {
    for (const vae::VideoEncoderResnet& r : level.resnets) {
      const int64_t t0 = t, h0 = h, w0 = w;
      conv(r.conv1);
      conv(r.conv2);
      if (r.has_shortcut) {
        t = t0, h = h0, w = w0;
        conv(r.conv_shortcut);
      }
    }
    if (level.has_downsampler) conv(level.downsampler);
  }
  conv(e.conv_out);
  conv(e.quant_conv);
  return flops;
}

// The video VAE encoder on `frames` frames of 768 x 1344: one keyframe, one clip of a video
// reference (17 frames, the release's clip_length: a reference of 17n + 5 frames is ceil(F / 17)
// such clips, each encoded on its own), or a video of several clips.
Result<Manifest> bench_encode(const BenchOptions& o, int64_t frames) {
  const bool keyframe = frames == 1;
  const std::string workload = keyframe ? "vae-encode-keyframe" : frames == kClipFrames ? "vae-encode-clip"
                                                                                        : "vae-encode-video";
  const vae::VideoVaeConfig config = *vae::video_vae_config_preset("h3");
  vae::NamedTensors tensors = vae::synthetic_video_vae_encoder_tensors(config, o.seed);
  VORTEX_ASSIGN_OR_RETURN(const vae::VideoVaeEncoder cpu, vae::assemble_video_vae_encoder(tensors, config));
  VORTEX_ASSIGN_OR_RETURN(auto model, vae::CudaVideoVaeEncoder::create(cpu));
  const Tensor pixels = h3::seeded_normal({config.in_channels, frames, kKeyframeHeight, kKeyframeWidth}, o.seed,
                                          keyframe ? kKeyframeStream : kClipStream);
  Tensor moments;
  auto body = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(moments, model->encode_moments(pixels));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
  VORTEX_ASSIGN_OR_RETURN(const size_t in_use, device_bytes_in_use());
  const Tensor first = moments;
  VORTEX_RETURN_IF_ERROR(body());
  // One further encode split by op and stage (the host's tiling, stitching and the moments'
  // download are the gaps between the sections).
  cuda::SectionProfiler profiler;
  model->set_profiler(&profiler);
  VORTEX_RETURN_IF_ERROR(body());
  model->set_profiler(nullptr);
  nlohmann::json breakdown;
  double device_ms = 0;
  for (const auto& [name, ms] : profiler.totals()) {
    breakdown[name] = ms;
    device_ms += ms;
  }

  const vae::VideoTiling& tiling = model->tiling();
  const int64_t r = config.spatial_ratio();
  const vae::TileSplit rows = vae::split_tiles(kKeyframeHeight, tiling.tile_height, tiling.min_overlap_height, r);
  const vae::TileSplit cols = vae::split_tiles(kKeyframeWidth, tiling.tile_width, tiling.min_overlap_width, r);
  const int64_t tiles = static_cast<int64_t>(rows.starts.size() * cols.starts.size());
  // Each clip of clip_length frames (the last padded with copies of the last frame) runs on its own.
  const int64_t clips = keyframe ? 1 : (frames + config.clip_length - 1) / config.clip_length;
  const double flops = static_cast<double>(tiles * clips) *
                       encode_tile_flops(cpu, keyframe ? 1 : config.clip_length, rows.tile, cols.tile);
  Manifest m;
  m.workload = workload;
  m.samples = samples;
  m.derived = {{"tflops", flops / (samples.median() * 1e-3) / 1e12},
               {"flops", flops},
               {"breakdown_ms (one further encode, CUDA events per op and stage)", breakdown},
               {"breakdown_total_ms", device_ms},
               {"checksums", {{"moments", checksum_json(first)}}},
               {"device_bytes",
                {{"weights", model->weight_bytes()},
                 {"activations", model->activation_bytes()},
                 {"in_use_after_encodes (cudaMemGetInfo, incl. context and timer's L2-flush buffer)", in_use}}}};
  m.workload_section = {{"name", m.workload},
                        {"pixels", pixels.shape().to_vector()},
                        {"moments", first.shape().to_vector()},
                        {"tiling", {{"tile", tiling.tile_height}, {"min_overlap", tiling.min_overlap_height}}},
                        {"tiles", tiles},
                        {"config", "h3 (release): widths 128 256 256 512 512 1024, 2 resnets a level, 16x spatial"},
                        {"weights", "synthetic (synthetic_video_vae_encoder_tensors)"},
                        {"seed", o.seed}};
  if (frames == kClipFrames) {
    m.workload_section["clip"] = "one clip of a video reference: a reference of 17n + 5 frames is ceil(F / 17) of them";
  } else if (!keyframe) {
    m.workload_section["clips"] = clips;
    m.workload_section["video"] = "a reference of 17n + 5 frames: ceil(F / 17) clips, the last padded with copies of "
                                  "its last frame, encoded one after the other into one reused host buffer";
  }
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "host pixels -> host moments (the pixels' upload, the moments' download and the host's "
                        "stitching included)";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  // The conv variant the encoder ran: the manifest's recipe and how its convolutions were computed.
  struct ConvRecipe {
    const char* recipe;
    const char* convolutions;
  };
  const bool tf32 = model->conv_variant() == cuda::VaeConvVariant::kTf32;
  const ConvRecipe conv = [&]() -> ConvRecipe {
    switch (model->conv_variant()) {
      case cuda::VaeConvVariant::kGatherGemm:
        return {"fp32 (no TF32)",
                "gemm: im2col gather of the real temporal taps + cuBLASLt fp32 GEMM (no TF32), bias in the epilogue"};
      case cuda::VaeConvVariant::kTf32x3:
        return {"fp32 (tf32x3 products)",
                "tf32x3: implicit GEMM on tensor cores (wgmma), each fp32 operand split into two tf32 parts (three "
                "products), each k-block's products added to the running sum by fp32 FADD; conv_in and conv_out "
                "(3 in / 48 out channels) as gemm"};
      case cuda::VaeConvVariant::kTf32x3Ws:
        return {"fp32 (tf32x3 products)",
                "tf32x3-ws: tf32x3's sums by the warp-specialized kernel (weights split into tf32 parts at load, "
                "a copying warpgroup, two multiplying ones taking turns); conv_in and conv_out as gemm"};
      case cuda::VaeConvVariant::kTf32:
        break;
    }
    return {"tf32 convolutions (approximate)",
            "tf32 (--vae-encode-precision tf32): the warp-specialized implicit GEMM with one tf32 product of the raw "
            "fp32 values, summed in the tensor core; conv_in and conv_out as gemm"};
  }();
  m.implementation = {{"backend", "cuda"},
                      {"recipe", conv.recipe},
                      {"convolutions", conv.convolutions},
                      {"group_norm", "per frame, sums in double"},
                      {"tiles", std::string("gathered on the GPU from one upload of each clip; ") +
                                (keyframe ? "levels 0-1 one tile at a time, the rest batched; stitched on the host"
                                          : "encoded one at a time, stitched on the host (the CPU's stitch_tiles)")}};
  m.correctness = compare(moments, first, "run-to-run: a further encode vs the last timed one (bitwise expected)", 0.0);

  if (!o.peer_command.empty()) {
    fs::create_directories(o.work_dir);
    tensors.emplace_back("in.pixels", pixels);
    tensors.emplace_back("out.moments", first);
    const nlohmann::json tiling_json = {{"tile_sample_min_height", tiling.tile_height},
                                        {"tile_sample_min_width", tiling.tile_width},
                                        {"tile_sample_min_overlap_height", tiling.min_overlap_height},
                                        {"tile_sample_min_overlap_width", tiling.min_overlap_width}};
    const std::string path = o.work_dir + "/vae_encode_io.safetensors";
    VORTEX_RETURN_IF_ERROR(
        write_safetensors(path, tensors, {{"config", config.to_json().dump()}, {"tiling", tiling_json.dump()}}));
    tensors.clear();
    model.reset();  // the peer gets the whole device
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, keyframe ? "vae-encode" : workload, path));
    take_peer_correctness(m, peer, tf32 ? kEncodePeerBoundTf32 : kEncodePeerBound);
    add_peer_ratios(m, peer);
  }
  return m;
}

Result<Manifest> bench_audio(const BenchOptions& o) {
  const vae::AudioVaeConfig config = *vae::audio_vae_config_preset("h3");
  const vae::NamedTensors tensors = vae::synthetic_audio_vae_tensors(config, o.seed, /*with_encoder=*/false);
  VORTEX_ASSIGN_OR_RETURN(const vae::AudioVae cpu, vae::assemble_audio_vae(tensors, config));
  VORTEX_ASSIGN_OR_RETURN(const vae::CudaAudioVaeMemory planned, vae::cuda_audio_vae_memory(cpu, kAudioLatentFrames));
  VORTEX_ASSIGN_OR_RETURN(auto model, vae::CudaAudioVae::create(cpu));
  const Tensor latents = h3::seeded_normal({2, kAudioLatentFrames, config.latent_channels}, o.seed, kAudioLatentStream);
  Tensor wave;
  auto body = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(wave, model->decode_on_device(latents));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
  VORTEX_ASSIGN_OR_RETURN(const size_t in_use, device_bytes_in_use());
  VORTEX_ASSIGN_OR_RETURN(const Tensor got, cuda::download(wave, model->stream()));
  VORTEX_ASSIGN_OR_RETURN(const Tensor want, vae::decode_audio(cpu, latents));

  Manifest m;
  m.workload = "vae-decode-audio";
  m.samples = samples;
  const double seconds = static_cast<double>(got.size(1)) / config.sampling_rate;
  m.derived = {{"audio_seconds", seconds},
               {"realtime_factor", seconds / (samples.median() * 1e-3)},
               {"checksums", {{"waveform", checksum_json(got)}}},
               {"device_bytes",
                {{"weights", model->weight_bytes()},
                 {"activations_arena_peak", model->activation_peak_bytes()},
                 {"workspace", model->workspace_bytes()},
                 {"planned_total", planned.total()},
                 {"in_use_after_decodes (cudaMemGetInfo, incl. context and timer's L2-flush buffer)", in_use}}}};
  m.workload_section = {{"name", m.workload},
                        {"latents", latents.shape().to_vector()},
                        {"waveform", got.shape().to_vector()},
                        {"sampling_rate", config.sampling_rate},
                        {"config", "h3 (release): decoder_dim 1024, rates 5 5 2 2 2 2 2, AMP kernels 3 7 11"},
                        {"weights", "synthetic (synthetic_audio_vae_tensors), weight norm fused"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "host latents -> waveform in device memory (validation, de-normalisation, upload included)";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  m.implementation = {{"backend", "cuda"},
                      {"recipe", "fp32 (no TF32)"},
                      {"convolutions", "im2col + cuBLASLt fp32 GEMM; transposed: GEMM + overlap-add"},
                      {"activation", "alias-free SnakeBeta fused (upsample, snake, downsample in one kernel)"}};
  m.correctness = compare(got, want, "CPU decoder (decode_audio), same weights and latents", kAudioCpuBound);

  if (!o.peer_command.empty()) {
    fs::create_directories(o.work_dir);
    vae::NamedTensors io = tensors;
    io.emplace_back("in.latents", latents);
    io.emplace_back("out.waveform", got);
    const std::string path = o.work_dir + "/vae_audio_io.safetensors";
    VORTEX_RETURN_IF_ERROR(write_safetensors(path, io, {{"config", config.to_json_string()}}));
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "vae-audio", path));
    if (peer.is_object() && peer.contains("correctness")) m.derived["peer_correctness"] = peer["correctness"];
    add_peer_ratios(m, peer);
  }
  return m;
}

Result<Manifest> bench_audio_encode(const BenchOptions& o) {
  const vae::AudioVaeConfig config = *vae::audio_vae_config_preset("h3");
  const vae::NamedTensors tensors = vae::synthetic_audio_vae_tensors(config, o.seed, /*with_encoder=*/true);
  VORTEX_ASSIGN_OR_RETURN(const vae::AudioVaeEncoder cpu, vae::assemble_audio_vae_encoder(tensors, config));
  VORTEX_ASSIGN_OR_RETURN(auto model, vae::CudaAudioVaeEncoder::create(cpu));
  // A waveform in [-1, 1]: half-scale noise (the encoder's snakes and attention see a signal's range).
  const Tensor noise = h3::seeded_normal({2, kSoundtrackSamples}, o.seed, kSoundtrackStream);
  Tensor waveform = Tensor::empty(noise.shape(), DType::kF32);
  for (int64_t i = 0; i < noise.numel(); ++i) {
    waveform.data_as<float>()[i] = std::clamp(0.5f * noise.data_as<float>()[i], -1.0f, 1.0f);
  }
  Tensor rows;
  auto body = [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(rows, model->encode_on_device(waveform));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, nullptr, body));
  VORTEX_ASSIGN_OR_RETURN(const size_t in_use, device_bytes_in_use());
  VORTEX_ASSIGN_OR_RETURN(const Tensor got, cuda::download(rows, nullptr));
  const auto cpu_start = std::chrono::steady_clock::now();
  VORTEX_ASSIGN_OR_RETURN(const Tensor want, vae::encode_audio(cpu, waveform));
  const double cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start).count();

  Manifest m;
  m.workload = "vae-encode-audio";
  m.samples = samples;
  const double seconds = static_cast<double>(kSoundtrackSamples) / config.sampling_rate;
  m.derived = {{"audio_seconds", seconds},
               {"realtime_factor", seconds / (samples.median() * 1e-3)},
               {"cpu_encoder_ms (one run, the host's threads)", cpu_ms},
               {"checksums", {{"rows", checksum_json(got)}}},
               {"device_bytes",
                {{"weights", model->weight_bytes()},
                 {"activations_arena_peak", model->activation_peak_bytes()},
                 {"in_use_after_encodes (cudaMemGetInfo, incl. context and timer's L2-flush buffer)", in_use}}}};
  m.workload_section = {{"name", m.workload},
                        {"waveform", waveform.shape().to_vector()},
                        {"rows", got.shape().to_vector()},
                        {"sampling_rate", config.sampling_rate},
                        {"config", "h3 (release): encoder_dim 64, rates 2 4 4 5 5, latent_dim 2048, 8 heads"},
                        {"weights", "synthetic (synthetic_audio_vae_tensors), weight norm fused"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "host waveform -> normalised rows in device memory (validation, padding, upload included)";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  m.implementation = {{"backend", "cuda"},
                      {"recipe", "fp32 (no TF32)"},
                      {"convolutions", "im2col + cuBLASLt fp32 GEMM (cuda::conv1d, the decoder's)"},
                      {"pre_block", "layer norms, fp32 GEMMs, causal fp32 attention on CUDA cores"}};
  m.correctness = compare(got, want, "CPU encoder (encode_audio), same weights and waveform", kSoundtrackCpuBound);

  if (!o.peer_command.empty()) {
    fs::create_directories(o.work_dir);
    vae::NamedTensors io = tensors;
    io.emplace_back("in.waveform", waveform);
    io.emplace_back("out.rows", got);
    const std::string path = o.work_dir + "/vae_audio_encode_io.safetensors";
    VORTEX_RETURN_IF_ERROR(write_safetensors(path, io, {{"config", config.to_json_string()}}));
    model.reset();
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "vae-audio-encode", path));
    if (peer.is_object() && peer.contains("correctness")) m.derived["peer_correctness"] = peer["correctness"];
    add_peer_ratios(m, peer);
  }
  return m;
}

}  // namespace

Result<std::vector<Manifest>> run_vae_workload(const BenchOptions& o) {
  if (o.warmup < 3 || o.repetitions < 10) {
    return invalid_argument("the protocol needs >= 3 warm-ups and >= 10 repetitions (DESIGN section 4)");
  }
  std::vector<Manifest> out;
  // vae-encode measures three items; each can also run alone (an A/B of one of them).
  const bool all = o.workload == "vae-encode";
  if (all || o.workload == "vae-encode-keyframe") {
    VORTEX_ASSIGN_OR_RETURN(Manifest keyframe, bench_encode(o, 1));
    out.push_back(std::move(keyframe));
  }
  if (all || o.workload == "vae-encode-clip") {
    VORTEX_ASSIGN_OR_RETURN(Manifest clip, bench_encode(o, kClipFrames));
    out.push_back(std::move(clip));
  }
  if (o.workload == "vae-encode-video") {
    VORTEX_ASSIGN_OR_RETURN(Manifest video, bench_encode(o, kVideoFrames));
    out.push_back(std::move(video));
  }
  if (all || o.workload == "vae-encode-audio") {
    VORTEX_ASSIGN_OR_RETURN(Manifest soundtrack, bench_audio_encode(o));
    out.push_back(std::move(soundtrack));
  }
  if (!out.empty()) return out;
  if (o.workload != "vae-decode") {
    return invalid_argument("unknown VAE workload '" + o.workload +
                            "' (vae-decode, vae-encode, vae-encode-keyframe, vae-encode-clip, vae-encode-audio, "
                            "vae-encode-video)");
  }
  VORTEX_ASSIGN_OR_RETURN(Manifest audio, bench_audio(o));
  out.push_back(std::move(audio));
  VORTEX_ASSIGN_OR_RETURN(Manifest video, bench_video(o));
  out.push_back(std::move(video));
  return out;
}

}  // namespace vortex::bench
