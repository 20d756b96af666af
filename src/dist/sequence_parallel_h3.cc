#include "dist/sequence_parallel_h3.h"

#include "models/h3/cuda_lora_merge.h"

namespace vortex::dist {

Result<std::unique_ptr<SequenceParallelH3>> SequenceParallelH3::create(
    const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for, int64_t max_rows,
    const std::vector<int>& devices, h3::CudaModelOptions options) {
  // Before the communicators are made (they take seconds): the count the group overload checks too.
  if (devices.empty() || config.num_attention_heads % static_cast<int64_t>(devices.size()) != 0) {
    return invalid_argument("--devices: " + std::to_string(devices.size()) + " GPUs do not divide the model's " +
                            std::to_string(config.num_attention_heads) + " attention heads");
  }
  VORTEX_ASSIGN_OR_RETURN(auto group, LocalGpuGroup::create(devices));
  return create(config, filler_for, max_rows, std::move(group), options);
}

Result<std::unique_ptr<SequenceParallelH3>> SequenceParallelH3::create(
    const h3::H3Config& config, const std::function<h3::WeightFiller(cudaStream_t)>& filler_for, int64_t max_rows,
    std::unique_ptr<LocalGpuGroup> group, h3::CudaModelOptions options) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  if (config.num_attention_heads % group->size() != 0) {
    return invalid_argument(std::to_string(group->size()) + " ranks do not divide the model's " +
                            std::to_string(config.num_attention_heads) + " attention heads");
  }
  if (group->on_one_device()) options.cuda_graphs = false;
  std::unique_ptr<SequenceParallelH3> sp(new SequenceParallelH3());
  sp->config_ = config;
  sp->group_ = std::move(group);
  sp->ranks_.resize(static_cast<size_t>(sp->group_->size()));
  VORTEX_RETURN_IF_ERROR(sp->group_->run_ranks([&](int rank) -> Status {
    Rank& r = sp->ranks_[rank];
    VORTEX_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    VORTEX_ASSIGN_OR_RETURN(r.attention,
                            UlyssesAttention::create(*sp->group_, rank, max_rows, config.num_attention_heads,
                                                     config.attention_head_dim));
    h3::CudaModelOptions mine = options;
    mine.sequence_parallel = r.attention.get();
    VORTEX_ASSIGN_OR_RETURN(r.model, h3::CudaH3Transformer::create(config, filler_for(r.stream), max_rows, r.stream, mine));
    return ok_status();
  }));
  return sp;
}

SequenceParallelH3::~SequenceParallelH3() {
  // Each rank's memory and stream are freed with its device current.
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    if (cudaSetDevice(group_->device(static_cast<int>(rank))) != cudaSuccess) continue;
    Rank& r = ranks_[rank];
    r.model.reset();
    r.attention.reset();
    if (r.stream != nullptr) cudaStreamDestroy(r.stream);
  }
}

Status SequenceParallelH3::prepare(const h3::PackedLayout& layout, const Tensor& text_states) {
  return group_->run_ranks([&](int rank) { return ranks_[rank].model->prepare(layout, text_states); });
}

Status SequenceParallelH3::plan_steps(const std::vector<std::vector<float>>& step_timesteps) {
  return group_->run_ranks([&](int rank) { return ranks_[rank].model->plan_steps(step_timesteps); });
}

Result<h3::StepOutputs> SequenceParallelH3::step(const h3::StepInputs& inputs) {
  std::vector<h3::StepOutputs> outputs(ranks_.size());
  VORTEX_RETURN_IF_ERROR(group_->run_ranks([&](int rank) -> Status {
    VORTEX_ASSIGN_OR_RETURN(outputs[rank], ranks_[rank].model->forward(inputs));
    return ok_status();
  }));
  return std::move(outputs[0]);
}

Status SequenceParallelH3::merge_adapters(const h3::HostWeights& base, std::shared_ptr<const h3::LoraStack> loras,
                                          DType merge_dtype, const std::set<std::string>& names) {
  VORTEX_ASSIGN_OR_RETURN(const bool on_device, h3::lora_merge_on_device());
  if (on_device) {
    return group_->run_ranks(
        [&](int rank) { return ranks_[rank].model->merge_adapters(base, loras, merge_dtype, names); });
  }
  // Merged once on the host for every rank.
  VORTEX_ASSIGN_OR_RETURN(h3::NamedTensors merged, base.all());
  VORTEX_RETURN_IF_ERROR(h3::merge_loras(merged, loras->applications(), merge_dtype));
  return group_->run_ranks([&](int rank) {
    return ranks_[rank].model->refill_weights(h3::host_weight_filler(merged, ranks_[rank].stream), names);
  });
}

void SequenceParallelH3::set_cuda_graphs(bool on) {
  for (Rank& r : ranks_) r.model->set_cuda_graphs(on && !group_->on_one_device());
}

}  // namespace vortex::dist
