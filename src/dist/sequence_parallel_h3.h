// The H3 transformer over the GPUs of this machine, sequence-parallel (DeepSpeed-Ulysses): one
// CudaH3Transformer per rank, each holding the whole model and running every transformer block
// on its range of the packed rows, with dist::UlyssesAttention moving heads between ranks around
// attention (models/h3/sequence_parallel.h says what crosses ranks). One StepModel for generate.h's
// loop: every call runs on all ranks at once; the velocities are rank 0's (every rank computes the
// same output heads over the gathered residual stream).
//
// The attention kernel sees every key and query of a head whatever the rank count, so attention is
// bit for bit the single-GPU one; the block linears run on fewer rows per GPU, where cuBLASLt may
// take another algorithm, so the result is compared to one GPU within a tolerance
// (tests/gpu/test_gpu_dist.cc states it). Either recipe and either attention mode: under fp8 each
// rank quantizes its rows' bf16 attention output in the one-GPU tiles' layout (ranks start at
// multiples of 128 rows where every rank gets 128); int8fp8 quantizes each head over all its rows
// after the gather, as on one GPU.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "dist/local_gpu_group.h"
#include "dist/ulysses.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/step_model.h"

namespace vortex::dist {

class SequenceParallelH3 : public h3::StepModel {
 public:
  // filler_for(stream): the weight filler a rank loads through (called on the rank's thread with
  // its device current). `options.sequence_parallel` is set per rank here.
  static Result<std::unique_ptr<SequenceParallelH3>> create(
      const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for, int64_t max_rows,
      const std::vector<int>& devices, h3::CudaModelOptions options);
  // The same on a group made by the caller (LocalGpuGroup::create_on_one_device: the whole program
  // on one GPU; CUDA graphs stay off there, since its exchanges synchronise on the host).
  static Result<std::unique_ptr<SequenceParallelH3>> create(
      const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for, int64_t max_rows,
      std::unique_ptr<LocalGpuGroup> group, h3::CudaModelOptions options);
  ~SequenceParallelH3() override;

  const h3::H3Config& config() const override { return config_; }
  Status prepare(const h3::PackedLayout& layout, const Tensor& text_states) override;
  Status plan_steps(const std::vector<std::vector<float>>& step_timesteps) override;
  Result<h3::StepOutputs> step(const h3::StepInputs& inputs) override;
  // Every rank merges and writes the named weights again on its GPU (CudaH3Transformer::merge_adapters).
  Status merge_adapters(const h3::HostWeights& base, std::shared_ptr<const h3::LoraStack> loras, DType merge_dtype,
                        const std::set<std::string>& names) override;

  int size() const { return group_->size(); }
  // Per rank: the model's weights and peak activations, and the exchange's buffers.
  size_t weight_bytes(int rank) const { return ranks_.at(rank).model->weight_bytes(); }
  size_t activation_peak_bytes(int rank) const { return ranks_.at(rank).model->activation_peak_bytes(); }
  size_t exchange_bytes(int rank) const { return ranks_.at(rank).attention->device_bytes(); }
  // Switches CudaModelOptions::cuda_graphs on every rank (a group on one device keeps them off).
  void set_cuda_graphs(bool on);

 private:
  struct Rank {
    cudaStream_t stream = nullptr;
    std::unique_ptr<UlyssesAttention> attention;
    std::unique_ptr<h3::CudaH3Transformer> model;
  };
  SequenceParallelH3() = default;

  h3::H3Config config_;
  std::unique_ptr<LocalGpuGroup> group_;
  std::vector<Rank> ranks_;
};

}  // namespace vortex::dist
