// The `weight-load` workload of `vortex bench`: what loading one transformer block of the released
// model (h3 preset widths: to_q / to_k / to_v 7168 x 5376, to_out 5376 x 7168, FC1 28672 x 5376,
// FC2 5376 x 14336) onto the device costs from each kind of checkpoint.
//
// Timed: h3::host_weight_filler writing the block from an fp8 checkpoint as `convert --quantize fp8`
// writes it (to_q, to_k, to_v, FC1, FC2 in e4m3 with a scale per row, to_out bf16), dequantized on
// the device (cuda/dequantize_weights.h). derived: the same block dequantized on the host
// (h3::DequantizeOn::kHost, what a load did before), the six linears stored NVFP4 either
// way, as a GGUF file's Q4_K and Q8_0 blocks either way, stored bf16 (a plain upload), and stored
// bf16 in the original layout (fused QKV and FC1): its parts' rows staged straight from the stored
// weights (h3::HostWeights), and the layout converted first as loads did before (a gathered copy of
// every part), fp8 in the original layout (its parts' codes staged the same way), each scaled to a
// model's num_layers blocks. Correctness: the device dequantization's
// weights against the host's, bit for bit (bound 0; the Q4_K block's and the original layout's
// upload too, or the bench fails).
#include <cstring>
#include <string>
#include <vector>

#include "bench/cuda_bench_util.h"
#include "bench/cuda_workloads.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "formats/gguf.h"
#include "models/h3/config.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/weights.h"

namespace vortex::bench {

namespace {

// bf16 N(0, 0.02) weights.
Result<Tensor> weight(const Shape& shape, uint64_t seed) { return normal_f32(shape, seed, 0.02f).to(DType::kBF16); }

// Random NVFP4 codes, positive block scales from 2^-6 to 1.875 · 2^-6 and a tensor scale of 1/64:
// weights up to ~0.003 (the bench times bytes and arithmetic, not a quantizer's choices).
h3::NamedTensors nvfp4_linear(const std::string& name, int64_t out, int64_t in, uint64_t seed) {
  Tensor packed = Tensor::empty({out, in / 2}, DType::kU8);
  Tensor scales = Tensor::empty({out, in / 16}, DType::kF8E4M3);
  auto* codes = static_cast<uint8_t*>(packed.data());
  auto* scale_codes = static_cast<uint8_t*>(scales.data());
  parallel_for(0, packed.numel(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) codes[i] = static_cast<uint8_t>(philox_block(seed, 1, i).v[0]);
  }, int64_t{1} << 16);
  for (int64_t i = 0; i < scales.numel(); ++i) {
    scale_codes[i] = static_cast<uint8_t>(0x08 + philox_block(seed, 2, i).v[0] % 8);  // exponent field 1
  }
  const std::string p = name.substr(0, name.size() - std::strlen(".weight"));
  return {{name, packed}, {p + ".weight_scale", scales}, {p + ".weight_scale_2", Tensor::from_f32({1.0f / 64}, {})}};
}

// A [out, in] weight as GGUF blocks of `type` held as a GGUF file's are (scaled_weights.h): random
// codes and sub-block scales, every f16 scale and min 2^-10.
h3::NamedTensors ggml_linear(const std::string& name, uint32_t type, int64_t out, int64_t in, uint64_t seed) {
  const int64_t block_bytes = ggml_block_bytes(type), blocks = out * in / ggml_block_values(type);
  Tensor t = Tensor::empty({out, in / ggml_block_values(type) * block_bytes}, DType::kU8);
  auto* bytes = static_cast<uint8_t*>(t.data());
  const std::vector<int> f16_fields = ggml_f16_fields(type);
  const uint16_t scale = f32_to_f16_bits(1.0f / 1024);
  parallel_for(0, blocks, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      uint8_t* block = bytes + b * block_bytes;
      for (int64_t i = 0; i < block_bytes; ++i) block[i] = static_cast<uint8_t>(philox_block(seed, b, i).v[0]);
      for (const int field : f16_fields) {
        block[field] = static_cast<uint8_t>(scale & 0xFF);
        block[field + 1] = static_cast<uint8_t>(scale >> 8);
      }
    }
  }, int64_t{1} << 10);
  const std::string p = name.substr(0, name.size() - std::strlen(".weight"));
  return {{name, t}, {p + h3::kGgmlTypeSuffix, h3::ggml_type_tensor(type)}};
}

}  // namespace

Result<std::vector<Manifest>> run_load_workload(const BenchOptions& o) {
  if (o.warmup < 3 || o.repetitions < 10) {
    return invalid_argument("the protocol needs >= 3 warm-ups and >= 10 repetitions (DESIGN section 4)");
  }
  if (o.workload != "weight-load") return invalid_argument("unknown load workload '" + o.workload + "' (weight-load)");
  VORTEX_ASSIGN_OR_RETURN(const h3::H3Config config, h3::config_preset("h3"));
  const std::vector<BlockLinear> linears = block_linears(config);
  h3::NamedTensors bf16, fp8, nvfp4, q4_k, q8_0;
  std::vector<h3::TensorSpec> specs;
  std::vector<Tensor> targets;
  size_t bytes = 0;
  for (const BlockLinear& l : linears) bytes += cuda::DeviceArena::bytes_for({l.out, l.in}, DType::kBF16);
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create(bytes));
  std::fprintf(stderr, "vortex bench: making one block's weights in bf16, fp8, NVFP4, Q4_K and Q8_0\n");
  for (size_t i = 0; i < linears.size(); ++i) {
    const BlockLinear& l = linears[i];
    const std::string name = l.name + ".weight";
    VORTEX_ASSIGN_OR_RETURN(const Tensor w, weight({l.out, l.in}, o.seed + 1000 + i));
    bf16.emplace_back(name, w);
    specs.push_back({name, Shape{l.out, l.in}, false});
    VORTEX_ASSIGN_OR_RETURN(Tensor dst, arena.alloc({l.out, l.in}, DType::kBF16));
    targets.push_back(dst);
    for (auto& entry : nvfp4_linear(name, l.out, l.in, o.seed + 2000 + i)) nvfp4.push_back(std::move(entry));
    for (auto& entry : ggml_linear(name, kGgmlQ4_K, l.out, l.in, o.seed + 3000 + i)) q4_k.push_back(std::move(entry));
    for (auto& entry : ggml_linear(name, kGgmlQ8_0, l.out, l.in, o.seed + 4000 + i)) q8_0.push_back(std::move(entry));
  }
  VORTEX_ASSIGN_OR_RETURN(fp8, h3::quantize_linears_fp8(bf16));
  const auto fill_all = [&](const h3::WeightFiller& fill) -> Status {
    for (size_t i = 0; i < specs.size(); ++i) VORTEX_RETURN_IF_ERROR(fill(specs[i], targets[i]));
    VORTEX_RETURN_IF_ERROR(fill.finish());
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return ok_status();
  };
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  const auto measure = [&](const h3::HostWeights& tensors, h3::DequantizeOn where) -> Result<Samples> {
    const h3::WeightFiller fill = h3::host_weight_filler(tensors, nullptr, where);
    return timer->measure(o, nullptr, [&] { return fill_all(fill); });
  };
  using h3::DequantizeOn;
  VORTEX_ASSIGN_OR_RETURN(const Samples fp8_device, measure(fp8, DequantizeOn::kDevice));
  VORTEX_ASSIGN_OR_RETURN(const Samples fp8_host, measure(fp8, DequantizeOn::kHost));
  VORTEX_ASSIGN_OR_RETURN(const Samples nvfp4_device, measure(nvfp4, DequantizeOn::kDevice));
  VORTEX_ASSIGN_OR_RETURN(const Samples nvfp4_host, measure(nvfp4, DequantizeOn::kHost));
  VORTEX_ASSIGN_OR_RETURN(const Samples q4_k_device, measure(q4_k, DequantizeOn::kDevice));
  VORTEX_ASSIGN_OR_RETURN(const Samples q4_k_host, measure(q4_k, DequantizeOn::kHost));
  VORTEX_ASSIGN_OR_RETURN(const Samples q8_0_device, measure(q8_0, DequantizeOn::kDevice));
  VORTEX_ASSIGN_OR_RETURN(const Samples q8_0_host, measure(q8_0, DequantizeOn::kHost));
  VORTEX_ASSIGN_OR_RETURN(const Samples bf16_upload, measure(bf16, DequantizeOn::kDevice));
  // The bf16 block in the original layout: the parts' rows staged from the fused weights, against
  // converting the layout first (what a load did before HostWeights).
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors original, h3::diffusers_to_original(bf16, config));
  VORTEX_ASSIGN_OR_RETURN(const h3::HostWeights original_weights, h3::HostWeights::original(original, config));
  VORTEX_ASSIGN_OR_RETURN(const Samples original_rows, measure(original_weights, DequantizeOn::kDevice));
  VORTEX_ASSIGN_OR_RETURN(const Samples original_gathered, timer->measure(o, nullptr, [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors converted, h3::original_to_diffusers(original, config));
    return fill_all(h3::host_weight_filler(converted, nullptr));
  }));
  // The fp8 block in the original layout (convert --to original --quantize fp8): each part's codes
  // staged from their rows of the fused codes (its scales' rows taken on the host), then dequantized
  // on the device.
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors fp8_original, h3::quantize_linears_fp8(original));
  VORTEX_ASSIGN_OR_RETURN(const h3::HostWeights fp8_original_weights, h3::HostWeights::original(fp8_original, config));
  VORTEX_ASSIGN_OR_RETURN(const Samples fp8_original_device, measure(fp8_original_weights, DequantizeOn::kDevice));
  VORTEX_RETURN_IF_ERROR(fill_all(h3::host_weight_filler(original_weights, nullptr)));
  VORTEX_ASSIGN_OR_RETURN(const auto original_both, concatenated_bf16(targets, bf16));
  if (std::memcmp(original_both.first.data(), original_both.second.data(), original_both.first.nbytes()) != 0) {
    return internal_error("weight-load: the original layout's block differs from the diffusers layout's on the device");
  }

  // Correctness: the fp8 block dequantized on the device against the host's dequantization.
  VORTEX_RETURN_IF_ERROR(fill_all(h3::host_weight_filler(fp8, nullptr, DequantizeOn::kDevice)));
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors host_dequantized, h3::dequantize_scaled_weights(fp8, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(const auto both, concatenated_bf16(targets, host_dequantized));
  // And the Q4_K block's, which must be the same bits too.
  VORTEX_RETURN_IF_ERROR(fill_all(h3::host_weight_filler(q4_k, nullptr, DequantizeOn::kDevice)));
  VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors q4_k_host_dequantized,
                          h3::dequantize_scaled_weights(q4_k, DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(const auto q4_k_both, concatenated_bf16(targets, q4_k_host_dequantized));
  if (std::memcmp(q4_k_both.first.data(), q4_k_both.second.data(), q4_k_both.first.nbytes()) != 0) {
    return internal_error("weight-load: the Q4_K block dequantized on the device differs from the host's");
  }

  const double layers = static_cast<double>(config.num_layers);
  double params = 0;
  for (const BlockLinear& l : linears) params += static_cast<double>(l.out * l.in);
  Manifest m;
  m.workload = o.workload;
  m.samples = fp8_device;
  m.derived = {
      {"weights_per_block", params},
      {"ms_per_block (median)",
       {{"fp8_device_dequantize", fp8_device.median()},
        {"fp8_host_dequantize", fp8_host.median()},
        {"nvfp4_device_dequantize", nvfp4_device.median()},
        {"nvfp4_host_dequantize", nvfp4_host.median()},
        {"gguf_q4_k_device_dequantize", q4_k_device.median()},
        {"gguf_q4_k_host_dequantize", q4_k_host.median()},
        {"gguf_q8_0_device_dequantize", q8_0_device.median()},
        {"gguf_q8_0_host_dequantize", q8_0_host.median()},
        {"bf16_upload", bf16_upload.median()},
        {"bf16_original_layout_rows_staged", original_rows.median()},
        {"bf16_original_layout_converted_first", original_gathered.median()},
        {"fp8_original_layout_device_dequantize", fp8_original_device.median()}}},
      {"model_load_s (num_layers blocks' six linears)",
       {{"fp8_device_dequantize", fp8_device.median() * layers / 1e3},
        {"fp8_host_dequantize", fp8_host.median() * layers / 1e3},
        {"nvfp4_device_dequantize", nvfp4_device.median() * layers / 1e3},
        {"nvfp4_host_dequantize", nvfp4_host.median() * layers / 1e3},
        {"gguf_q4_k_device_dequantize", q4_k_device.median() * layers / 1e3},
        {"gguf_q4_k_host_dequantize", q4_k_host.median() * layers / 1e3},
        {"gguf_q8_0_device_dequantize", q8_0_device.median() * layers / 1e3},
        {"gguf_q8_0_host_dequantize", q8_0_host.median() * layers / 1e3},
        {"bf16_upload", bf16_upload.median() * layers / 1e3},
        {"bf16_original_layout_rows_staged", original_rows.median() * layers / 1e3},
        {"bf16_original_layout_converted_first", original_gathered.median() * layers / 1e3},
        {"fp8_original_layout_device_dequantize", fp8_original_device.median() * layers / 1e3}}},
      {"speedup_fp8_device_over_host", fp8_host.median() / fp8_device.median()},
      {"speedup_nvfp4_device_over_host", nvfp4_host.median() / nvfp4_device.median()},
      {"speedup_gguf_q4_k_device_over_host", q4_k_host.median() / q4_k_device.median()},
      {"speedup_gguf_q8_0_device_over_host", q8_0_host.median() / q8_0_device.median()},
      {"speedup_original_layout_rows_staged_over_converted_first", original_gathered.median() / original_rows.median()},
      {"gguf_q4_k_device_bits_equal_host", true},
      {"original_layout_bits_equal_diffusers_layout", true}};
  m.workload_section = {{"name", m.workload},
                        {"config", "h3 preset (the released widths), one transformer block's six linears"},
                        {"num_layers", config.num_layers},
                        {"fp8", "as convert --quantize fp8 writes it: to_q, to_k, to_v, ff.net.0.proj, ff.net.2 in e4m3 "
                                "with one F32 scale per row (quantize_linears_fp8 of the bf16 weights), to_out.0 bf16"},
                        {"nvfp4", "all six linears: random codes, row-major e4m3 block scales, a tensor scale"},
                        {"gguf", "all six linears as a GGUF file's Q4_K / Q8_0 blocks (random codes and sub-block "
                                 "scales, f16 scales 2^-10), held zero-copy with their P.ggml_type"},
                        {"original_layout",
                         "the bf16 block as diffusers_to_original writes it (QKV fused per head, FC1 [gate; value]): "
                         "h3::HostWeights stages each part's rows from the fused weight; converted_first runs "
                         "original_to_diffusers then uploads; fp8 original: quantize_linears_fp8 of it (fused QKV and "
                         "FC1 quantized per row), each part's codes staged from their rows, its scales' rows taken"},
                        {"weights", "synthetic bf16 N(0, 0.02) on the host, as a checkpoint's are"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "the six weights of the fp8 block written through h3::host_weight_filler, dequantized on the device";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  m.implementation = {{"backend", "cuda"},
                      {"dequantize", "cuda::dequantize_fp8_weight / dequantize_nvfp4_weight / dequantize_ggml_weight: "
                                     "ggml's / one fp32 product an element, rounded once to bf16, after the "
                                     "codes' staged upload"}};
  m.correctness = compare(both.first, both.second, "the host's dequantization (h3::dequantize_scaled_weights), bit for bit", 0.0);
  return std::vector<Manifest>{std::move(m)};
}

}  // namespace vortex::bench
