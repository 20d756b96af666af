// The video VAE decoder's state-dict schema, its validation, assembly and synthetic weights.
#include <cmath>
#include <unordered_map>

#include "models/vae/video_vae.h"

namespace vortex::vae {

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

std::vector<VideoVaeTensorSpec> video_vae_decoder_schema(const VideoVaeConfig& c) {
  std::vector<VideoVaeTensorSpec> s;
  const int64_t C = c.latent_channels, dim = c.decoder_dim(), ffn = c.decoder_ffn_dim();
  const auto linear = [&](const std::string& p, int64_t out, int64_t in) {
    s.push_back({p + ".weight", {out, in}});
    s.push_back({p + ".bias", {out}});
  };
  s.push_back({"post_quant_conv.weight", {C, C, 1, 1, 1}});
  s.push_back({"post_quant_conv.bias", {C}});
  linear("decoder.proj_in", dim, C);
  s.push_back({"decoder.register_tokens", {1, c.decoder_num_register_tokens, dim}});
  for (int i = 0; i < c.decoder_num_layers; ++i) {
    const std::string p = "decoder.transformer_blocks." + std::to_string(i);
    s.push_back({p + ".scale1", {dim}});
    s.push_back({p + ".scale2", {dim}});
    s.push_back({p + ".norm1.weight", {dim}});
    linear(p + ".attn.to_q", dim, dim);
    linear(p + ".attn.to_k", dim, dim);
    linear(p + ".attn.to_v", dim, dim);
    linear(p + ".attn.to_out.0", dim, dim);
    s.push_back({p + ".norm2.weight", {dim}});
    linear(p + ".ff.net.0.proj", 2 * ffn, dim);
    linear(p + ".ff.net.2", dim, ffn);
  }
  s.push_back({"decoder.norm_out.weight", {dim}});
  s.push_back({"decoder.norm_out.bias", {dim}});
  linear("decoder.proj_out", c.patch_values(), dim);
  return s;
}

Status validate_video_vae_tensors(const NamedTensors& tensors, const VideoVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  std::unordered_map<std::string, const Tensor*> present;
  for (const auto& [name, tensor] : tensors) {
    if (!present.emplace(name, &tensor).second) return invalid_argument("tensor '" + name + "' appears twice");
  }
  const std::vector<VideoVaeTensorSpec> schema = video_vae_decoder_schema(config);
  std::unordered_map<std::string, const VideoVaeTensorSpec*> by_name;
  for (const auto& spec : schema) by_name[spec.name] = &spec;
  for (const auto& [name, t] : tensors) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (starts_with(name, "encoder.") || starts_with(name, "quant_conv.")) continue;
      return invalid_argument("unexpected tensor '" + name + "' for this video VAE config");
    }
    if (t.shape() != it->second->shape) {
      return invalid_argument("tensor '" + name + "': shape " + t.shape().to_string() + " but the config expects " +
                              it->second->shape.to_string());
    }
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      return invalid_argument("tensor '" + name + "': dtype " + dtype_name(t.dtype()) + " is not a float dtype");
    }
  }
  for (const auto& spec : schema) {
    if (!present.count(spec.name)) return invalid_argument("missing tensor '" + spec.name + "'");
  }
  return ok_status();
}

namespace {

class TensorTable {
 public:
  explicit TensorTable(const NamedTensors& tensors) {
    for (const auto& [name, tensor] : tensors) by_name_[name] = tensor;
  }

  // fp32, contiguous, reshaped to `shape` (same element count).
  Result<Tensor> f32(const std::string& name, const Shape& shape) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return invalid_argument("missing tensor '" + name + "'");
    Tensor t = it->second.contiguous();
    if (t.dtype() != DType::kF32) {
      VORTEX_ASSIGN_OR_RETURN(t, t.to(DType::kF32));
    }
    return t.reshape(shape);
  }

  Result<VideoLinear> linear(const std::string& prefix, int64_t out, int64_t in) const {
    VideoLinear l;
    VORTEX_ASSIGN_OR_RETURN(Tensor w, f32(prefix + ".weight", {out, in}));
    VORTEX_ASSIGN_OR_RETURN(l.weight, cpu::PackedWeight::pack(w));
    VORTEX_ASSIGN_OR_RETURN(l.bias, f32(prefix + ".bias", {out}));
    return l;
  }

 private:
  std::unordered_map<std::string, Tensor> by_name_;
};

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<VideoVae> assemble_video_vae(const NamedTensors& tensors, const VideoVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(validate_video_vae_tensors(tensors, config));
  const TensorTable t(tensors);
  const int64_t C = config.latent_channels, dim = config.decoder_dim(), ffn = config.decoder_ffn_dim();
  VideoVae vae;
  vae.config = config;
  VORTEX_ASSIGN_OR_RETURN(Tensor pq, t.f32("post_quant_conv.weight", {C, C}));
  VORTEX_ASSIGN_OR_RETURN(vae.post_quant_conv.weight, cpu::PackedWeight::pack(pq));
  VORTEX_ASSIGN_OR_RETURN(vae.post_quant_conv.bias, t.f32("post_quant_conv.bias", {C}));
  VORTEX_ASSIGN_OR_RETURN(vae.proj_in, t.linear("decoder.proj_in", dim, C));
  VORTEX_ASSIGN_OR_RETURN(vae.register_tokens,
                          t.f32("decoder.register_tokens", {config.decoder_num_register_tokens, dim}));
  for (int i = 0; i < config.decoder_num_layers; ++i) {
    const std::string p = "decoder.transformer_blocks." + std::to_string(i);
    VideoVitBlock b;
    VORTEX_ASSIGN_OR_RETURN(b.norm1, t.f32(p + ".norm1.weight", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, t.f32(p + ".norm2.weight", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.scale1, t.f32(p + ".scale1", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.scale2, t.f32(p + ".scale2", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.to_q, t.linear(p + ".attn.to_q", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_k, t.linear(p + ".attn.to_k", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_v, t.linear(p + ".attn.to_v", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_out, t.linear(p + ".attn.to_out.0", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.ff_in, t.linear(p + ".ff.net.0.proj", 2 * ffn, dim));
    VORTEX_ASSIGN_OR_RETURN(b.ff_out, t.linear(p + ".ff.net.2", dim, ffn));
    vae.blocks.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_weight, t.f32("decoder.norm_out.weight", {dim}));
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_bias, t.f32("decoder.norm_out.bias", {dim}));
  VORTEX_ASSIGN_OR_RETURN(vae.proj_out, t.linear("decoder.proj_out", config.patch_values(), dim));
  return vae;
}

NamedTensors synthetic_video_vae_tensors(const VideoVaeConfig& config, uint64_t seed) {
  NamedTensors out;
  for (const auto& spec : video_vae_decoder_schema(config)) {
    Tensor t = Tensor::empty(spec.shape, DType::kF32);
    float* d = t.data_as<float>();
    const uint64_t key = fnv1a64(spec.name) + seed * 0x9E3779B97F4A7C15ull;
    const bool norm_weight = ends_with(spec.name, "norm1.weight") || ends_with(spec.name, "norm2.weight") ||
                             spec.name == "decoder.norm_out.weight";
    float scale = 0.5f;
    if (!norm_weight && ends_with(spec.name, ".weight")) {
      scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.shape[1])));
    }
    for (int64_t e = 0; e < t.numel(); ++e) {
      const uint64_t h = splitmix64(key + static_cast<uint64_t>(e));
      const float v = static_cast<float>(static_cast<double>(h >> 40) / 8388608.0 - 1.0);
      d[e] = norm_weight ? 1.0f + 0.25f * v : v * scale;
    }
    out.emplace_back(spec.name, std::move(t));
  }
  return out;
}

}  // namespace vortex::vae
