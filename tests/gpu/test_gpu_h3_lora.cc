// A LoRA-merged model on the GPU: its forward against the reference's fp32 forward of the merged
// model and against the CPU program on the same merged weights. Serve's per-request adapters:
// weights merged on the device and written again in place give the bits of a model loaded with the
// host merge's weights.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <set>

#include "gpu_test_util.h"
#include "h3_golden_util.h"
#include "models/h3/cuda_lora_merge.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/lora.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/weights.h"
#if defined(VORTEX_HAVE_NCCL)
#include "dist/sequence_parallel_h3.h"
#endif

namespace vortex {
namespace {

using test::golden_path;
using test::must;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Adapters with their strengths, owned (what merge_adapters keeps).
std::shared_ptr<const h3::LoraStack> stack_of(const std::vector<std::pair<const h3::LoraAdapter*, double>>& loras) {
  auto stack = std::make_shared<h3::LoraStack>();
  for (const auto& [adapter, strength] : loras) {
    stack->adapters.push_back(*adapter);
    stack->strengths.push_back(strength);
  }
  return stack;
}

TEST(GpuH3Lora, StackedAdaptersMatchTheReferenceAndTheCpuProgram) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = must(h3::config_from_file(golden_path("h3_lora/config.json")));
  h3::NamedTensors tensors = must(h3::read_all(must(ShardedCheckpoint::open(golden_path("h3_lora/base.safetensors")))));
  std::vector<h3::LoraAdapter> adapters;
  for (const char* name : {"kohya_original", "diffusers_metadata_alpha", "diffsynth"}) {
    adapters.push_back(must(h3::read_lora(golden_path(std::string("h3_lora/") + name + ".safetensors"), config)));
  }
  const h3::NamedTensors base = tensors;
  must(h3::merge_loras(tensors, {{&adapters[0], 0.5}, {&adapters[1], 1.0}, {&adapters[2], -0.75}}, DType::kBF16));
  const auto expected = must(SafetensorsFile::open(golden_path("h3_lora/expected.safetensors")));
  const test::GoldenCase golden = must(test::read_golden_case(expected));

  // As generate --lora loads it under VORTEX_VARIANT_LORA_MERGE=device: merged on the device as the
  // weights upload.
  const auto stack = stack_of({{&adapters[0], 0.5}, {&adapters[1], 1.0}, {&adapters[2], -0.75}});
  auto gpu = must(h3::CudaH3Transformer::create(config, h3::lora_merging_filler(base, stack, DType::kBF16, nullptr),
                                                golden.layout.num_rows));
  must(gpu->prepare(golden.layout, golden.text_states));
  const h3::StepOutputs out = must(gpu->forward(golden.step));
  // ... the bits of the host merge's weights uploaded.
  auto host_merged =
      must(h3::CudaH3Transformer::create(config, h3::host_weight_filler(tensors, nullptr), golden.layout.num_rows));
  must(host_merged->prepare(golden.layout, golden.text_states));
  const h3::StepOutputs host_out = must(host_merged->forward(golden.step));
  EXPECT_TRUE(same_bits(out.video_velocity, host_out.video_velocity));
  EXPECT_TRUE(same_bits(out.audio_velocity, host_out.audio_velocity));

  auto cpu = must(h3::H3Transformer::create(must(h3::assemble_weights(tensors, config, DType::kBF16))));
  const h3::StepOutputs cpu_out =
      must(cpu->forward(must(cpu->prepare(golden.layout, golden.text_states)), golden.step));

  for (const auto& [name, value, cpu_value] : {std::tuple{"video_out", &out.video_velocity, &cpu_out.video_velocity},
                                               std::tuple{"audio_out", &out.audio_velocity, &cpu_out.audio_velocity}}) {
    const double vs_reference = test::rel_l2(*value, must(expected.get(std::string("stacked.") + name)));
    const double vs_cpu = test::rel_l2(*value, *cpu_value);
    // The bf16 bounds of the forward's parity (test_gpu_h3_forward.cc): the reference is fp32 here.
    EXPECT_LE(vs_reference, 2e-2) << name;
    EXPECT_LE(vs_cpu, 2e-2) << name;
    std::printf("lora stacked %s: rel-L2 vs reference (fp32) %.3e, vs CPU bf16 %.3e\n", name, vs_reference, vs_cpu);
  }
}

std::set<std::string> targets_of(const std::vector<const h3::LoraAdapter*>& adapters) {
  std::set<std::string> out;
  for (const h3::LoraAdapter* a : adapters) {
    for (const h3::LoraModule& m : a->modules) {
      for (std::string& name : m.merged_tensors()) out.insert(std::move(name));
    }
  }
  return out;
}

// Adapters on a quantized base (fp8 as convert --quantize fp8 writes it): lora_merging_filler merges
// into each weight's dequantization, on the device (or on the host where the device merge does not
// take the terms: a DoRA module meeting a lora_B bias), and writes the bits it writes from the base
// dequantized first, every tensor of the model. The same base in the original layout, bf16 and fp8
// (each fused layer's part written from its rows of the fused weight), gives the diffusers layout's bits.
TEST(GpuH3Lora, AQuantizedBaseMergesFromItsDequantization) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = must(h3::config_from_file(golden_path("h3_lora/config.json")));
  const h3::NamedTensors base =
      must(h3::read_all(must(ShardedCheckpoint::open(golden_path("h3_lora/base.safetensors")))));
  std::vector<std::pair<const h3::LoraAdapter*, double>> stacked;
  std::vector<h3::LoraAdapter> adapters;
  for (const char* name : {"kohya_original", "diffsynth", "musubi", "lora_bias", "dora"}) {
    adapters.push_back(must(h3::read_lora(golden_path(std::string("h3_lora/") + name + ".safetensors"), config)));
  }
  for (size_t i = 0; i < adapters.size(); ++i) stacked.emplace_back(&adapters[i], i % 2 ? -0.5 : 0.75);
  const h3::NamedTensors fp8 = must(h3::quantize_linears_fp8(base));
  const h3::NamedTensors dequantized = must(h3::dequantize_scaled_weights(fp8, DType::kBF16));
  const auto stack = stack_of(stacked);
  const h3::WeightFiller from_dequantized = h3::lora_merging_filler(dequantized, stack, DType::kBF16, nullptr);
  // The same base in the original layout (its fused parts uploaded from their rows), bf16 and fp8,
  // merges to the same bits: against the diffusers layout's merges.
  const h3::NamedTensors original = must(h3::diffusers_to_original(base, config));
  const h3::NamedTensors original_fp8 = must(h3::quantize_linears_fp8(original));
  const h3::WeightFiller from_fp8 = h3::lora_merging_filler(fp8, stack, DType::kBF16, nullptr);
  const h3::WeightFiller from_original_fp8 =
      h3::lora_merging_filler(must(h3::HostWeights::original(original_fp8, config)), stack, DType::kBF16, nullptr);
  const h3::WeightFiller from_base = h3::lora_merging_filler(base, stack, DType::kBF16, nullptr);
  const h3::WeightFiller from_original =
      h3::lora_merging_filler(must(h3::HostWeights::original(original, config)), stack, DType::kBF16, nullptr);
  const auto terms = h3::lora_terms_by_linear(stack->applications());
  int quantized_targets = 0, part_targets = 0;
  for (const h3::TensorSpec& spec : h3::diffusers_schema(config)) {
    SCOPED_TRACE(spec.name);
    const DType dtype = spec.fp32_island ? DType::kF32 : DType::kBF16;
    cuda::DeviceArena arena = must(cuda::DeviceArena::create(3 * cuda::DeviceArena::bytes_for(spec.shape, dtype)));
    const Tensor got = must(arena.alloc(spec.shape, dtype)), want = must(arena.alloc(spec.shape, dtype));
    const Tensor other = must(arena.alloc(spec.shape, dtype));
    must(from_dequantized(spec, want));
    for (const auto* fill : {&from_fp8, &from_original_fp8}) {
      must((*fill)(spec, got));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(same_bits(must(cuda::download(got, nullptr)), must(cuda::download(want, nullptr))));
    }
    must(from_base(spec, want));
    must(from_original(spec, other));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(same_bits(must(cuda::download(other, nullptr)), must(cuda::download(want, nullptr))));
    const std::string linear = spec.name.substr(0, spec.name.rfind('.'));
    if (h3::is_fp8_channel_quantized_linear(spec.name) && terms.count(linear)) ++quantized_targets;
    const bool part = spec.name.find(".attn.to_") != std::string::npos || spec.name.ends_with("ff.net.0.proj.weight");
    if (part && !spec.name.ends_with("to_out.0.weight") && terms.count(linear)) ++part_targets;
  }
  for (const auto* fill : {&from_dequantized, &from_fp8, &from_original_fp8, &from_base, &from_original}) {
    must(fill->finish());
  }
  EXPECT_GT(quantized_targets, 0) << "no adapter targets a quantized weight: this checks nothing";
  EXPECT_GT(part_targets, 0) << "no adapter targets a fused layer's part: the original layout checks nothing";
}

// One model under both recipes and both AdaLN table modes (and, where NCCL is built, two
// sequence-parallel ranks on this GPU): the base weights, then adapter set A merged and written in
// place, then set B (A's weights restored where B does not touch them), then the base again, with
// both VORTEX_VARIANT_LORA_MERGE paths. Each forward is bitwise the forward of a model created from
// the host merge's weights.
TEST(GpuH3Lora, WeightsWrittenAgainInPlaceAreTheBitsOfAFreshLoad) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = must(h3::config_from_file(golden_path("h3_lora/config.json")));
  const h3::NamedTensors base =
      must(h3::read_all(must(ShardedCheckpoint::open(golden_path("h3_lora/base.safetensors")))));
  std::vector<h3::LoraAdapter> adapters;
  // Every kind of linear between them; lora_bias and dora write biases and DoRA-scaled weights too.
  for (const char* name : {"kohya_original", "diffsynth", "musubi", "lora_bias", "dora"}) {
    adapters.push_back(must(h3::read_lora(golden_path(std::string("h3_lora/") + name + ".safetensors"), config)));
  }
  h3::NamedTensors set_a = base, set_b = base;
  must(h3::merge_loras(set_a, {{&adapters[0], 1.0}}, DType::kBF16));
  must(h3::merge_loras(set_b, {{&adapters[1], -0.75}, {&adapters[2], 0.5}, {&adapters[3], 0.7}, {&adapters[4], -0.5}},
                       DType::kBF16));
  const std::set<std::string> targets_a = targets_of({&adapters[0]});
  const std::set<std::string> targets_b = targets_of({&adapters[1], &adapters[2], &adapters[3], &adapters[4]});
  std::set<std::string> a_or_b = targets_a;
  a_or_b.insert(targets_b.begin(), targets_b.end());
  const auto expected = must(SafetensorsFile::open(golden_path("h3_lora/expected.safetensors")));
  const test::GoldenCase golden = must(test::read_golden_case(expected));
  const int64_t rows = golden.layout.num_rows;

  using Make = std::function<std::unique_ptr<h3::StepModel>(const h3::NamedTensors&, const h3::CudaModelOptions&)>;
  std::vector<std::pair<std::string, Make>> kinds = {
      {"one GPU", [&](const h3::NamedTensors& w, const h3::CudaModelOptions& o) -> std::unique_ptr<h3::StepModel> {
         return must(h3::CudaH3Transformer::create(config, h3::host_weight_filler(w, nullptr), rows, nullptr, o));
       }}};
#if defined(VORTEX_HAVE_NCCL)
  kinds.push_back({"2 ranks on GPU 0", [&](const h3::NamedTensors& w, const h3::CudaModelOptions& o) -> std::unique_ptr<h3::StepModel> {
                     const auto filler_for = [&](cudaStream_t s) { return h3::host_weight_filler(w, s); };
                     return must(dist::SequenceParallelH3::create(
                         config, filler_for, rows, must(dist::LocalGpuGroup::create_on_one_device(0, 2)), o));
                   }});
#endif
  const auto run = [&](h3::StepModel& model) {
    must(model.prepare(golden.layout, golden.text_states));
    must(model.plan_steps({golden.step.timesteps.timesteps}));
    return must(model.step(golden.step));
  };
  for (const auto& [kind, make] : kinds) {
    for (const h3::LinearRecipe recipe : {h3::LinearRecipe::kBf16, h3::LinearRecipe::kFp8}) {
      for (const h3::AdaLnTables tables : {h3::AdaLnTables::kPerStep, h3::AdaLnTables::kPerRequest}) {
        h3::CudaModelOptions options;
        options.recipe = recipe;
        options.adaln_tables = tables;
        SCOPED_TRACE(kind + (recipe == h3::LinearRecipe::kFp8 ? ", fp8" : ", bf16") +
                     (tables == h3::AdaLnTables::kPerStep ? ", tables per step" : ", tables per request"));
        std::unique_ptr<h3::StepModel> model = make(base, options);
        const h3::StepOutputs base_out = run(*model);
        struct Phase {
          const h3::NamedTensors* weights;  // the host merge's
          std::shared_ptr<const h3::LoraStack> loras;
          const std::set<std::string>* names;
          const char* what;
        };
        // Merged on the device, then by the host path it is held equal to (each round ends on the base).
        for (const char* variant : {"device", "host"}) {
          const test::ScopedEnv chosen("VORTEX_VARIANT_LORA_MERGE", variant);
          for (const auto& [weights, loras, names, what] :
               {Phase{&set_a, stack_of({{&adapters[0], 1.0}}), &targets_a, "set A"},
                Phase{&set_b,
                      stack_of({{&adapters[1], -0.75}, {&adapters[2], 0.5}, {&adapters[3], 0.7}, {&adapters[4], -0.5}}),
                      &a_or_b, "set B after A"},
                Phase{&base, stack_of({}), &targets_b, "the base after B"}}) {
            must(model->merge_adapters(base, loras, DType::kBF16, *names));
            const h3::StepOutputs out = run(*model);
            const h3::StepOutputs fresh = weights == &base ? base_out : run(*make(*weights, options));
            EXPECT_TRUE(same_bits(out.video_velocity, fresh.video_velocity)) << variant << ", " << what;
            EXPECT_TRUE(same_bits(out.audio_velocity, fresh.audio_velocity)) << variant << ", " << what;
            if (weights != &base) EXPECT_FALSE(same_bits(out.video_velocity, base_out.video_velocity)) << what;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace vortex
