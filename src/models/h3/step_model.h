// One sampling step's forward, whatever runs it: the loop in generate.h drives the CPU reference
// and the CUDA model through this interface.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "models/h3/layout.h"
#include "models/h3/lora.h"
#include "models/h3/transformer.h"
#include "models/h3/weights.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual const H3Config& config() const = 0;
  // Per request: the layout's tables and the refined text stream. `layout` must outlive the steps.
  virtual Status prepare(const PackedLayout& layout, const Tensor& text_states) = 0;
  // Per request, after prepare: each step's distinct timesteps, in order, for models that compute
  // their per-timestep tables up front. The default does nothing.
  virtual Status plan_steps(const std::vector<std::vector<float>>& step_timesteps) {
    (void)step_timesteps;
    return ok_status();
  }
  // Per step: host rows in, host velocities out.
  virtual Result<StepOutputs> step(const StepInputs& inputs) = 0;
  // Between requests: the weights named in `names` become those of `base` (host, diffusers names,
  // the whole model's weights before any adapter) with `loras` merged as merge_loras merges them in
  // `merge_dtype`, the same bits (a model that streams weights later reads them through `base` and
  // `loras`, which it keeps). Serve's per-request LoRA adapters. The CPU model is rebuilt by its
  // owner instead (its weights are packed at creation).
  virtual Status merge_adapters(const HostWeights& base, std::shared_ptr<const LoraStack> loras, DType merge_dtype,
                                const std::set<std::string>& names) {
    (void)base, (void)loras, (void)merge_dtype, (void)names;
    return unimplemented("this model cannot replace its weights in place");
  }
};

// The CPU reference behind the interface.
class CpuStepModel : public StepModel {
 public:
  explicit CpuStepModel(const H3Transformer& model) : model_(model) {}
  const H3Config& config() const override { return model_.config(); }
  Status prepare(const PackedLayout& layout, const Tensor& text_states) override {
    VORTEX_ASSIGN_OR_RETURN(request_, model_.prepare(layout, text_states));
    return ok_status();
  }
  Result<StepOutputs> step(const StepInputs& inputs) override { return model_.forward(request_, inputs); }

 private:
  const H3Transformer& model_;
  PreparedRequest request_;
};

}  // namespace vortex::h3
