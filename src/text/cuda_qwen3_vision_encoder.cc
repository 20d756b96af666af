#include "text/cuda_qwen3_vision_encoder.h"

#include <cmath>
#include <string>

#include "cuda/attention.h"
#include "cuda/elementwise.h"
#include "cuda/vae_layer_norm.h"
#include "cuda/vision_ops.h"
#include "models/h3/tensor_views.h"

namespace vortex::text {
namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;  // cuBLASLt's
constexpr size_t kAlign = cuda::DeviceArena::kAlignment;

// Device bytes of the host tower's weights as this class keeps them (linears bf16, norms fp32).
size_t weight_bytes_of(const Qwen3VisionEncoder& host) {
  size_t bytes = 0;
  const auto linear = [&](const Tensor& w, const Tensor& b) {
    bytes += cuda::DeviceArena::bytes_for(w.shape(), DType::kBF16) + cuda::DeviceArena::bytes_for(b.shape(), DType::kBF16);
  };
  const auto norm = [&](const Tensor& w, const Tensor& b) {
    bytes += cuda::DeviceArena::bytes_for(w.shape(), DType::kF32) + cuda::DeviceArena::bytes_for(b.shape(), DType::kF32);
  };
  const auto merger = [&](const Qwen3VisionEncoder::Merger& m) {
    norm(m.norm_w, m.norm_b);
    linear(m.fc1_w, m.fc1_b);
    linear(m.fc2_w, m.fc2_b);
  };
  linear(host.patch_weight(), host.patch_bias());
  for (const Qwen3VisionEncoder::Block& b : host.blocks()) {
    norm(b.norm1_w, b.norm1_b);
    norm(b.norm2_w, b.norm2_b);
    linear(b.qkv_w, b.qkv_b);
    linear(b.proj_w, b.proj_b);
    linear(b.fc1_w, b.fc1_b);
    linear(b.fc2_w, b.fc2_b);
  }
  merger(host.merger());
  for (const Qwen3VisionEncoder::Merger& m : host.deepstack_mergers()) merger(m);
  return bytes;
}

}  // namespace

Result<std::unique_ptr<CudaQwen3VisionEncoder>> CudaQwen3VisionEncoder::create(const Qwen3VisionEncoder& host,
                                                                               cudaStream_t stream) {
  std::unique_ptr<CudaQwen3VisionEncoder> enc(new CudaQwen3VisionEncoder());
  enc->host_ = &host;
  enc->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(enc->upload());
  VORTEX_ASSIGN_OR_RETURN(enc->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kAlign));
  VORTEX_ASSIGN_OR_RETURN(enc->gemm_, cuda::GemmRunner::create(enc->workspace_, kWorkspaceBytes));
  return enc;
}

Result<CudaQwen3VisionEncoder::Linear> CudaQwen3VisionEncoder::upload_linear(const Tensor& w, const Tensor& b,
                                                                             const std::string& name) {
  if (w.dtype() != DType::kBF16 || b.dtype() != DType::kBF16) {
    return unimplemented("vision tower " + name + " is " + dtype_name(w.dtype()) + " / " + dtype_name(b.dtype()) +
                         "; the CUDA vision tower takes BF16 linears (the CPU one takes both)");
  }
  Linear l;
  VORTEX_ASSIGN_OR_RETURN(l.w, weights_.alloc(w.shape(), DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(l.b, weights_.alloc(b.shape(), DType::kBF16));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(w, l.w, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(b, l.b, stream_));
  return l;
}

Result<CudaQwen3VisionEncoder::Norm> CudaQwen3VisionEncoder::upload_norm(const Tensor& w, const Tensor& b) {
  // cpu::layer_norm reads its weights as fp32, which widening keeps exactly.
  Norm n;
  VORTEX_ASSIGN_OR_RETURN(const Tensor w32, w.to(DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(const Tensor b32, b.to(DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(n.w, weights_.alloc(w.shape(), DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(n.b, weights_.alloc(b.shape(), DType::kF32));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(w32, n.w, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(b32, n.b, stream_));
  // The widened host copies go out of scope: finish reading them first.
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return n;
}

Result<CudaQwen3VisionEncoder::Merger> CudaQwen3VisionEncoder::upload_merger(const Qwen3VisionEncoder::Merger& m,
                                                                             const std::string& name) {
  Merger d;
  VORTEX_ASSIGN_OR_RETURN(d.norm, upload_norm(m.norm_w, m.norm_b));
  VORTEX_ASSIGN_OR_RETURN(d.fc1, upload_linear(m.fc1_w, m.fc1_b, name + ".linear_fc1"));
  VORTEX_ASSIGN_OR_RETURN(d.fc2, upload_linear(m.fc2_w, m.fc2_b, name + ".linear_fc2"));
  d.norm_after_shuffle = m.norm_after_shuffle;
  return d;
}

Status CudaQwen3VisionEncoder::upload() {
  auto arena = cuda::DeviceArena::create(weight_bytes_of(*host_) + kAlign);
  if (!arena.ok()) return arena.status().with_context("the vision tower's weights on the device");
  weights_ = std::move(*arena);
  VORTEX_ASSIGN_OR_RETURN(patch_, upload_linear(host_->patch_weight(), host_->patch_bias(), "patch_embed"));
  blocks_.clear();
  for (size_t i = 0; i < host_->blocks().size(); ++i) {
    const Qwen3VisionEncoder::Block& h = host_->blocks()[i];
    const std::string name = "blocks." + std::to_string(i);
    Block b;
    VORTEX_ASSIGN_OR_RETURN(b.norm1, upload_norm(h.norm1_w, h.norm1_b));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, upload_norm(h.norm2_w, h.norm2_b));
    VORTEX_ASSIGN_OR_RETURN(b.qkv, upload_linear(h.qkv_w, h.qkv_b, name + ".attn.qkv"));
    VORTEX_ASSIGN_OR_RETURN(b.proj, upload_linear(h.proj_w, h.proj_b, name + ".attn.proj"));
    VORTEX_ASSIGN_OR_RETURN(b.fc1, upload_linear(h.fc1_w, h.fc1_b, name + ".mlp.linear_fc1"));
    VORTEX_ASSIGN_OR_RETURN(b.fc2, upload_linear(h.fc2_w, h.fc2_b, name + ".mlp.linear_fc2"));
    blocks_.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(merger_, upload_merger(host_->merger(), "merger"));
  deepstack_.clear();
  for (size_t j = 0; j < host_->deepstack_mergers().size(); ++j) {
    VORTEX_ASSIGN_OR_RETURN(Merger m,
                            upload_merger(host_->deepstack_mergers()[j], "deepstack_merger_list." + std::to_string(j)));
    deepstack_.push_back(std::move(m));
  }
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

Status CudaQwen3VisionEncoder::merge(const Merger& m, const Tensor& x, const Tensor& normed, const Tensor& hidden,
                                     const Tensor& out) {
  const int64_t N = x.size(0), C = x.size(1), group = host_->config().merge * host_->config().merge;
  const Shape shuffled{N / group, C * group};
  VORTEX_ASSIGN_OR_RETURN(const Tensor normed_blocks, normed.reshape(shuffled));
  if (m.norm_after_shuffle) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor x_blocks, x.reshape(shuffled));
    VORTEX_RETURN_IF_ERROR(
        cuda::layer_norm(x_blocks.view(), m.norm.w.view(), m.norm.b.view(), kVisionNormEps, normed_blocks.view(), stream_));
  } else {
    VORTEX_RETURN_IF_ERROR(cuda::layer_norm(x.view(), m.norm.w.view(), m.norm.b.view(), kVisionNormEps, normed.view(), stream_));
  }
  const TensorView b1 = m.fc1.b.view(), b2 = m.fc2.b.view();
  VORTEX_RETURN_IF_ERROR(gemm_->linear(normed_blocks.view(), m.fc1.w.view(), &b1, hidden.view(), stream_));
  VORTEX_RETURN_IF_ERROR(cuda::gelu(hidden.view(), hidden.view(), cpu::GeluApproximation::kErf, stream_));
  return gemm_->linear(hidden.view(), m.fc2.w.view(), &b2, out.view(), stream_);
}

Status CudaQwen3VisionEncoder::ensure_grid_tables(const VisionGrid& grid) {
  if (pos_.defined() && tables_grid_.height == grid.height && tables_grid_.width == grid.width &&
      tables_grid_.merge == grid.merge) {
    return ok_status();
  }
  VORTEX_ASSIGN_OR_RETURN(const Tensor pos, host_->position_rows(grid));
  const Qwen3VisionEncoder::RopeTables rope = host_->rope_tables(grid);
  pos_ = cos_ = sin_ = Tensor();
  grid_tables_ = cuda::DeviceArena();  // the old grid's memory goes before the new one is taken
  VORTEX_ASSIGN_OR_RETURN(grid_tables_, cuda::DeviceArena::create(cuda::DeviceArena::bytes_for(pos.shape(), DType::kBF16) +
                                                                  2 * cuda::DeviceArena::bytes_for(rope.cos.shape(), DType::kF32) +
                                                                  kAlign));
  VORTEX_ASSIGN_OR_RETURN(pos_, grid_tables_.alloc(pos.shape(), DType::kBF16));
  VORTEX_ASSIGN_OR_RETURN(cos_, grid_tables_.alloc(rope.cos.shape(), DType::kF32));
  VORTEX_ASSIGN_OR_RETURN(sin_, grid_tables_.alloc(rope.sin.shape(), DType::kF32));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(pos, pos_, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(rope.cos, cos_, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(rope.sin, sin_, stream_));
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host tables go out of scope
  tables_grid_ = grid;
  return ok_status();
}

Result<VisionFeatures> CudaQwen3VisionEncoder::encode(const Tensor& patches, const VisionGrid& grid) {
  const Qwen3VisionConfig& c = host_->config();
  VORTEX_RETURN_IF_ERROR(host_->check_patches(patches, grid));
  const int64_t N = grid.patches(), C = c.hidden, F = c.intermediate, D = c.head_dim(), H = c.heads;
  const int64_t group = c.merge * c.merge, tokens = N / group;
  // Runs one stage inside its profiler section (a no-op bracket without a profiler).
  const auto stage = [&](const char* name, const auto& op) -> Status {
    const cuda::SectionScope scope(profiler_, name, stream_);
    return op();
  };
  Tensor pixels_host;
  VORTEX_RETURN_IF_ERROR(stage("pixels to bf16 (host)", [&]() -> Status {
    VORTEX_ASSIGN_OR_RETURN(pixels_host, patches.to(DType::kBF16));  // the pipeline feeds bf16 pixels
    return ok_status();
  }));
  VORTEX_RETURN_IF_ERROR(stage("grid tables", [&] { return ensure_grid_tables(grid); }));
  const Tensor &pos = pos_, &cos = cos_, &sin = sin_;

  const DType bf16 = DType::kBF16;
  Tensor pixels, x, normed, qkv, attn, branch, hidden, merge_hidden, out;
  struct Buffer {
    Tensor* tensor;
    Shape shape;
    DType dtype;
  };
  const Buffer buffers[] = {{&pixels, {N, c.patch_values()}, bf16},
                            {&x, {N, C}, bf16},  // the residual stream
                            {&normed, {N, C}, bf16},
                            {&qkv, {N, 3 * C}, bf16},
                            {&attn, {N, C}, bf16},
                            {&branch, {N, C}, bf16},
                            {&hidden, {N, F}, bf16},
                            {&merge_hidden, {tokens, group * C}, bf16},
                            {&out, {tokens, c.out_hidden}, bf16}};
  size_t needed = kAlign;
  for (const Buffer& b : buffers) needed += cuda::DeviceArena::bytes_for(b.shape, b.dtype);
  if (activations_.capacity() < needed) {
    activations_ = cuda::DeviceArena();  // the old arena's memory goes before the new one is taken
    VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(needed));
  }
  activations_.release_to(0);
  for (const Buffer& b : buffers) {
    VORTEX_ASSIGN_OR_RETURN(*b.tensor, activations_.alloc(b.shape, b.dtype));
  }
  VORTEX_RETURN_IF_ERROR(stage("pixels upload", [&] { return cuda::copy_to_device(pixels_host, pixels, stream_); }));

  cuda::GemmRunner& gemm = *gemm_;
  const TensorView patch_b = patch_.b.view();
  VORTEX_RETURN_IF_ERROR(stage("patch embed + positions", [&]() -> Status {
    VORTEX_RETURN_IF_ERROR(gemm.linear(pixels.view(), patch_.w.view(), &patch_b, x.view(), stream_));
    return cuda::residual_add(x.view(), pos.view(), stream_);
  }));

  VisionFeatures features;
  features.grid = grid;
  // A merger's output, downloaded: the main one or a DeepStack feature.
  const auto merge_and_download = [&](const Merger& m, Tensor* feature) -> Status {
    VORTEX_RETURN_IF_ERROR(stage("mergers", [&] { return merge(m, x, normed, merge_hidden, out); }));
    return stage("features download", [&]() -> Status {
      VORTEX_ASSIGN_OR_RETURN(*feature, cuda::download(out, stream_));
      return ok_status();
    });
  };
  const TensorView q = h3::heads_view(qkv, 0, H, D), k = h3::heads_view(qkv, C, H, D);
  const TensorView v = h3::heads_view(qkv, 2 * C, H, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& l = blocks_[i];
    const TensorView qkv_b = l.qkv.b.view(), proj_b = l.proj.b.view(), fc1_b = l.fc1.b.view(), fc2_b = l.fc2.b.view();
    VORTEX_RETURN_IF_ERROR(stage("layer norm", [&] {
      return cuda::layer_norm(x.view(), l.norm1.w.view(), l.norm1.b.view(), kVisionNormEps, normed.view(), stream_);
    }));
    VORTEX_RETURN_IF_ERROR(stage("qkv", [&] { return gemm.linear(normed.view(), l.qkv.w.view(), &qkv_b, qkv.view(), stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("rope", [&]() -> Status {
      VORTEX_RETURN_IF_ERROR(cuda::rope_widened(q, cos.view(), sin.view(), stream_));
      return cuda::rope_widened(k, cos.view(), sin.view(), stream_);
    }));
    VORTEX_RETURN_IF_ERROR(stage("attention", [&] { return cuda::attention(q, k, v, h3::heads_view(attn, 0, H, D), scale, stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("proj", [&] { return gemm.linear(attn.view(), l.proj.w.view(), &proj_b, branch.view(), stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("residual", [&] { return cuda::residual_add(x.view(), branch.view(), stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("layer norm", [&] {
      return cuda::layer_norm(x.view(), l.norm2.w.view(), l.norm2.b.view(), kVisionNormEps, normed.view(), stream_);
    }));
    VORTEX_RETURN_IF_ERROR(stage("fc1", [&] { return gemm.linear(normed.view(), l.fc1.w.view(), &fc1_b, hidden.view(), stream_); }));
    VORTEX_RETURN_IF_ERROR(
        stage("gelu", [&] { return cuda::gelu(hidden.view(), hidden.view(), cpu::GeluApproximation::kTanh, stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("fc2", [&] { return gemm.linear(hidden.view(), l.fc2.w.view(), &fc2_b, branch.view(), stream_); }));
    VORTEX_RETURN_IF_ERROR(stage("residual", [&] { return cuda::residual_add(x.view(), branch.view(), stream_); }));
    for (size_t j = 0; j < c.deepstack_layers.size(); ++j) {
      if (c.deepstack_layers[j] != static_cast<int64_t>(i)) continue;
      Tensor feature;
      VORTEX_RETURN_IF_ERROR(merge_and_download(deepstack_[j], &feature));
      features.deepstack.push_back(std::move(feature));
    }
  }
  VORTEX_RETURN_IF_ERROR(merge_and_download(merger_, &features.merged));
  return features;
}

Result<VisionFeatures> CudaQwen3VisionEncoder::encode_image(const Tensor& rgb) {
  VisionGrid grid;
  VORTEX_ASSIGN_OR_RETURN(const Tensor patches, host_->image_patches(rgb, &grid));
  return encode(patches, grid);
}

}  // namespace vortex::text
