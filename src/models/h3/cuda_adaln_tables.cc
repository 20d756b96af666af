// AdaLnTables::kPerRequest (cuda_transformer.h): the modulation tables of a request's whole
// schedule, computed once in plan_steps() so that no AdaLN weight stays on the device.
//
// A block's table for one step is linear(silu(temb(t)), W_adaln) with T rows, one per distinct
// timestep. The per-step path computes it from resident weights right before the block; here the
// same GemmRunner call (same shapes, bias epilogue, 256-byte aligned operands, hence the same
// cuBLASLt algorithm) runs per (block, step) with the block's weights filled into a staging buffer,
// so the tables are bitwise those of the per-step path (tests/gpu/test_gpu_h3_adaln_tables.cc).
// Size: steps x T x 18C bf16 per block, 232 MB for the canonical 12 steps of 2 timesteps against
// 26 GB of weights. silu(temb) of every step is kept too, so a step copies what it needs instead of
// running the time MLP on the host again.
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "models/h3/cuda_transformer.h"

namespace vortex::h3 {

Status CudaH3Transformer::plan_steps(const std::vector<std::vector<float>>& step_timesteps) {
  if (adaln_tables_ != AdaLnTables::kPerRequest) return ok_status();
  const H3Config& c = config_;
  const int64_t C = c.hidden_size, TE = c.time_embed_dim;
  size_t bytes = 4096;
  for (size_t s = 0; s < step_timesteps.size(); ++s) {
    const int64_t T = static_cast<int64_t>(step_timesteps[s].size());
    if (T < 1 || T > kMaxTimesteps) {
      return invalid_argument("plan_steps: step " + std::to_string(s) + " has " + std::to_string(T) +
                              " distinct timesteps (expected 1.." + std::to_string(kMaxTimesteps) + ")");
    }
    bytes += static_cast<size_t>(T * TE * 2 + 256) + c.num_layers * static_cast<size_t>(T * 18 * C * 2 + 256);
  }
  planned_.clear();
  planned_arena_ = cuda::DeviceArena();
  VORTEX_ASSIGN_OR_RETURN(planned_arena_, cuda::DeviceArena::create(bytes));

  // silu(temb) per step: the AdaLN GEMMs below read it, and each step's output norm.
  for (const std::vector<float>& timesteps : step_timesteps) {
    PlannedStep step;
    step.timesteps = timesteps;
    VORTEX_ASSIGN_OR_RETURN(Tensor silu_bf16, silu_time_embedding(timesteps));
    VORTEX_ASSIGN_OR_RETURN(step.silu, planned_arena_.alloc(silu_bf16.shape(), DType::kBF16));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(silu_bf16, step.silu, stream_));
    planned_.push_back(std::move(step));
  }

  // One block's AdaLN weights at a time, in memory the step loop is not using now: the shared
  // attention/FFN region when it is large enough, else a staging arena of their own.
  const std::vector<TensorSpec> schema = diffusers_schema(c);
  std::unordered_map<std::string, const TensorSpec*> specs;
  for (const auto& spec : schema) specs[spec.name] = &spec;
  const size_t staging_bytes = static_cast<size_t>(18 * C * TE + 18 * C) * 2 + 1024;
  cuda::DeviceArena staging;
  if (work_.fc1.nbytes() >= staging_bytes &&
      reinterpret_cast<uintptr_t>(work_.fc1.data()) % cuda::DeviceArena::kAlignment == 0) {
    VORTEX_ASSIGN_OR_RETURN(staging, cuda::DeviceArena::within(work_.fc1));
  } else {
    VORTEX_ASSIGN_OR_RETURN(staging, cuda::DeviceArena::create(staging_bytes));
  }
  for (int b = 0; b < c.num_layers; ++b) {
    const std::string prefix = "transformer_blocks." + std::to_string(b) + ".adaln_proj.linear.";
    Linear adaln;
    for (auto [name, target] : {std::pair{"weight", &adaln.weight}, std::pair{"bias", &adaln.bias}}) {
      const TensorSpec& spec = *specs.at(prefix + name);
      VORTEX_ASSIGN_OR_RETURN(*target, staging.alloc(spec.shape, spec.fp32_island ? DType::kF32 : DType::kBF16));
      VORTEX_RETURN_IF_ERROR(filler_(spec, *target).with_context("plan_steps: " + spec.name));
    }
    for (PlannedStep& step : planned_) {
      VORTEX_ASSIGN_OR_RETURN(Tensor table, planned_arena_.alloc({step.silu.size(0), 18 * C}, DType::kBF16));
      VORTEX_RETURN_IF_ERROR(linear(adaln, step.silu, table));
      step.tables.push_back(std::move(table));
    }
    // The next block's weights overwrite the staging memory: these GEMMs must have read it.
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    staging.release_to(0);
  }
  return filler_.finish().with_context("plan_steps");
}

Status CudaH3Transformer::select_planned_step(const std::vector<float>& timesteps, const Tensor& silu) {
  const auto it = std::find_if(planned_.begin(), planned_.end(),
                               [&](const PlannedStep& p) { return p.timesteps == timesteps; });
  if (it == planned_.end()) {
    std::string values;
    for (float t : timesteps) values += (values.empty() ? "" : ", ") + std::to_string(t);
    return invalid_argument("timesteps {" + values + "} were not planned: with AdaLN tables per request, " +
                            "plan_steps() must list every step's timesteps before the forwards");
  }
  VORTEX_CUDA_CHECK(
      cudaMemcpyAsync(silu.data(), it->silu.data(), it->silu.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  for (size_t b = 0; b < it->tables.size(); ++b) {
    VORTEX_ASSIGN_OR_RETURN(Tensor dst, block_tables_[b].slice(0, 0, it->tables[b].size(0)));
    VORTEX_CUDA_CHECK(cudaMemcpyAsync(dst.data(), it->tables[b].data(), it->tables[b].nbytes(),
                                      cudaMemcpyDeviceToDevice, stream_));
  }
  return ok_status();
}

}  // namespace vortex::h3
