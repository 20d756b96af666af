// The video VAE decoder on the GPU (see cuda_video_vae.h): weights, the decode plan (chunks,
// tiles, the frames each chunk finishes), one tile's ViT decoder, and the chunk loop.
//
// Device memory of the canonical decode (latents [24, 37, 48, 84] -> 124 frames of 768 x 1344,
// release config, release tiling: 7 chunks of 7 latent frames, 4 x 7 tiles of 16 x 16 latents,
// 1,797 tokens per tile), from cuda_video_vae_memory (tests/gpu/test_gpu_video_vae.cc prints it):
//   bf16: weights 4.848 GB + activations 2.932 GB + cuBLASLt workspace 0.067 GB = 7.85 GB
//   f32:  weights 9.694 GB + activations 3.064 GB + workspace 0.067 GB          = 12.83 GB
// Activations: frames 1.54 GB (F32 [3, 124, 768, 1344]), decoded tiles of two chunks 1.23 GB
// (2 x 28 x 1,792 tokens x 3,072 values, F32), one tile's transformer activations 0.15 GB
// (bf16; 0.28 GB f32), latents 14 MB. Nothing else is allocated during a decode, so with the
// CUDA context (~0.5 GB) both modes fit a 24 GB device; the bound comes from decoding tile by
// tile and keeping only two chunks' tiles: a longer clip adds only its latents and frames.
#include "models/vae/cuda_video_vae.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <unordered_map>

#include "cuda/attention.h"
#include "cuda/elementwise.h"
#include "cuda/synthetic_fill.h"
#include "cuda/vae_attention_f32.h"
#include "cuda/vae_layer_norm.h"
#include "cuda/vae_video_layout.h"

namespace vortex::vae {

namespace {

constexpr size_t kWorkspaceBytes = 64u << 20;
constexpr size_t kSlack = cuda::DeviceArena::kAlignment;

// ---- the decode plan -----------------------------------------------------------------------------

struct ChunkPlan {
  int64_t t0 = 0, frames = 0;  // latent frames [t0, t0 + frames) decoded together
  cuda::VaeFrameSpan part;     // the chunk's own frames, cross-faded with the previous chunk's tail
  cuda::VaeFrameSpan tail;     // the last chunk's tail, kept as the final frames (count 0 otherwise)
};

struct DecodePlan {
  int64_t T = 0, H = 0, W = 0;               // latents
  int64_t height = 0, width = 0, frames = 0;  // output
  TileSplit rows, cols;                       // pixel tile layout
  int64_t tile_h = 0, tile_w = 0;             // latent extent of every tile
  int64_t max_chunk_frames = 0;
  std::vector<ChunkPlan> chunks;
  // row_tile [height] | col_tile [width] | row_start, row_blend [ny] | col_start, col_blend [nx]
  std::vector<int32_t> grid;

  int64_t tiles() const { return static_cast<int64_t>(rows.starts.size() * cols.starts.size()); }
  int64_t max_tile_tokens() const { return max_chunk_frames * tile_h * tile_w; }
};

// One axis of the tile grid: which tile's kept pixels cover each pixel (the last one pasted
// there, as decode_clip pastes in order), where each tile is pasted and how far it blends into
// the previous one.
Status plan_axis(const TileSplit& s, int64_t length, std::vector<int32_t>& map, std::vector<int32_t>& starts,
                 std::vector<int32_t>& blends) {
  const size_t n = s.starts.size();
  map.assign(static_cast<size_t>(length), -1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t keep = s.tile - (i + 1 < n ? s.overlaps[i] : 0);
    for (int64_t y = std::max<int64_t>(s.starts[i], 0); y < std::min(s.starts[i] + keep, length); ++y) {
      map[static_cast<size_t>(y)] = static_cast<int32_t>(i);
    }
    starts.push_back(static_cast<int32_t>(s.starts[i]));
    blends.push_back(i == 0 ? 0 : static_cast<int32_t>(std::min(s.tile, s.overlaps[i - 1])));
  }
  for (int64_t y = 0; y < length; ++y) {
    if (map[static_cast<size_t>(y)] < 0) {
      return internal_error("video tile layout leaves pixel " + std::to_string(y) + " uncovered");
    }
  }
  return ok_status();
}

Result<DecodePlan> plan_decode(const VideoVaeConfig& c, const Shape& shape, const VideoTiling& tiling) {
  VORTEX_RETURN_IF_ERROR(check_video_latent_shape(c, shape));
  VORTEX_RETURN_IF_ERROR(validate_tiling(tiling, c.spatial_ratio()));
  DecodePlan p;
  const int64_t r = c.spatial_ratio(), pt = c.temporal_ratio();
  p.T = shape[1], p.H = shape[2], p.W = shape[3];
  p.height = p.H * r, p.width = p.W * r;
  if (p.height > INT32_MAX || p.width > INT32_MAX) return invalid_argument("video latents: frame size too large");
  const auto split = [&](int64_t length, int tile, int overlap) {
    return tiling.enabled ? split_tiles(length, tile, overlap, r) : TileSplit{{0}, length, {}};
  };
  p.rows = split(p.height, tiling.tile_height, tiling.min_overlap_height);
  p.cols = split(p.width, tiling.tile_width, tiling.min_overlap_width);
  p.tile_h = p.rows.tile / r, p.tile_w = p.cols.tile / r;

  // decode_video's temporal layout: chunk i decodes latents [i·chunk, i·chunk + chunk + overlap);
  // of its frames, [pre, chunk·pt) are its own (the first frame_overlap cross-faded with the
  // previous chunk's tail) and [chunk·pt + pre, 2·chunk·pt) its tail.
  const int64_t chunk = c.tokens_chunk_size(), cf = chunk * pt, pre = c.frame_pre_padding();
  const bool drop = c.token_drop > 0;
  const int64_t count = (p.T + c.token_drop) / chunk - (drop ? 1 : 0);
  int64_t out = 0;
  for (int64_t i = 0; i < count; ++i) {
    ChunkPlan ch;
    ch.t0 = i * chunk;
    ch.frames = std::min(chunk + c.token_overlap(), p.T - ch.t0);
    const int64_t clip = ch.frames * pt;
    const int64_t n0 = std::min(cf, clip), own_start = std::min(pre, n0);
    const int64_t s1 = std::min(cf, clip), len1 = std::min(2 * cf, clip) - s1, tail_start = s1 + std::min(pre, len1);
    ch.part = {out, n0 - own_start, own_start, 0, 0};
    if (i > 0 && drop) {
      const ChunkPlan& prev = p.chunks.back();
      ch.part.blend = std::min({prev.tail.count, ch.part.count, static_cast<int64_t>(c.frame_overlap())});
      ch.part.prev_frame = prev.tail.src_frame + prev.tail.count - ch.part.blend;
    }
    out += ch.part.count;
    ch.tail = {out, drop ? len1 - std::min(pre, len1) : 0, tail_start, 0, 0};
    p.max_chunk_frames = std::max(p.max_chunk_frames, ch.frames);
    p.chunks.push_back(ch);
  }
  // Every chunk's tail but the last is consumed by the next chunk's cross-fade.
  for (size_t i = 0; i + 1 < p.chunks.size(); ++i) p.chunks[i].tail.count = 0;
  p.frames = out + (p.chunks.empty() ? 0 : p.chunks.back().tail.count);
  if (p.frames != c.decoded_frames(p.T)) {
    return internal_error("video decode plan gives " + std::to_string(p.frames) + " frames, the config " +
                          std::to_string(c.decoded_frames(p.T)));
  }
  std::vector<int32_t> row_map, col_map, row_start, row_blend, col_start, col_blend;
  VORTEX_RETURN_IF_ERROR(plan_axis(p.rows, p.height, row_map, row_start, row_blend));
  VORTEX_RETURN_IF_ERROR(plan_axis(p.cols, p.width, col_map, col_start, col_blend));
  for (const auto* part : {&row_map, &col_map, &row_start, &row_blend, &col_start, &col_blend}) {
    p.grid.insert(p.grid.end(), part->begin(), part->end());
  }
  return p;
}

// Every activation buffer of a plan, in allocation order: the latents, the frames, the decoded
// tiles of one or two chunks, the tile grid table, then one tile's buffers in the order of
// CudaVideoVae::TileBuffers.
constexpr size_t kActivationBuffers = 16;
using ActivationLayout = std::array<std::pair<Shape, DType>, kActivationBuffers>;

ActivationLayout activation_layout(const VideoVaeConfig& c, DType act, const DecodePlan& p) {
  const int64_t C = c.latent_channels, dim = c.decoder_dim(), F = c.decoder_ffn_dim(), rope = c.rope_dim();
  const int64_t N = p.max_tile_tokens(), total = N + c.decoder_num_register_tokens + 1;
  const int64_t tile_sets = p.chunks.size() > 1 ? 2 : 1;
  const DType f32 = DType::kF32;
  return {{{Shape{C, p.T, p.H, p.W}, f32},
           {Shape{c.out_channels, p.frames, p.height, p.width}, f32},
           {Shape{tile_sets, p.tiles() * N * c.patch_values()}, f32},
           {Shape{static_cast<int64_t>(p.grid.size())}, DType::kI32},
           {Shape{N, C}, f32},
           {Shape{N, C}, f32},
           {Shape{total, dim}, f32},
           {Shape{total, dim}, act},
           {Shape{total, 3 * dim}, act},
           {Shape{total, dim}, act},
           {Shape{total, dim}, act},
           {Shape{total, 2 * F}, act},
           {Shape{total, F}, act},
           {Shape{total, rope}, f32},
           {Shape{total, rope}, f32},
           {Shape{total}, DType::kI32}}};
}

size_t activation_bytes(const VideoVaeConfig& c, DType act, const DecodePlan& p) {
  size_t bytes = 0;
  for (const auto& [shape, dtype] : activation_layout(c, act, p)) bytes += cuda::DeviceArena::bytes_for(shape, dtype);
  return bytes;
}

// The decode-wide buffers (the first four of the layout).
struct ActivationSet {
  Tensor latents, frames, tiles, grid;
};

// ---- weights -------------------------------------------------------------------------------------

// The storage dtype of a state-dict tensor in `mode`: in bf16 mode the block linears (weights
// and biases: their outputs are bf16) and proj_out's weight; everything else F32.
DType storage_dtype(const std::string& name, DType mode) {
  if (mode != DType::kBF16) return DType::kF32;
  const bool block_linear = name.find(".attn.to_") != std::string::npos || name.find(".ff.net.") != std::string::npos;
  return block_linear || name == "decoder.proj_out.weight" ? DType::kBF16 : DType::kF32;
}

uint64_t name_stream(const std::string& name) {  // FNV-1a: one Philox stream per tensor name
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status synthetic_fill(const std::string& name, const Tensor& dst, uint64_t seed, cudaStream_t stream) {
  if (ends_with(name, "norm1.weight") || ends_with(name, "norm2.weight") || name == "decoder.norm_out.weight") {
    return cuda::fill_constant(dst, 1.0f, stream);
  }
  float scale = 0.1f;  // biases, residual scales, the LayerNorm bias
  if (ends_with(name, ".weight") && dst.rank() == 2) scale = 1.0f / std::sqrt(static_cast<float>(dst.size(1)));
  if (name == "decoder.register_tokens") scale = 0.5f;
  return cuda::fill_scaled_normal(dst, seed, name_stream(name), scale, stream);
}

// The assembled decoder's tensors under their state-dict names (host F32, working shapes).
std::unordered_map<std::string, Tensor> state_dict(const VideoVae& v) {
  std::unordered_map<std::string, Tensor> m;
  const auto linear = [&](const std::string& prefix, const VideoLinear& l) {
    m[prefix + ".weight"] = l.weight.weight();
    m[prefix + ".bias"] = l.bias;
  };
  linear("post_quant_conv", v.post_quant_conv);
  linear("decoder.proj_in", v.proj_in);
  m["decoder.register_tokens"] = v.register_tokens;
  for (size_t i = 0; i < v.blocks.size(); ++i) {
    const VideoVitBlock& b = v.blocks[i];
    const std::string p = "decoder.transformer_blocks." + std::to_string(i);
    m[p + ".scale1"] = b.scale1;
    m[p + ".scale2"] = b.scale2;
    m[p + ".norm1.weight"] = b.norm1;
    m[p + ".norm2.weight"] = b.norm2;
    linear(p + ".attn.to_q", b.to_q);
    linear(p + ".attn.to_k", b.to_k);
    linear(p + ".attn.to_v", b.to_v);
    linear(p + ".attn.to_out.0", b.to_out);
    linear(p + ".ff.net.0.proj", b.ff_in);
    linear(p + ".ff.net.2", b.ff_out);
  }
  m["decoder.norm_out.weight"] = v.norm_out_weight;
  m["decoder.norm_out.bias"] = v.norm_out_bias;
  linear("decoder.proj_out", v.proj_out);
  return m;
}

// A [N, H, D] view of columns [col, col + H·D) of a rank-2 device tensor.
TensorView heads(const Tensor& t, int64_t col, int64_t h, int64_t d) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + col * static_cast<int64_t>(dtype_size(t.dtype()));
  v.shape = Shape({t.size(0), h, d});
  v.strides = Shape({t.strides()[0], d, 1});
  return v;
}

// [dim] as the one-row [1, dim] table gated_residual reads.
TensorView as_row(const Tensor& t) {
  TensorView v = t.view();
  v.shape = Shape({1, t.size(0)});
  v.strides = Shape({t.size(0), 1});
  return v;
}

Result<Tensor> rows_of(const Tensor& t, int64_t n) { return t.slice(0, 0, n); }

}  // namespace

Result<CudaVideoVaeMemory> cuda_video_vae_memory(const VideoVaeConfig& config, DType dtype, const Shape& latent_shape,
                                                 const VideoTiling& tiling) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    return invalid_argument("video VAE on CUDA: dtype must be bf16 or f32");
  }
  VORTEX_ASSIGN_OR_RETURN(DecodePlan plan, plan_decode(config, latent_shape, tiling));
  CudaVideoVaeMemory m;
  for (const auto& spec : video_vae_decoder_schema(config)) {
    m.weights += cuda::DeviceArena::bytes_for(spec.shape, storage_dtype(spec.name, dtype));
  }
  m.activations = activation_bytes(config, dtype, plan);
  m.workspace = kWorkspaceBytes + kSlack;
  return m;
}

Result<std::unique_ptr<CudaVideoVae>> CudaVideoVae::create(const VideoVae& vae, const CudaVideoVaeOptions& options,
                                                           cudaStream_t stream) {
  const auto tensors = std::make_shared<std::unordered_map<std::string, Tensor>>(state_dict(vae));
  const Filler fill = [tensors, stream](const std::string& name, const Tensor& dst) -> Status {
    auto it = tensors->find(name);
    if (it == tensors->end() || !it->second.defined()) {
      return invalid_argument("video VAE: missing tensor '" + name + "'");
    }
    if (it->second.numel() != dst.numel()) {
      return invalid_argument("video VAE: tensor '" + name + "' " + it->second.describe() + " does not fit " +
                              dst.shape().to_string());
    }
    VORTEX_ASSIGN_OR_RETURN(Tensor host, it->second.contiguous().reshape(dst.shape()));
    if (host.dtype() != dst.dtype()) {
      VORTEX_ASSIGN_OR_RETURN(host, host.to(dst.dtype()));
    }
    return cuda::copy_to_device_staged(host, dst, stream);
  };
  VORTEX_ASSIGN_OR_RETURN(auto model, build(vae.config, options, stream, fill));
  model->tiling_ = vae.tiling;
  return model;
}

Result<std::unique_ptr<CudaVideoVae>> CudaVideoVae::create_synthetic(const VideoVaeConfig& config, uint64_t seed,
                                                                     const CudaVideoVaeOptions& options,
                                                                     cudaStream_t stream) {
  return build(config, options, stream, [seed, stream](const std::string& name, const Tensor& dst) {
    return synthetic_fill(name, dst, seed, stream);
  });
}

Result<std::unique_ptr<CudaVideoVae>> CudaVideoVae::build(const VideoVaeConfig& config,
                                                          const CudaVideoVaeOptions& options, cudaStream_t stream,
                                                          const Filler& fill) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF32) {
    return invalid_argument(std::string("video VAE on CUDA: dtype ") + dtype_name(options.dtype) + " (bf16 or f32)");
  }
  // bf16 GEMMs with a bias need 16-byte aligned rows (cuda/gemm.h); the release's dim is 2048.
  if (options.dtype == DType::kBF16 && config.decoder_dim() % 8 != 0) {
    return invalid_argument("video VAE on CUDA: bf16 needs a decoder width (heads · head_dim = " +
                            std::to_string(config.decoder_dim()) + ") that is a multiple of 8; use f32");
  }
  if (options.dtype == DType::kF32 && config.decoder_attention_head_dim > cuda::kAttentionF32MaxHeadDim) {
    return invalid_argument("video VAE on CUDA: f32 attention takes head dims up to " +
                            std::to_string(cuda::kAttentionF32MaxHeadDim) + ", this decoder's is " +
                            std::to_string(config.decoder_attention_head_dim));
  }
  std::unique_ptr<CudaVideoVae> model(new CudaVideoVae());
  model->config_ = config;
  model->dtype_ = options.dtype;
  model->stream_ = stream;
  VORTEX_RETURN_IF_ERROR(model->load_weights(fill));
  VORTEX_ASSIGN_OR_RETURN(model->workspace_, cuda::DeviceArena::create(kWorkspaceBytes + kSlack));
  VORTEX_ASSIGN_OR_RETURN(model->gemm_, cuda::GemmRunner::create(model->workspace_, kWorkspaceBytes));
  return model;
}

Status CudaVideoVae::load_weights(const Filler& fill) {
  const VideoVaeConfig& c = config_;
  const int64_t C = c.latent_channels, dim = c.decoder_dim(), F = c.decoder_ffn_dim();
  size_t bytes = 0;
  for (const auto& spec : video_vae_decoder_schema(c)) {
    bytes += cuda::DeviceArena::bytes_for(spec.shape, storage_dtype(spec.name, dtype_));
  }
  VORTEX_ASSIGN_OR_RETURN(weights_, cuda::DeviceArena::create(bytes + 16 * kSlack));

  auto tensor = [&](const std::string& name, const Shape& shape) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, weights_.alloc(shape, storage_dtype(name, dtype_)));
    VORTEX_RETURN_IF_ERROR(fill(name, t));
    named_.emplace_back(name, t);
    return t;
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) -> Result<Linear> {
    Linear l;
    VORTEX_ASSIGN_OR_RETURN(l.weight, tensor(prefix + ".weight", {out, in}));
    VORTEX_ASSIGN_OR_RETURN(l.bias, tensor(prefix + ".bias", {out}));
    return l;
  };
  VORTEX_ASSIGN_OR_RETURN(post_quant_conv_, linear("post_quant_conv", C, C));
  VORTEX_ASSIGN_OR_RETURN(proj_in_, linear("decoder.proj_in", dim, C));
  VORTEX_ASSIGN_OR_RETURN(register_tokens_, tensor("decoder.register_tokens", {c.decoder_num_register_tokens, dim}));
  for (int i = 0; i < c.decoder_num_layers; ++i) {
    const std::string p = "decoder.transformer_blocks." + std::to_string(i);
    Block b;
    VORTEX_ASSIGN_OR_RETURN(b.scale1, tensor(p + ".scale1", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.scale2, tensor(p + ".scale2", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.norm1, tensor(p + ".norm1.weight", {dim}));
    // One fused [3·dim, dim] QKV linear: to_q, to_k and to_v fill consecutive row ranges.
    const DType qkv_dtype = storage_dtype(p + ".attn.to_q.weight", dtype_);
    VORTEX_ASSIGN_OR_RETURN(b.qkv.weight, weights_.alloc({3 * dim, dim}, qkv_dtype));
    VORTEX_ASSIGN_OR_RETURN(b.qkv.bias, weights_.alloc({3 * dim}, qkv_dtype));
    const char* parts[3] = {".attn.to_q", ".attn.to_k", ".attn.to_v"};
    for (int k = 0; k < 3; ++k) {
      VORTEX_ASSIGN_OR_RETURN(Tensor w, b.qkv.weight.slice(0, k * dim, (k + 1) * dim));
      VORTEX_ASSIGN_OR_RETURN(Tensor bias, b.qkv.bias.slice(0, k * dim, (k + 1) * dim));
      const std::string prefix = p + parts[k];
      for (const auto& [name, dst] : {std::pair{prefix + ".weight", w}, std::pair{prefix + ".bias", bias}}) {
        VORTEX_RETURN_IF_ERROR(fill(name, dst));
        named_.emplace_back(name, dst);
      }
    }
    VORTEX_ASSIGN_OR_RETURN(b.out, linear(p + ".attn.to_out.0", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, tensor(p + ".norm2.weight", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.ff_in, linear(p + ".ff.net.0.proj", 2 * F, dim));
    VORTEX_ASSIGN_OR_RETURN(b.ff_out, linear(p + ".ff.net.2", dim, F));
    blocks_.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(norm_out_weight_, tensor("decoder.norm_out.weight", {dim}));
  VORTEX_ASSIGN_OR_RETURN(norm_out_bias_, tensor("decoder.norm_out.bias", {dim}));
  VORTEX_ASSIGN_OR_RETURN(proj_out_, linear("decoder.proj_out", c.patch_values(), dim));
  VORTEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return ok_status();
}

Result<NamedTensors> CudaVideoVae::download_weights() const {
  std::unordered_map<std::string, Shape> shapes;
  for (const auto& spec : video_vae_decoder_schema(config_)) shapes[spec.name] = spec.shape;
  NamedTensors out;
  for (const auto& [name, t] : named_) {
    auto it = shapes.find(name);
    if (it == shapes.end()) return internal_error("video VAE: no schema entry for '" + name + "'");
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(t, stream_));
    VORTEX_ASSIGN_OR_RETURN(host, host.reshape(it->second));
    out.emplace_back(name, host);
  }
  return out;
}

Status CudaVideoVae::linear(const Linear& l, const TensorView& x, const TensorView& y) {
  const TensorView bias = l.bias.view();
  return gemm_->linear(x, l.weight.view(), &bias, y, stream_);
}

Status CudaVideoVae::upload_rope(int64_t frames, int64_t h, int64_t w) {
  if (config_.rope_dim() == 0 || (rope_key_[0] == frames && rope_key_[1] == h && rope_key_[2] == w)) return ok_status();
  const auto [cos, sin] = video_rope_tables(config_, frames, h, w);
  VORTEX_ASSIGN_OR_RETURN(Tensor cos_dev, rows_of(tile_.rope_cos, cos.size(0)));
  VORTEX_ASSIGN_OR_RETURN(Tensor sin_dev, rows_of(tile_.rope_sin, sin.size(0)));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(cos, cos_dev, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(sin, sin_dev, stream_));
  rope_key_[0] = frames, rope_key_[1] = h, rope_key_[2] = w;
  return ok_status();
}

// One ViT block in place on the residual stream x [n, dim] (decode_video_chunk's op sequence). Its
// last residual update, x += scale2 · ff_out(...), is left in `branch` for the next block's first
// norm to add in the same pass (`pending`: the block whose update is due; decode_tile adds the last
// one's); the attention's update is added by the second norm likewise, and q and k are normalised
// and rotated in one launch. Each fused pass is bitwise equal to the launches it replaces
// (cuda/elementwise.h; tests/gpu/test_gpu_norm_fused.cu at the decoder's dtypes and widths).
Status CudaVideoVae::block_forward(const Block& b, const Tensor& x, const Block* pending) {
  const VideoVaeConfig& c = config_;
  const int64_t n = x.size(0), dim = c.decoder_dim(), H = c.decoder_num_attention_heads;
  const int64_t D = c.decoder_attention_head_dim;
  const float eps = c.decoder_norm_eps;
  VORTEX_ASSIGN_OR_RETURN(Tensor h, rows_of(tile_.h, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor qkv, rows_of(tile_.qkv, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor attn, rows_of(tile_.attn, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor branch, rows_of(tile_.branch, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor hidden, rows_of(tile_.ff_hidden, n));
  VORTEX_ASSIGN_OR_RETURN(Tensor gated, rows_of(tile_.ff_gated, n));
  const int32_t* zero_rows = tile_.zero_rows.data_as<int32_t>();
  const TensorView n1 = b.norm1.view(), n2 = b.norm2.view(), branch_view = branch.view();

  if (pending != nullptr) {
    const TensorView gate = as_row(pending->scale2);
    const cuda::NormFusion residual{&branch_view, &gate, zero_rows};
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm_fused(x.view(), &n1, eps, residual, h.view(), stream_));
  } else {
    VORTEX_RETURN_IF_ERROR(cuda::rms_norm(x.view(), &n1, eps, h.view(), stream_));
  }
  VORTEX_RETURN_IF_ERROR(linear(b.qkv, h.view(), qkv.view()));
  const TensorView q = heads(qkv, 0, H, D), k = heads(qkv, dim, H, D), v = heads(qkv, 2 * dim, H, D);
  const bool rope = c.rope_dim() > 0;
  Tensor cos, sin;  // the tile's rows of the RoPE tables, where the config rotates
  if (rope) {
    VORTEX_ASSIGN_OR_RETURN(cos, rows_of(tile_.rope_cos, n));
    VORTEX_ASSIGN_OR_RETURN(sin, rows_of(tile_.rope_sin, n));
  }
  const TensorView cos_view = cos.view(), sin_view = sin.view();
  VORTEX_RETURN_IF_ERROR(cuda::qk_norm_rope(q, k, nullptr, nullptr, eps, rope ? &cos_view : nullptr,
                                            rope ? &sin_view : nullptr, stream_));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const TensorView o = heads(attn, 0, H, D);
  if (dtype_ == DType::kBF16) {
    VORTEX_RETURN_IF_ERROR(cuda::attention(q, k, v, o, scale, stream_));
  } else {
    VORTEX_RETURN_IF_ERROR(cuda::attention_f32(q, k, v, o, scale, stream_));
  }
  VORTEX_RETURN_IF_ERROR(linear(b.out, attn.view(), branch_view));
  const TensorView gate = as_row(b.scale1);
  const cuda::NormFusion residual{&branch_view, &gate, zero_rows};
  VORTEX_RETURN_IF_ERROR(cuda::rms_norm_fused(x.view(), &n2, eps, residual, h.view(), stream_));
  VORTEX_RETURN_IF_ERROR(linear(b.ff_in, h.view(), hidden.view()));
  VORTEX_RETURN_IF_ERROR(cuda::swiglu(hidden.view(), gated.view(), stream_));
  return linear(b.ff_out, gated.view(), branch_view);  // the update the next block's first norm adds
}

// decoder(post_quant_conv(z box)) for latents [t0, t0 + frames) x [y0, y0 + h) x [x0, x0 + w):
// out [frames·h·w, patch_values] receives proj_out's rows of the patch tokens.
Status CudaVideoVae::decode_tile(const Tensor& z, int64_t t0, int64_t frames, int64_t y0, int64_t x0, int64_t h,
                                 int64_t w, const Tensor& out) {
  const VideoVaeConfig& c = config_;
  const int64_t N = frames * h * w, R = c.decoder_num_register_tokens, dim = c.decoder_dim();
  VORTEX_ASSIGN_OR_RETURN(Tensor tokens, rows_of(tile_.tokens, N));
  VORTEX_ASSIGN_OR_RETURN(Tensor post_quant, rows_of(tile_.post_quant, N));
  VORTEX_ASSIGN_OR_RETURN(Tensor x, rows_of(tile_.x, N + R + 1));
  VORTEX_ASSIGN_OR_RETURN(Tensor patches, rows_of(x, N));
  VORTEX_RETURN_IF_ERROR(cuda::gather_latent_tokens(z.view(), t0, y0, x0, h, w, tokens.view(), stream_));
  VORTEX_RETURN_IF_ERROR(linear(post_quant_conv_, tokens.view(), post_quant.view()));
  VORTEX_RETURN_IF_ERROR(linear(proj_in_, post_quant.view(), patches.view()));
  // The register tokens, then the all-zero token.
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  float* suffix = x.data_as<float>() + N * dim;
  if (R > 0) {
    VORTEX_CUDA_CHECK(
        cudaMemcpyAsync(suffix, register_tokens_.data(), R * row_bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  VORTEX_CUDA_CHECK(cudaMemsetAsync(suffix + R * dim, 0, row_bytes, stream_));
  VORTEX_RETURN_IF_ERROR(upload_rope(frames, h, w));
  const Block* pending = nullptr;
  for (const Block& b : blocks_) {
    VORTEX_RETURN_IF_ERROR(block_forward(b, x, pending));
    pending = &b;
  }
  if (pending != nullptr) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor branch, rows_of(tile_.branch, x.size(0)));
    const int32_t* zero_rows = tile_.zero_rows.data_as<int32_t>();
    VORTEX_RETURN_IF_ERROR(cuda::gated_residual(x.view(), as_row(pending->scale2), zero_rows, branch.view(), stream_));
  }
  // norm_out and proj_out on the patch tokens only: the reference drops the other rows after
  // proj_out, and both are per row.
  VORTEX_ASSIGN_OR_RETURN(Tensor normed, rows_of(tile_.h, N));
  VORTEX_RETURN_IF_ERROR(cuda::layer_norm(patches.view(), norm_out_weight_.view(), norm_out_bias_.view(),
                                          c.decoder_norm_eps, normed.view(), stream_));
  return linear(proj_out_, normed.view(), out.view());
}

Result<Tensor> CudaVideoVae::decode(const Tensor& latents) { return decode(latents, tiling_); }

Result<Tensor> CudaVideoVae::decode(const Tensor& latents, const VideoTiling& tiling) {
  VORTEX_ASSIGN_OR_RETURN(Tensor frames, decode_on_device(latents, tiling));
  return cuda::download(frames, stream_);
}

Result<Tensor> CudaVideoVae::decode_on_device(const Tensor& latents, const VideoTiling& tiling) {
  const VideoVaeConfig& c = config_;
  VORTEX_RETURN_IF_ERROR(validate_video_latents(c, latents));
  VORTEX_ASSIGN_OR_RETURN(const DecodePlan plan, plan_decode(c, latents.shape(), tiling));

  // The pipeline's de-normalisation on the host, as decode_video does it (fp32, two roundings).
  Tensor z = latents.dtype() == DType::kF32 ? latents.clone() : latents.contiguous().to(DType::kF32).value();
  float* zd = z.data_as<float>();
  const int64_t plane = plan.T * plan.H * plan.W;
  for (int64_t ch = 0; ch < c.latent_channels; ++ch) {
    float* channel = zd + ch * plane;
    for (int64_t i = 0; i < plane; ++i) channel[i] = channel[i] * c.latents_std[ch] + c.latents_mean[ch];
  }

  // The activation arena for this plan: made (or grown) once per shape.
  const size_t needed = activation_bytes(c, dtype_, plan);
  if (activations_.capacity() < needed) {
    activations_ = cuda::DeviceArena();  // free the smaller one first
    VORTEX_ASSIGN_OR_RETURN(activations_, cuda::DeviceArena::create(needed));
  }
  activations_.release_to(0);
  ActivationSet set;
  const std::array<Tensor*, kActivationBuffers> targets = {
      &set.latents, &set.frames, &set.tiles, &set.grid,
      &tile_.tokens, &tile_.post_quant, &tile_.x, &tile_.h, &tile_.qkv, &tile_.attn, &tile_.branch,
      &tile_.ff_hidden, &tile_.ff_gated, &tile_.rope_cos, &tile_.rope_sin, &tile_.zero_rows};
  const ActivationLayout layout = activation_layout(c, dtype_, plan);
  for (size_t i = 0; i < kActivationBuffers; ++i) {
    VORTEX_ASSIGN_OR_RETURN(*targets[i], activations_.alloc(layout[i].first, layout[i].second));
  }
  rope_key_[0] = rope_key_[1] = rope_key_[2] = -1;
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(z, set.latents, stream_));
  Tensor grid_host = Tensor::empty({static_cast<int64_t>(plan.grid.size())}, DType::kI32);
  std::copy(plan.grid.begin(), plan.grid.end(), grid_host.data_as<int32_t>());
  VORTEX_RETURN_IF_ERROR(cuda::copy_to_device(grid_host, set.grid, stream_));
  VORTEX_RETURN_IF_ERROR(cuda::fill_zero(tile_.zero_rows.view(), stream_));

  const int32_t* g = set.grid.data_as<int32_t>();
  const int ny = static_cast<int>(plan.rows.starts.size()), nx = static_cast<int>(plan.cols.starts.size());
  cuda::VaeTileGrid grid;
  grid.row_tile = g;
  grid.col_tile = g + plan.height;
  grid.row_start = grid.col_tile + plan.width;
  grid.row_blend = grid.row_start + ny;
  grid.col_start = grid.row_blend + ny;
  grid.col_blend = grid.col_start + nx;
  grid.ny = ny, grid.nx = nx;
  grid.tile_h = static_cast<int>(plan.tile_h), grid.tile_w = static_cast<int>(plan.tile_w);
  grid.height = static_cast<int>(plan.height), grid.width = static_cast<int>(plan.width);
  grid.channels = c.out_channels, grid.patch = c.spatial_ratio(), grid.patch_t = c.temporal_ratio();

  const int64_t r = c.spatial_ratio(), pv = c.patch_values(), set_stride = set.tiles.size(1);
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ChunkPlan& ch = plan.chunks[i];
    VORTEX_ASSIGN_OR_RETURN(Tensor tiles, set.tiles.select(0, static_cast<int64_t>(i % set.tiles.size(0))));
    const int64_t N = ch.frames * plan.tile_h * plan.tile_w;
    for (int ti = 0; ti < ny; ++ti) {
      for (int tj = 0; tj < nx; ++tj) {
        const int64_t slot = (static_cast<int64_t>(ti) * nx + tj) * N * pv;
        VORTEX_ASSIGN_OR_RETURN(Tensor flat, tiles.slice(0, slot, slot + N * pv));
        VORTEX_ASSIGN_OR_RETURN(Tensor out, flat.reshape({N, pv}));
        VORTEX_RETURN_IF_ERROR(decode_tile(set.latents, ch.t0, ch.frames, plan.rows.starts[ti] / r,
                                           plan.cols.starts[tj] / r, plan.tile_h, plan.tile_w, out));
      }
    }
    const cuda::VaeDecodedChunk cur{tiles.data_as<float>(), ch.frames};
    cuda::VaeDecodedChunk prev;
    if (i > 0) {
      const int64_t s = static_cast<int64_t>((i - 1) % set.tiles.size(0));
      prev = {set.tiles.data_as<float>() + s * set_stride, plan.chunks[i - 1].frames};
    }
    const cuda::VaeDecodedChunk* previous = i > 0 ? &prev : nullptr;
    VORTEX_RETURN_IF_ERROR(cuda::compose_frames(grid, cur, previous, ch.part, set.frames.view(), stream_));
    VORTEX_RETURN_IF_ERROR(cuda::compose_frames(grid, cur, nullptr, ch.tail, set.frames.view(), stream_));
  }
  return set.frames;
}

}  // namespace vortex::vae
