#include "text/cuda_qwen3_text_encoder.h"

#include <cmath>

#include "cuda/attention.h"
#include "cuda/elementwise.h"
#include "models/h3/tensor_views.h"

namespace vortex::text {
namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;  // cuBLASLt's
constexpr size_t kAlign = cuda::DeviceArena::kAlignment;

}  // namespace

Result<std::unique_ptr<CudaQwen3TextEncoder>> CudaQwen3TextEncoder::create(const Qwen3TextEncoder& host,
                                                                           cudaStream_t stream) {
  std::unique_ptr<CudaQwen3TextEncoder> enc(new CudaQwen3TextEncoder());
  enc->host_ = &host;
  enc->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(enc->upload_layers());
  VORTEX_ASSIGN_OR_RETURN(enc->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kAlign));
  VORTEX_ASSIGN_OR_RETURN(enc->gemm_, cuda::GemmRunner::create(enc->workspace_, kWorkspaceBytes));
  return enc;
}

Status CudaQwen3TextEncoder::upload_layers() {
  const Qwen3TextConfig& c = host_->config();
  const int64_t C = c.hidden, F = c.intermediate, D = c.head_dim;
  const int64_t q_rows = c.heads * D;
  const std::vector<Qwen3TextEncoder::Layer>& host_layers = host_->layers();

  const size_t bytes = host_->device_weight_bytes(kAlign);
  auto arena = cuda::DeviceArena::create(bytes + kAlign);
  if (!arena.ok()) {
    return arena.status().with_context("the text encoder's " + std::to_string(host_layers.size()) + " layers (" +
                                       host_->source() + ") on the device");
  }
  weights_ = std::move(*arena);

  const auto upload_as_is = [&](const Tensor& h) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor d, weights_.alloc(h.shape(), h.dtype()));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(h, d, stream_));
    return d;
  };
  // Linears go in as BF16 row ranges of a stacked weight.
  const auto stack = [&](int layer, std::initializer_list<std::pair<const char*, const Tensor*>> parts,
                         int64_t cols) -> Result<Tensor> {
    int64_t rows = 0;
    for (const auto& [name, t] : parts) {
      if (t->dtype() != DType::kBF16) {
        return unimplemented(host_->source() + ": layer " + std::to_string(layer) + " " + name + " is " +
                             dtype_name(t->dtype()) + "; the CUDA text encoder takes BF16 linear weights (the CPU "
                             "one takes both)");
      }
      rows += t->size(0);
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor d, weights_.alloc({rows, cols}, DType::kBF16));
    int64_t row = 0;
    for (const auto& [name, t] : parts) {
      VORTEX_ASSIGN_OR_RETURN(Tensor range, d.slice(0, row, row + t->size(0)));
      VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(*t, range, stream_));
      row += t->size(0);
    }
    return d;
  };

  layers_.clear();
  layers_.reserve(host_layers.size());
  for (size_t i = 0; i < host_layers.size(); ++i) {
    const Qwen3TextEncoder::Layer& h = host_layers[i];
    const int li = static_cast<int>(i);
    Layer l;
    VORTEX_ASSIGN_OR_RETURN(l.input_norm, upload_as_is(h.input_norm));
    VORTEX_ASSIGN_OR_RETURN(l.post_norm, upload_as_is(h.post_norm));
    VORTEX_ASSIGN_OR_RETURN(l.q_norm, upload_as_is(h.q_norm));
    VORTEX_ASSIGN_OR_RETURN(l.k_norm, upload_as_is(h.k_norm));
    VORTEX_ASSIGN_OR_RETURN(l.qkv, stack(li, {{"q_proj", &h.q}, {"k_proj", &h.k}, {"v_proj", &h.v}}, C));
    VORTEX_ASSIGN_OR_RETURN(l.o, stack(li, {{"o_proj", &h.o}}, q_rows));
    VORTEX_ASSIGN_OR_RETURN(l.up_gate, stack(li, {{"up_proj", &h.up}, {"gate_proj", &h.gate}}, C));
    VORTEX_ASSIGN_OR_RETURN(l.down, stack(li, {{"down_proj", &h.down}}, F));
    layers_.push_back(std::move(l));
  }
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status CudaQwen3TextEncoder::ensure_rope_rows(int64_t rows) {
  if (rope_cos_.defined() && rope_cos_.size(0) >= rows) return ok_status();
  const Qwen3TextEncoder::RopeTables tables = host_->rope_tables(rows);
  rope_cos_ = rope_sin_ = Tensor();
  rope_ = cuda::DeviceArena();  // the old tables' memory goes before the new ones are taken
  VORTEX_ASSIGN_OR_RETURN(rope_, cuda::DeviceArena::create(2 * cuda::DeviceArena::bytes_for(tables.cos.shape(), DType::kF32) + kAlign));
  VORTEX_ASSIGN_OR_RETURN(rope_cos_, rope_.alloc(tables.cos.shape(), DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(rope_sin_, rope_.alloc(tables.sin.shape(), DType::kF32));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(tables.cos, rope_cos_, stream_));
  return cuda::copy_to_device(tables.sin, rope_sin_, stream_);
}

Result<Tensor> CudaQwen3TextEncoder::encode(const std::vector<int32_t>& ids,
                                            const std::vector<VisionFeatures>& images) {
  const Qwen3TextConfig& c = host_->config();
  const int64_t N = static_cast<int64_t>(ids.size()), C = c.hidden, F = c.intermediate, D = c.head_dim;
  Qwen3TextEncoder::VisionRows vision;
  VORTEX_ASSIGN_OR_RETURN(Tensor embedded, host_->embed_presentation(ids, images, &vision));
  if (N == 0) return embedded;
  Tensor cos, sin;
  Qwen3TextEncoder::RopeTables presentation_rope;
  if (images.empty()) {
    VORTEX_RETURN_IF_ERROR(ensure_rope_rows(N));
    VORTEX_ASSIGN_OR_RETURN(cos, rope_cos_.slice(0, 0, N));
    VORTEX_ASSIGN_OR_RETURN(sin, rope_sin_.slice(0, 0, N));
  } else {
    presentation_rope = host_->rope_tables(vision.positions);
  }
  const int64_t pad_rows = images.empty() ? 0 : vision.embeds.size(0);
  std::vector<Tensor> deepstack(vision.deepstack.size());

  const int64_t q_width = c.heads * D, kv_width = c.kv_heads * D;
  const DType bf16 = DType::kBF16;
  Tensor x, normed, qkv, attn, branch, up_gate, act;
  struct Buffer {
    Tensor* tensor;
    Shape shape;
    DType dtype;
  };
  const Buffer buffers[] = {{&x, {N, C}, bf16},  // the residual stream
                            {&normed, {N, C}, bf16},
                            {&qkv, {N, q_width + 2 * kv_width}, bf16},
                            {&attn, {N, q_width}, bf16},
                            {&branch, {N, C}, bf16},
                            {&up_gate, {N, 2 * F}, bf16},  // [value | gate]
                            {&act, {N, F}, bf16}};
  std::vector<Buffer> presentation;  // this encode's RoPE tables and DeepStack features
  if (!images.empty()) {
    presentation.push_back({&cos, {N, D}, DType::kF32});
    presentation.push_back({&sin, {N, D}, DType::kF32});
    for (Tensor& d : deepstack) presentation.push_back({&d, {pad_rows, C}, bf16});
  }
  size_t needed = kAlign;
  for (const Buffer& b : buffers) needed += cuda::DeviceArena::bytes_for(b.shape, b.dtype);
  for (const Buffer& b : presentation) needed += cuda::DeviceArena::bytes_for(b.shape, b.dtype);
  if (activations_.capacity() < needed) {
    activations_ = cuda::DeviceArena();  // the old arena's memory goes before the new one is taken
    VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(needed));
  }
  activations_.release_to(0);
  for (const Buffer& b : buffers) {
    VORTEX_ASSIGN_OR_RETURN(*b.tensor, activations_.alloc(b.shape, b.dtype));
  }
  for (const Buffer& b : presentation) {
    VORTEX_ASSIGN_OR_RETURN(*b.tensor, activations_.alloc(b.shape, b.dtype));
  }
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(embedded, x, stream_));
  if (!images.empty()) {
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(presentation_rope.cos, cos, stream_));
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(presentation_rope.sin, sin, stream_));
    for (size_t i = 0; i < deepstack.size(); ++i) {
      VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(vision.deepstack[i], deepstack[i], stream_));
    }
  }

  const TensorView q = h3::heads_view(qkv, 0, c.heads, D);
  const TensorView k = h3::heads_view(qkv, q_width, c.kv_heads, D);
  const TensorView v = h3::heads_view(qkv, q_width + kv_width, c.kv_heads, D);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const auto rounding = cpu::RmsNormRounding::kBeforeWeight;
  cuda::GemmRunner& gemm = *gemm_;
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    const Layer& l = layers_[layer];
    const TensorView in_w = l.input_norm.view(), post_w = l.post_norm.view();
    const TensorView qn_w = l.q_norm.view(), kn_w = l.k_norm.view();
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &in_w, eps, normed.view(), stream_, rounding));
    VORTEX_RETURN_IF_ERROR(gemm.linear(normed.view(), l.qkv.view(), nullptr, qkv.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(q, &qn_w, eps, q, stream_, rounding));
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(k, &kn_w, eps, k, stream_, rounding));
    VORTEX_RETURN_IF_ERROR(cuda::apply_rope(q, cos.view(), sin.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::apply_rope(k, cos.view(), sin.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::causal_attention(q, k, v, h3::heads_view(attn, 0, c.heads, D), scale, stream_));
    VORTEX_RETURN_IF_ERROR(gemm.linear(attn.view(), l.o.view(), nullptr, branch.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::residual_add(x.view(), branch.view(), stream_));

    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &post_w, eps, normed.view(), stream_, rounding));
    VORTEX_RETURN_IF_ERROR(gemm.linear(normed.view(), l.up_gate.view(), nullptr, up_gate.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::swiglu(up_gate.view(), act.view(), stream_));
    VORTEX_RETURN_IF_ERROR(gemm.linear(act.view(), l.down.view(), nullptr, branch.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::residual_add(x.view(), branch.view(), stream_));
    if (host_->adds_deepstack_after(layer, vision)) {
      VORTEX_RETURN_IF_ERROR(Qwen3TextEncoder::for_each_run(
          vision, deepstack[layer], x,
          [&](const Tensor& from, const Tensor& to) { return cuda::residual_add(to.view(), from.view(), stream_); }));
    }
  }
  return cuda::download(x, stream_);
}

}  // namespace vortex::text
