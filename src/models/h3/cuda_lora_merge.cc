// The LoRA-merging weight filler (see cuda_lora_merge.h).
#include "models/h3/cuda_lora_merge.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/quote.h"
#include "cuda/lora_merge.h"
#include "cuda/runtime.h"
#include "models/h3/scaled_weights.h"

namespace vortex::h3 {

namespace {

// The DoRA zero-norm checks a filler's device merges left on the device: each DoRA weight's
// slots (one per term) in one device buffer, read back together by check(), in fill order, so
// that no weight waits for its own.
class PendingDoraChecks {
 public:
  // Room for `terms` more slots, after checking the pending ones when the buffer is full.
  Result<unsigned long long*> slots_for(int terms, cudaStream_t stream);
  // Weight `name`'s `terms` slots, the last slots_for gave.
  void add(const std::string& name, const std::vector<LoraTerm>& terms);
  // Waits for `stream` and returns the first weight's error, if any (dora_zero_norm_error).
  Status check(cudaStream_t stream);

 private:
  static constexpr int64_t kSlots = 256;  // 2 KB: read back early once 256 DoRA terms are pending
  struct Weight {
    std::string name;
    std::vector<const LoraModule*> modules;  // the weight's terms, in slot order
    int64_t first_slot;
  };
  cuda::DeviceArena arena_;
  Tensor slots_;  // I64 [kSlots]
  std::vector<Weight> weights_;
  int64_t used_ = 0;
};

Result<unsigned long long*> PendingDoraChecks::slots_for(int terms, cudaStream_t stream) {
  if (!slots_.defined()) {
    const size_t bytes = cuda::DeviceArena::bytes_for(Shape{kSlots}, DType::kI64);
    VORTEX_ASSIGN_OR_RETURN(arena_, cuda::DeviceArena::create(bytes));
    VORTEX_ASSIGN_OR_RETURN(slots_, arena_.alloc(Shape{kSlots}, DType::kI64));
  }
  if (used_ + terms > kSlots) VORTEX_RETURN_IF_ERROR(check(stream));
  return static_cast<unsigned long long*>(slots_.data()) + used_;
}

void PendingDoraChecks::add(const std::string& name, const std::vector<LoraTerm>& terms) {
  Weight w{name, {}, used_};
  for (const LoraTerm& t : terms) w.modules.push_back(t.module);
  used_ += static_cast<int64_t>(terms.size());
  weights_.push_back(std::move(w));
}

Status PendingDoraChecks::check(cudaStream_t stream) {
  if (weights_.empty()) return ok_status();
  const std::vector<Weight> weights = std::move(weights_);
  weights_.clear();
  const int64_t used = std::exchange(used_, 0);
  VORTEX_ASSIGN_OR_RETURN(const Tensor on_device, slots_.slice(0, 0, used));
  VORTEX_ASSIGN_OR_RETURN(const Tensor first_rows, cuda::download(on_device, stream));
  const auto* first = static_cast<const unsigned long long*>(first_rows.data());
  for (const Weight& w : weights) {
    for (size_t t = 0; t < w.modules.size(); ++t) {
      const unsigned long long row = first[w.first_slot + static_cast<int64_t>(t)];
      if (row != ~0ull) return dora_zero_norm_error(*w.modules[t], w.name, static_cast<int64_t>(row));
    }
  }
  return ok_status();
}

// The uploads of a merging filler on a stream of its own, so that one weight's transfers run while
// the caller's stream merges the weight before (on one stream the copy engine sat idle through every
// merge). Each fill's copies are joined into the caller's stream before it returns, so dst is ready
// in the caller's order as with one stream. The copies follow the caller's stream at the first fill
// of a batch (work queued before may still use dst's memory) and wherever a fill writes memory an
// earlier fill of the batch wrote (staging reused from one linear to the next, as the fp8 recipe's
// quantization and plan_steps' AdaLN tables reuse theirs, must be read first).
class CopyStream {
 public:
  CopyStream() = default;
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  ~CopyStream() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (copies_ != nullptr) cudaStreamDestroy(copies_);  // (its queued copies still run)
  }

  // The stream for the copies into `dst`, made to wait for `caller` where it must.
  Result<cudaStream_t> before_copies(const Tensor& dst, cudaStream_t caller) {
    if (copies_ == nullptr) {
      VORTEX_CUDA_CHECK(cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking));
      VORTEX_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    }
    const auto begin = reinterpret_cast<uintptr_t>(dst.data());
    const uintptr_t end = begin + dst.nbytes();
    const bool rewrites = std::any_of(written_.begin(), written_.end(),
                                      [&](const auto& range) { return begin < range.second && range.first < end; });
    if (!joined_ || rewrites) {
      VORTEX_CUDA_CHECK(cudaEventRecord(event_, caller));
      VORTEX_CUDA_CHECK(cudaStreamWaitEvent(copies_, event_));
      joined_ = true;
      written_.clear();  // everything written before is behind this wait
    }
    written_.emplace_back(begin, end);
    return copies_;
  }
  // `caller` waits for the copies queued so far.
  Status join(cudaStream_t caller) {
    if (copies_ == nullptr) return ok_status();
    VORTEX_CUDA_CHECK(cudaEventRecord(event_, copies_));
    VORTEX_CUDA_CHECK(cudaStreamWaitEvent(caller, event_));
    return ok_status();
  }
  // The next fill starts a new batch.
  void end_batch() {
    joined_ = false;
    written_.clear();
  }

 private:
  cudaStream_t copies_ = nullptr;
  cudaEvent_t event_ = nullptr;  // recorded and waited for at once, so one serves every join
  std::vector<std::pair<uintptr_t, uintptr_t>> written_;  // the batch's dst ranges since its last wait
  bool joined_ = false;
};

struct MergingFiller {
  HostWeights base;
  std::shared_ptr<const LoraStack> loras;
  std::map<std::string, std::vector<LoraTerm>> terms;  // per targeted linear
  DType merge_dtype;
  cudaStream_t stream;  // the caller's: the merges run here
  CopyStream copy_stream;
  std::optional<WeightFiller> upload;  // the base's tensors as they are, on the copy stream (from the first fill)
  // Tensors merged on the host, by name: computed once a linear (a filler streams AdaLN weights
  // again for every request).
  std::unordered_map<std::string, Tensor> host_merged;
  // The device merges' DoRA workspace, kept from one weight to the next until finish().
  Tensor dora_workspace;
  PendingDoraChecks dora_checks;

  Status fill(const TensorSpec& spec, const Tensor& dst);
  Status finish();
  Status write(const TensorSpec& spec, const Tensor& dst, cudaStream_t copies);
  Status merge_on_device(const TensorSpec& spec, const Tensor& stored, const Shape& shape,
                         const std::vector<LoraTerm>& terms, const Tensor& dst, cudaStream_t copies);
  Status merge_on_host(const std::string& name, const std::string& linear, const TensorSpec& spec, const Tensor& dst,
                       cudaStream_t copies);
};

bool device_takes(DType weight, DType merged, DType dst) {
  const bool widened = weight == DType::kF32 || weight == DType::kBF16 || weight == DType::kF16;
  // An F32 merge stored narrower is one rounding of the fp32 sum, as the kernel stores it.
  return widened && (dst == DType::kF32 || dst == DType::kBF16) && (merged == dst || merged == DType::kF32);
}

Status MergingFiller::fill(const TensorSpec& spec, const Tensor& dst) {
  VORTEX_ASSIGN_OR_RETURN(cudaStream_t copies, copy_stream.before_copies(dst, stream));
  if (!upload) upload = host_weight_filler(base, copies);
  const Status written = write(spec, dst, copies);
  const Status joined = copy_stream.join(stream);  // (after a failed write too: nothing left running apart)
  return written.ok() ? joined : written;
}

Status MergingFiller::write(const TensorSpec& spec, const Tensor& dst, cudaStream_t copies) {
  const std::string& name = spec.name;
  const bool weight = name.ends_with(".weight");
  if (!weight && !name.ends_with(".bias")) return (*upload)(spec, dst);
  const std::string linear = name.substr(0, name.size() - (weight ? 7 : 5));
  const auto it = terms.find(linear);
  if (it == terms.end()) return (*upload)(spec, dst);
  // The stored weight, or for a fused layer's part the fused weight and the part's shape: a part is
  // not gathered when it uploads from its rows (host_weight_filler).
  const auto rows = base.stored_rows(name);
  NamedTensors stored;
  if (!rows) {
    VORTEX_ASSIGN_OR_RETURN(stored, base.weight(name));
    if (stored.empty()) return (*upload)(spec, dst);  // (upload names the missing tensor)
  }
  const Tensor& host = rows ? rows->stored.front().second : stored.front().second;
  const Shape shape = rows ? rows->shape() : host.shape();
  const DType merged = is_fp32_island(name) ? DType::kF32 : merge_dtype;
  if (weight) {
    const bool dora_meets_bias = has_dora(it->second) && has_bias(it->second);
    const bool too_many = it->second.size() > static_cast<size_t>(cuda::kMaxLoraMergeTerms);
    // A quantized weight merges from its dequantization, written into dst first.
    const DType source = is_quantized_storage(host.dtype()) ? dst.dtype() : host.dtype();
    if (!dora_meets_bias && !too_many && device_takes(source, merged, dst.dtype())) {
      return merge_on_device(spec, host, shape, it->second, dst, copies);
    }
    return merge_on_host(name, linear, spec, dst, copies);
  }
  if (!has_bias(it->second)) return (*upload)(spec, dst);  // DoRA leaves the linear's own bias alone
  return merge_on_host(name, linear, spec, dst, copies);
}

// `stored` is the weight as stored (for a fused layer's part, the fused weight) and `shape` its
// stored shape (the part's).
Status MergingFiller::merge_on_device(const TensorSpec& spec, const Tensor& stored, const Shape& shape,
                                      const std::vector<LoraTerm>& terms, const Tensor& dst, cudaStream_t copies) {
  const std::string& name = spec.name;
  const bool quantized = is_quantized_storage(stored.dtype());
  if (!quantized && shape != dst.shape()) {
    return invalid_argument("tensor " + quote(name) + ": shape " + shape.to_string() + " but the config expects " +
                            dst.shape().to_string());
  }
  // (A quantized weight's shape is checked as it is dequantized into dst.)
  VORTEX_RETURN_IF_ERROR(check_lora_fits(terms, name, dst));
  // The factors, and the weight where it cannot be read in place (another dtype than dst's).
  const bool in_place = quantized || stored.dtype() == dst.dtype();
  size_t bytes = in_place ? 0 : cuda::DeviceArena::bytes_for(shape, stored.dtype());
  for (const LoraTerm& t : terms) {
    for (const Tensor* factor : {&t.module->up, &t.module->down, &t.module->magnitude}) {
      if (factor->defined()) bytes += cuda::DeviceArena::bytes_for(factor->shape(), DType::kF32);
    }
  }
  // Scratch and uploads in the copy stream's order, the merge in the caller's, the scratch freed
  // after it: the host goes on to the next weight while this one copies and merges (the staged
  // copies read the host bytes before they return).
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create_on_stream(bytes, copies, stream));
  // In place: the weight written into dst as it uploads (a quantized one dequantized there; a part
  // from its rows); otherwise into scratch in its own dtype.
  Tensor source = dst;
  if (in_place) {
    VORTEX_RETURN_IF_ERROR((*upload)(spec, dst));
  } else {
    VORTEX_ASSIGN_OR_RETURN(source, arena.alloc(shape, stored.dtype()));
    VORTEX_ASSIGN_OR_RETURN(const NamedTensors weight, base.weight(name));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(weight.front().second, source, copies));
  }
  std::vector<cuda::LoraMergeTerm> device_terms;
  for (const LoraTerm& t : terms) {
    const LoraModule& m = *t.module;
    cuda::LoraMergeTerm d;
    VORTEX_ASSIGN_OR_RETURN(const Tensor up, cuda::upload_staged(m.up, arena, copies));
    VORTEX_ASSIGN_OR_RETURN(const Tensor down, cuda::upload_staged(m.down, arena, copies));
    d.up = up.data_as<const float>();
    d.down = down.data_as<const float>();
    if (m.magnitude.defined()) {
      VORTEX_ASSIGN_OR_RETURN(const Tensor magnitude, cuda::upload_staged(m.magnitude, arena, copies));
      d.magnitude = magnitude.data_as<const float>();
    }
    d.rank = m.down.size(0);
    d.scale = t.scale;
    device_terms.push_back(d);
  }
  VORTEX_RETURN_IF_ERROR(copy_stream.join(stream));
  const size_t workspace_bytes = cuda::dora_workspace_bytes(dst.size(0), dst.size(1), device_terms);
  if (workspace_bytes == 0) return cuda::lora_merge(source, dst, device_terms, Tensor(), nullptr, stream);
  if (!dora_workspace.defined() || dora_workspace.nbytes() < workspace_bytes) {
    dora_workspace = Tensor();  // (freed in the stream's order, after the merges that used it)
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create_on_stream(workspace_bytes, stream));
    VORTEX_ASSIGN_OR_RETURN(dora_workspace, arena.alloc(Shape{static_cast<int64_t>(workspace_bytes)}, DType::kU8));
  }
  VORTEX_ASSIGN_OR_RETURN(unsigned long long* const zero_rows,
                          dora_checks.slots_for(static_cast<int>(terms.size()), stream));
  VORTEX_RETURN_IF_ERROR(cuda::lora_merge(source, dst, device_terms, dora_workspace, zero_rows, stream));
  dora_checks.add(name, terms);
  return ok_status();
}

Status MergingFiller::finish() {
  copy_stream.end_batch();
  dora_workspace = Tensor();
  return dora_checks.check(stream);
}

Status MergingFiller::merge_on_host(const std::string& name, const std::string& linear, const TensorSpec& spec,
                                    const Tensor& dst, cudaStream_t copies) {
  if (!host_merged.count(name)) {
    // Under DoRA the weight and the bias merge together (the bias needs the weight's factors).
    NamedTensors group;
    const bool whole_linear = has_dora(terms.at(linear));
    for (const std::string& part : {linear + ".weight", linear + ".bias"}) {
      if (part != name && !whole_linear) continue;
      VORTEX_ASSIGN_OR_RETURN(const NamedTensors stored, base.weight(part));  // (a weight with its side tensors)
      group.insert(group.end(), stored.begin(), stored.end());
    }
    // A quantized weight merges from its dequantization (into bf16, the fp32 islands F32), as
    // generate's host merge path dequantizes the whole model first.
    VORTEX_ASSIGN_OR_RETURN(group, dequantize_scaled_weights(group, DType::kBF16));
    VORTEX_RETURN_IF_ERROR(merge_loras(group, loras->applications(), merge_dtype));
    for (auto& [part, tensor] : group) host_merged[part] = std::move(tensor);
  }
  return write_host_weight({{name, host_merged.at(name)}}, spec, dst, copies);
}

}  // namespace

Result<bool> lora_merge_on_device() { return device_variant("VORTEX_VARIANT_LORA_MERGE"); }

WeightFiller lora_merging_filler(HostWeights base, std::shared_ptr<const LoraStack> loras, DType merge_dtype,
                                 cudaStream_t stream) {
  auto state = std::make_shared<MergingFiller>();
  state->base = base;
  state->terms = lora_terms_by_linear(loras->applications());
  state->loras = std::move(loras);
  state->merge_dtype = merge_dtype;
  state->stream = stream;
  return WeightFiller([state](const TensorSpec& spec, const Tensor& dst) { return state->fill(spec, dst); },
                      [state] { return state->finish(); });
}

}  // namespace vortex::h3
