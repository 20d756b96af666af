// The H3 forward on the GPU against the reference goldens (bf16) and against the CPU program on
// the same weights and inputs, and the device-filled synthetic weights against the host writer's.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>

#include "h3_golden_util.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/synthetic.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Diffusers-named fp32 tensors of a golden folder (either layout on disk).
h3::NamedTensors golden_tensors(const std::string& folder, const std::string& layout, const h3::H3Config& config) {
  auto checkpoint = ShardedCheckpoint::open(test::golden_path(folder + "/" + layout + ".safetensors"));
  EXPECT_TRUE(checkpoint.ok());
  auto all = h3::read_all(*checkpoint);
  EXPECT_TRUE(all.ok());
  if (layout == "diffusers") return *all;
  auto converted = h3::original_to_diffusers(*all, config);
  EXPECT_TRUE(converted.ok());
  return *converted;
}

class GpuH3Forward : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(GpuH3Forward, MatchesTheReferenceAndTheCpuProgram) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const auto& [folder, layout] = GetParam();
  auto config = h3::config_from_file(test::golden_path(folder + "/config.json"));
  ASSERT_TRUE(config.ok());
  const h3::NamedTensors tensors = golden_tensors(folder, layout, *config);
  auto io = SafetensorsFile::open(test::golden_path(folder + "/io_bf16.safetensors"));
  ASSERT_TRUE(io.ok());
  auto golden = test::read_golden_case(*io);
  ASSERT_TRUE(golden.ok());

  auto gpu = h3::CudaH3Transformer::create(*config, h3::host_weight_filler(tensors, nullptr), golden->layout.num_rows);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  const Status prepared = (*gpu)->prepare(golden->layout, golden->text_states);
  ASSERT_TRUE(prepared.ok()) << prepared.to_string();
  auto out = (*gpu)->forward(golden->step);
  ASSERT_TRUE(out.ok()) << out.status().to_string();

  auto weights = h3::assemble_weights(tensors, *config, DType::kBF16);
  ASSERT_TRUE(weights.ok());
  auto cpu = h3::H3Transformer::create(std::move(*weights));
  ASSERT_TRUE(cpu.ok());
  auto request = (*cpu)->prepare(golden->layout, golden->text_states);
  ASSERT_TRUE(request.ok());
  auto cpu_out = (*cpu)->forward(*request, golden->step);
  ASSERT_TRUE(cpu_out.ok());

  for (auto [name, value, cpu_value] :
       {std::tuple{"video_out", &out->video_velocity, &cpu_out->video_velocity},
        std::tuple{"audio_out", &out->audio_velocity, &cpu_out->audio_velocity}}) {
    auto ref = io->get(std::string("out.") + name);
    ASSERT_TRUE(ref.ok());
    const double vs_reference = test::rel_l2(*value, *ref);
    const double vs_cpu = test::rel_l2(*value, *cpu_value);
    // Same bound as the CPU program's bf16 parity; GPU vs CPU differs by accumulation order and
    // the flash kernel's bf16 P, both of bf16-ulp size.
    EXPECT_LE(vs_reference, 2e-2) << name << " vs reference";
    EXPECT_LE(vs_cpu, 2e-2) << name << " vs CPU";
    RecordProperty(std::string(name) + "_vs_reference", std::to_string(vs_reference));
    RecordProperty(std::string(name) + "_vs_cpu", std::to_string(vs_cpu));
    std::printf("%s %s %s: rel-L2 vs reference %.3e, vs CPU %.3e\n", folder.c_str(), layout.c_str(), name,
                vs_reference, vs_cpu);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, GpuH3Forward,
                         testing::Values(std::pair{std::string("h3_tiny"), std::string("diffusers")},
                                         std::pair{std::string("h3_small"), std::string("diffusers")},
                                         std::pair{std::string("h3_small"), std::string("original")}));

TEST(GpuSyntheticWeights, DeviceFillEqualsTheHostWriterBitForBit) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto config = h3::config_preset("small");
  ASSERT_TRUE(config.ok());
  for (const auto& spec : h3::diffusers_schema(*config)) {
    auto host = h3::synthetic_tensor(spec, DType::kBF16, 42);
    ASSERT_TRUE(host.ok());
    auto arena = cuda::DeviceArena::create(host->nbytes() + 512);
    ASSERT_TRUE(arena.ok());
    auto dev = arena->alloc(spec.shape, host->dtype());
    ASSERT_TRUE(dev.ok());
    ASSERT_TRUE(h3::synthetic_weight_filler(42, nullptr)(spec, *dev).ok());
    auto back = cuda::download(*dev, nullptr);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(std::memcmp(back->data(), host->data(), host->nbytes()), 0) << spec.name;
  }
}

// The CUDA model's host time MLP is the k-ordered loops' result whatever CPU GEMM the build
// dispatches to (OpenBLAS chooses kernels by CPU and size): the device's latents must not depend on
// the host's BLAS (an OpenBLAS build's default sums in another order: the canonical denoise's
// checksums moved with it).
TEST(GpuH3TimeEmbedding, IsTheLoopsVariantWhateverTheBuildsCpuGemm) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto config = h3::config_preset("small");
  ASSERT_TRUE(config.ok());
  auto model = h3::CudaH3Transformer::create(*config, h3::synthetic_weight_filler(42, nullptr), 64, nullptr, {});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  h3::LinearWeights linear[2];
  for (const auto& spec : h3::diffusers_schema(*config)) {
    for (int i = 0; i < 2; ++i) {
      const std::string prefix = "time_embedder.linear_" + std::to_string(i + 1) + ".";
      if (spec.name != prefix + "weight" && spec.name != prefix + "bias") continue;
      auto host = h3::synthetic_tensor(spec, DType::kBF16, 42);
      ASSERT_TRUE(host.ok());
      (spec.name.ends_with("weight") ? linear[i].weight : linear[i].bias) = std::move(*host);
    }
  }
  ASSERT_TRUE(linear[1].weight.defined() && linear[1].bias.defined());
  const std::vector<float> timesteps = {999.0f, 731.25f, 3.5f};
  auto device_model = (*model)->time_embedding_host(timesteps);
  auto loops = h3::time_embedding(*config, linear[0], linear[1], timesteps, cpu::GemmVariant::kLoops);
  ASSERT_TRUE(device_model.ok() && loops.ok());
  ASSERT_EQ(device_model->nbytes(), loops->nbytes());
  EXPECT_EQ(std::memcmp(device_model->data(), loops->data(), loops->nbytes()), 0);
}

}  // namespace
}  // namespace vortex
