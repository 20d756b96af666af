// A LoRA-merged model on the GPU: the weights merge on the host (models/h3/lora.h) and upload like
// a checkpoint's; its forward against the reference's fp32 forward of the merged model and against
// the CPU program on the same merged weights.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "h3_golden_util.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/lora.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

using test::golden_path;
using test::must;

TEST(GpuH3Lora, StackedAdaptersMatchTheReferenceAndTheCpuProgram) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config config = must(h3::config_from_file(golden_path("h3_lora/config.json")));
  h3::NamedTensors tensors = must(h3::read_all(must(ShardedCheckpoint::open(golden_path("h3_lora/base.safetensors")))));
  std::vector<h3::LoraAdapter> adapters;
  for (const char* name : {"kohya_original", "diffusers_metadata_alpha", "diffsynth"}) {
    adapters.push_back(must(h3::read_lora(golden_path(std::string("h3_lora/") + name + ".safetensors"), config)));
  }
  must(h3::merge_loras(tensors, {{&adapters[0], 0.5}, {&adapters[1], 1.0}, {&adapters[2], -0.75}}, DType::kBF16));
  const auto expected = must(SafetensorsFile::open(golden_path("h3_lora/expected.safetensors")));
  const test::GoldenCase golden = must(test::read_golden_case(expected));

  auto gpu =
      must(h3::CudaH3Transformer::create(config, h3::host_weight_filler(tensors, nullptr), golden.layout.num_rows));
  must(gpu->prepare(golden.layout, golden.text_states));
  const h3::StepOutputs out = must(gpu->forward(golden.step));

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

}  // namespace
}  // namespace vortex
