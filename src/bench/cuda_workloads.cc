#include "bench/cuda_workloads.h"

#include "bench/cuda_bench_util.h"
#include "bench/softmax_max_growth.h"

#include <cuda_runtime.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "cpu/attention.h"
#include "cpu/gemm.h"
#include "cuda/attention.h"
#include "cuda/attention_int8fp8.h"
#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "cuda/synthetic_fill.h"
#include "formats/safetensors.h"
#include "models/h3/tensor_views.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"

namespace vortex::bench {

namespace {

namespace fs = std::filesystem;

// Both attention modes on what a real block feeds them: the q, k, v the model's last block run
// produced (synthetic weights, after QK norm and RoPE). States the int8fp8 mode's error against
// exact on every element, and times exact attention and int8fp8's two passes on those inputs and,
// in the same strided layout, on N(0,1) q, k, v (what `bench attention` times): the mode is much
// nearer exact in the block than in isolation, and this separates the passes and the inputs.
// Also counts, on both inputs, how often the online softmax's running max grows between key tiles
// (softmax_max_growth.h: the redo rate of a speculative-max kernel).
Result<nlohmann::json> attention_on_block_activations(const h3::CudaH3Transformer& model, const h3::H3Config& config,
                                                      Timer& timer, const BenchOptions& o) {
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv, model.attention_inputs());
  const int64_t N = qkv.size(0), H = config.num_attention_heads, D = config.attention_head_dim, inner = H * D;
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena,
                          cuda::DeviceArena::create(static_cast<size_t>(2 * N * inner * 2 + N * 3 * inner * 2) +
                                                    8192 + cuda::int8fp8_workspace_bytes(N, N, H)));
  VORTEX_ASSIGN_OR_RETURN(Tensor exact, arena.alloc({N, inner}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(Tensor quantized, arena.alloc({N, inner}, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(Tensor normal, arena.alloc({N, 3 * inner}, DType::kBF16));
  VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(normal, o.seed, 301, 1.0f, nullptr));
  VORTEX_ASSIGN_OR_RETURN(cuda::Int8Fp8Workspace ws, cuda::int8fp8_workspace(arena, N, N, H));
  auto heads = [&](const Tensor& t, int64_t column) { return h3::heads_view(t, column, H, D); };
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  VORTEX_RETURN_IF_ERROR(
      cuda::attention(heads(qkv, 0), heads(qkv, inner), heads(qkv, 2 * inner), heads(exact, 0), scale, nullptr));
  VORTEX_RETURN_IF_ERROR(cuda::quantize_int8fp8(heads(qkv, 0), heads(qkv, inner), heads(qkv, 2 * inner), ws, nullptr));
  VORTEX_RETURN_IF_ERROR(cuda::attention_int8fp8_quantized(ws, heads(quantized, 0), scale, nullptr));
  VORTEX_ASSIGN_OR_RETURN(Tensor a, cuda::download(quantized, nullptr));
  VORTEX_ASSIGN_OR_RETURN(Tensor b, cuda::download(exact, nullptr));
  nlohmann::json out = error_json(a, b);
  out["inputs"] = "block 0's q, k, v (synthetic weights, seeded residual stream)";
  // How often a 16-row warp's running max grows from one 128-key tile to the next: the redo rate a
  // speculative-max kernel would pay (softmax_max_growth.h), on both inputs, 8 warps per head.
  for (const auto& [name, source] : {std::pair{"block_qkv", &qkv}, std::pair{"normal_qkv", &normal}}) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor host, cuda::download(*source, nullptr));
    VORTEX_ASSIGN_OR_RETURN(const MaxGrowth growth, softmax_max_growth(heads(host, 0), heads(host, inner), 8));
    out["softmax_max_growth"][name] = max_growth_json(growth);
  }
  for (const auto& [name, source] : {std::pair{"block_qkv", &qkv}, std::pair{"normal_qkv", &normal}}) {
    const Tensor& t = *source;
    auto exact_body = [&] {
      return cuda::attention(heads(t, 0), heads(t, inner), heads(t, 2 * inner), heads(exact, 0), scale, nullptr);
    };
    auto quantize_body = [&] { return cuda::quantize_int8fp8(heads(t, 0), heads(t, inner), heads(t, 2 * inner), ws, nullptr); };
    auto attention_body = [&] { return cuda::attention_int8fp8_quantized(ws, heads(quantized, 0), scale, nullptr); };
    VORTEX_ASSIGN_OR_RETURN(Samples exact_ms, timer.measure(o, nullptr, exact_body));
    VORTEX_ASSIGN_OR_RETURN(Samples quantize_ms, timer.measure(o, nullptr, quantize_body));
    // The attention pass reads the workspace the last quantize pass wrote: these inputs' codes.
    VORTEX_ASSIGN_OR_RETURN(Samples attention_ms, timer.measure(o, nullptr, attention_body));
    out["median_ms"][name] = {{"exact", exact_ms.median()},
                              {"int8fp8_quantize_pass", quantize_ms.median()},
                              {"int8fp8_attention_pass", attention_ms.median()}};
  }
  return out;
}

Result<std::vector<Manifest>> bench_block(const BenchOptions& o) {
  h3::H3Config config = *h3::config_preset("h3");
  config.num_layers = 1;  // block 0 of the canonical model: same synthetic weights as in the full model
  config.num_refiner_layers = 0;
  VORTEX_ASSIGN_OR_RETURN(h3::PackedLayout layout, h3::canonical_t2va_layout(config));
  h3::CudaModelOptions options;
  options.int8fp8_attention = true;  // the int8fp8 block is measured too
  options.keep_attention_inputs = true;  // for the int8fp8 error on the block's own q/k/v
  VORTEX_ASSIGN_OR_RETURN(const BlockFusions fusions, block_fusions_from_env());
  options.fused_norms = fusions.fused_norms;  // a single block has no next block to fold into
  VORTEX_ASSIGN_OR_RETURN(auto model, h3::CudaH3Transformer::create(config, h3::synthetic_weight_filler(o.seed, nullptr),
                                                                    layout.num_rows, nullptr, options));
  const Tensor text = h3::seeded_normal({h3::kCanonicalTextTokens, config.text_dim}, o.seed, h3::kSyntheticTextStream);
  VORTEX_RETURN_IF_ERROR(model->prepare(layout, text));
  // A mid-trajectory step: video and audio at different noise levels (two AdaLN timesteps).
  const h3::RowTimesteps timesteps = h3::assign_row_timesteps(layout, 0.55f, 0.7f);
  VORTEX_RETURN_IF_ERROR(model->upload_step_tables(timesteps));

  // The block's input: a seeded bf16 residual stream, restored before every repetition (the block
  // runs in place).
  const int64_t N = layout.num_rows, C = config.hidden_size;
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena input_arena, cuda::DeviceArena::create(static_cast<size_t>(N * C * 2) + 512));
  VORTEX_ASSIGN_OR_RETURN(Tensor x0, input_arena.alloc({N, C}, DType::kBF16));
  VORTEX_RETURN_IF_ERROR(cuda::fill_scaled_normal(x0, o.seed, /*stream=*/100, 1.0f, nullptr));
  VORTEX_ASSIGN_OR_RETURN(Tensor x, model->residual().slice(0, 0, N));
  auto restore = [&]() -> Status {
    VORTEX_CUDA_CHECK(cudaMemcpyAsync(x.data(), x0.data(), x0.nbytes(), cudaMemcpyDeviceToDevice, nullptr));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, restore, [&] { return model->run_block(0); }));
  VORTEX_ASSIGN_OR_RETURN(const Tensor x_timed, cuda::download(x, nullptr));  // the last timed block's output

  Manifest m;
  m.workload = "h3-block";
  m.samples = samples;
  // FLOPs: the four GEMMs (2·N·in·out each) plus attention (4·N²·H·D).
  const double n = static_cast<double>(N), inner = config.inner_dim(), f = config.ffn_dim;
  const double gemm_flops = 2 * n * C * (3 * inner) + 2 * n * inner * C + 2 * n * C * (2 * f) + 2 * n * f * C;
  const double attn_flops = 4 * n * n * config.num_attention_heads * config.attention_head_dim;
  m.derived = {{"tflops", (gemm_flops + attn_flops) / (samples.median() * 1e-3) / 1e12},
               {"flops", gemm_flops + attn_flops},
               {"device_bytes",
                {{"weights", model->weight_bytes()}, {"activations_arena", model->activation_peak_bytes()}}}};
  m.workload_section = {{"name", "h3-block"},
                        {"rows", N},
                        {"text_rows", layout.num_text},
                        {"audio_rows", layout.num_audio},
                        {"video_rows", layout.num_video},
                        {"hidden", C},
                        {"heads", config.num_attention_heads},
                        {"head_dim", config.attention_head_dim},
                        {"ffn", config.ffn_dim},
                        {"timesteps", timesteps.timesteps},
                        {"dtype", "bf16"},
                        {"weights", "synthetic (models/h3/synthetic_rule.h), block 0"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  VORTEX_ASSIGN_OR_RETURN(const cuda::AttentionVariant attn_variant, cuda::attention_variant_from_env());
  m.implementation = {{"backend", "cuda"},
                      {"recipe", "bf16"},
                      {"attention", cuda::attention_variant_description(attn_variant)},
                      {"gemm", "cuBLASLt bf16, fp32 accumulate"},
                      {"fusions", fusions_description({options.fused_norms, false})}};

  // Output for correctness: one more run from x0, with the per-op breakdown recorded, then dump
  // everything the peer needs.
  VORTEX_RETURN_IF_ERROR(restore());
  cuda::SectionProfiler profiler;
  model->set_profiler(&profiler);
  VORTEX_RETURN_IF_ERROR(model->run_block(0));
  model->set_profiler(nullptr);
  nlohmann::json breakdown;
  for (const auto& [name, ms] : profiler.totals()) breakdown[name] = ms;
  m.derived["breakdown_ms"] = breakdown;
  VORTEX_ASSIGN_OR_RETURN(Tensor x_out, cuda::download(x, nullptr));
  VORTEX_ASSIGN_OR_RETURN(nlohmann::json attention_error, attention_on_block_activations(*model, config, *timer, o));
  // Without the peer the check is run to run: a block must give the same bits every time.
  m.correctness = compare(x_out, x_timed, "run-to-run: the last timed block vs a further block (bitwise expected)", 0.0);
  if (!o.peer_command.empty()) {
    fs::create_directories(o.work_dir);
    VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors io, model->download_block_weights(0));
    VORTEX_ASSIGN_OR_RETURN(Tensor x_in, cuda::download(x0, nullptr));
    VORTEX_ASSIGN_OR_RETURN(Tensor temb, model->time_embedding_host(timesteps.timesteps));
    VORTEX_ASSIGN_OR_RETURN(Tensor cos, model->download_rope(true));
    VORTEX_ASSIGN_OR_RETURN(Tensor sin, model->download_rope(false));
    VORTEX_ASSIGN_OR_RETURN(Tensor rows, model->download_adaln_rows());
    io.emplace_back("in.x", x_in);
    io.emplace_back("in.temb", temb);
    io.emplace_back("in.rope_cos", cos);
    io.emplace_back("in.rope_sin", sin);
    io.emplace_back("in.adaln_rows", rows);
    io.emplace_back("out.x", x_out);
    const std::string path = o.work_dir + "/h3_block_io.safetensors";
    VORTEX_RETURN_IF_ERROR(write_safetensors(path, io, {{"config", config.to_json_string()}}));
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json peer, run_peer(o, "h3-block", path));
    if (peer.contains("correctness")) {
      const auto& c = peer["correctness"];
      m.correctness.comparator = c.value("comparator", "peer");
      m.correctness.rel_l2 = c.value("rel_l2", 1.0);
      m.correctness.max_abs = c.value("max_abs", 0.0);
      m.correctness.max_rel = c.value("max_rel", 0.0);
      m.correctness.bound = 1e-2;
      m.correctness.passed = m.correctness.rel_l2 <= m.correctness.bound;
    }
    add_peer_ratios(m, peer);
  }

  // The same block with int8fp8 attention: its time, and its output against the exact block's.
  VORTEX_ASSIGN_OR_RETURN(Samples int8_samples,
                          timer->measure(o, restore, [&] { return model->run_block(0, h3::AttentionMode::kInt8Fp8); }));
  VORTEX_RETURN_IF_ERROR(restore());
  cuda::SectionProfiler int8_profiler;
  model->set_profiler(&int8_profiler);
  VORTEX_RETURN_IF_ERROR(model->run_block(0, h3::AttentionMode::kInt8Fp8));
  model->set_profiler(nullptr);
  nlohmann::json int8_breakdown;
  for (const auto& [name, ms] : int8_profiler.totals()) int8_breakdown[name] = ms;
  VORTEX_ASSIGN_OR_RETURN(Tensor x_int8, cuda::download(x, nullptr));
  Manifest q = m;
  q.workload = "h3-block-int8fp8";
  q.samples = int8_samples;
  q.workload_section["name"] = q.workload;
  q.derived = {{"tflops", (gemm_flops + attn_flops) / (int8_samples.median() * 1e-3) / 1e12},
               {"attention_on_block_activations", attention_error},
               {"breakdown_ms", int8_breakdown}};
  q.implementation["attention"] = "int8fp8 (src/cuda/attention_int8fp8.cu, quantize pass included)";
  q.correctness = compare(x_int8, x_out, "the exact-attention block's output (bf16 residual stream)", 0.05);
  m.derived["attention_on_block_activations"] = attention_error;
  for (nlohmann::json& peer : q.peers) peer["ratio_peer_over_vortex"] = peer.value("median_ms", 0.0) / int8_samples.median();
  std::vector<Manifest> manifests{m, q};

  // The fp8 recipe: the same block, weights and input, quantized at load; with exact and with
  // int8fp8 attention. Its error is stated against the bf16 block's output.
  model.reset();
  options.recipe = h3::LinearRecipe::kFp8;
  VORTEX_ASSIGN_OR_RETURN(auto fp8_model, h3::CudaH3Transformer::create(config, h3::synthetic_weight_filler(o.seed, nullptr),
                                                                        layout.num_rows, nullptr, options));
  VORTEX_RETURN_IF_ERROR(fp8_model->prepare(layout, text));
  VORTEX_RETURN_IF_ERROR(fp8_model->upload_step_tables(timesteps));
  VORTEX_ASSIGN_OR_RETURN(Tensor x8, fp8_model->residual().slice(0, 0, N));
  auto restore8 = [&]() -> Status {
    VORTEX_CUDA_CHECK(cudaMemcpyAsync(x8.data(), x0.data(), x0.nbytes(), cudaMemcpyDeviceToDevice, nullptr));
    return ok_status();
  };
  for (h3::AttentionMode mode : {h3::AttentionMode::kExact, h3::AttentionMode::kInt8Fp8}) {
    const bool int8 = mode == h3::AttentionMode::kInt8Fp8;
    VORTEX_ASSIGN_OR_RETURN(Samples samples, timer->measure(o, restore8, [&] { return fp8_model->run_block(0, mode); }));
    VORTEX_RETURN_IF_ERROR(restore8());
    cuda::SectionProfiler profiler8;
    fp8_model->set_profiler(&profiler8);
    VORTEX_RETURN_IF_ERROR(fp8_model->run_block(0, mode));
    fp8_model->set_profiler(nullptr);
    nlohmann::json breakdown8;
    for (const auto& [name, ms] : profiler8.totals()) breakdown8[name] = ms;
    VORTEX_ASSIGN_OR_RETURN(Tensor out8, cuda::download(x8, nullptr));
    Manifest f = m;
    f.workload = int8 ? "h3-block-fp8-int8fp8" : "h3-block-fp8";
    f.samples = samples;
    f.workload_section["name"] = f.workload;
    f.derived = {{"tflops", (gemm_flops + attn_flops) / (samples.median() * 1e-3) / 1e12},
                 {"breakdown_ms", breakdown8},
                 {"device_bytes",
                  {{"weights", fp8_model->weight_bytes()}, {"activations_arena", fp8_model->activation_peak_bytes()}}}};
    f.implementation["recipe"] = "fp8 (e4m3 weights per output channel, e4m3 activations per token, cuBLASLt "
                                 "outer-vector scales, fp32 accumulate)";
    f.implementation["gemm"] = "cuBLASLt fp8 e4m3 x e4m3 -> bf16";
    if (int8) f.implementation["attention"] = q.implementation["attention"];
    f.correctness = compare(out8, x_out, "the bf16 block's output (bf16 residual stream): the recipe's error", 0.05);
    f.derived["error_vs_bf16_block"] = error_json(out8, x_out);
    for (nlohmann::json& peer : f.peers) peer["ratio_peer_over_vortex"] = peer.value("median_ms", 0.0) / samples.median();
    manifests.push_back(std::move(f));
  }
  return manifests;
}

}  // namespace

const std::vector<std::string>& cuda_workload_names() {
  static const std::vector<std::string> kNames = {"h3-block", "h3-forward", "h3-denoise", "h3-denoise-sp", "gemm",
                                                  "attention"};
  return kNames;
}

Result<std::vector<Manifest>> bench_gemm(const BenchOptions& o);
Result<std::vector<Manifest>> bench_attention(const BenchOptions& o);
Result<std::vector<Manifest>> bench_forward(const BenchOptions& o);  // cuda_model_workloads.cc
Result<std::vector<Manifest>> bench_denoise(const BenchOptions& o);
Result<std::vector<Manifest>> bench_denoise_sequence_parallel(const BenchOptions& o);

Result<std::vector<Manifest>> run_cuda_workload(const BenchOptions& o) {
  if (o.warmup < 3 || o.repetitions < 10) {
    return invalid_argument("the protocol needs >= 3 warm-ups and >= 10 repetitions (DESIGN section 4)");
  }
  if (o.workload == "h3-block") return bench_block(o);
  if (o.workload == "h3-forward") return bench_forward(o);
  if (o.workload == "h3-denoise") return bench_denoise(o);
  if (o.workload == "h3-denoise-sp") return bench_denoise_sequence_parallel(o);
  if (o.workload == "gemm") return bench_gemm(o);
  if (o.workload == "attention") return bench_attention(o);
  return invalid_argument("unknown workload '" + o.workload + "' (h3-block, h3-forward, h3-denoise, h3-denoise-sp, gemm, attention)");
}

}  // namespace vortex::bench
