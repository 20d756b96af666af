// The CUDA model's host copies for peers and tests (cuda_transformer.h: download_block_weights,
// download_rope, attention_inputs, download_adaln_rows): device state read back, nothing computed.
#include "models/h3/cuda_transformer.h"

namespace vortex::h3 {

Result<NamedTensors> CudaH3Transformer::download_block_weights(int index) const {
  if (index < 0 || index >= static_cast<int>(blocks_.size())) return invalid_argument("no block " + std::to_string(index));
  const Block& b = blocks_[index];
  const int64_t inner = config_.inner_dim();
  NamedTensors out;
  auto add = [&](const std::string& name, const Tensor& t) -> Status {
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(t, stream_));
    out.emplace_back(name, host);
    return ok_status();
  };
  VORTEX_RETURN_IF_ERROR(add("norm1.weight", b.norm1));
  VORTEX_RETURN_IF_ERROR(add("norm2.weight", b.norm2));
  VORTEX_RETURN_IF_ERROR(add("attn.norm_q.weight", b.norm_q));
  VORTEX_RETURN_IF_ERROR(add("attn.norm_k.weight", b.norm_k));
  const char* parts[3] = {"attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"};
  for (int i = 0; i < 3; ++i) {
    VORTEX_ASSIGN_OR_RETURN(Tensor rows, b.qkv.weight.slice(0, i * inner, (i + 1) * inner));
    VORTEX_RETURN_IF_ERROR(add(parts[i], rows));
  }
  VORTEX_RETURN_IF_ERROR(add("attn.to_out.0.weight", b.out.weight));
  VORTEX_RETURN_IF_ERROR(add("ff.net.0.proj.weight", b.fc1.weight));
  VORTEX_RETURN_IF_ERROR(add("ff.net.2.weight", b.fc2.weight));
  if (!b.adaln.weight.defined()) {
    return invalid_argument("download_block_weights: the AdaLN weights are not on the device (AdaLnTables::kPerRequest)");
  }
  VORTEX_RETURN_IF_ERROR(add("adaln_proj.linear.weight", b.adaln.weight));
  VORTEX_RETURN_IF_ERROR(add("adaln_proj.linear.bias", b.adaln.bias));
  return out;
}

Result<Tensor> CudaH3Transformer::download_rope(bool cos) const {
  if (!layout_) return invalid_argument("no prepared request");
  VORTEX_ASSIGN_OR_RETURN(Tensor t, (cos ? rope_cos_ : rope_sin_).slice(0, 0, layout_->num_rows));
  return cuda::download(t, stream_);
}

Result<Tensor> CudaH3Transformer::attention_inputs() const {
  if (!layout_) return invalid_argument("attention_inputs before prepare");
  if (sequence_parallel_) {
    return invalid_argument("attention_inputs: a sequence-parallel rank holds only its own rows' q/k/v");
  }
  if (!keep_attention_inputs_) {
    return invalid_argument(
        "attention_inputs needs CudaModelOptions::keep_attention_inputs (the FFN reuses the q/k/v memory otherwise)");
  }
  return work_.qkv.slice(0, 0, layout_->num_rows);
}

Result<Tensor> CudaH3Transformer::download_adaln_rows() const {
  if (!layout_) return invalid_argument("no prepared request");
  VORTEX_ASSIGN_OR_RETURN(Tensor t, adaln_rows_.slice(0, 0, layout_->num_rows));
  return cuda::download(t, stream_);
}

}  // namespace vortex::h3
