// The video VAE decoder's state-dict schema, its validation and assembly; reading a checkpoint (with
// the original key layout converted on the fly) for the decoder and the encoder; synthetic weights.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "formats/safetensors.h"
#include "models/vae/video_vae.h"
#include "models/vae/video_vae_checkpoint.h"

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

Status validate_video_vae_schema(const NamedTensors& tensors, const std::vector<VideoVaeTensorSpec>& schema,
                                 const std::vector<std::string>& other_side) {
  std::unordered_map<std::string, const Tensor*> present;
  for (const auto& [name, tensor] : tensors) {
    if (!present.emplace(name, &tensor).second) return invalid_argument("tensor '" + name + "' appears twice");
  }
  std::unordered_map<std::string, const VideoVaeTensorSpec*> by_name;
  for (const auto& spec : schema) by_name[spec.name] = &spec;
  for (const auto& [name, t] : tensors) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      const bool skipped = std::any_of(other_side.begin(), other_side.end(),
                                       [&](const std::string& prefix) { return starts_with(name, prefix.c_str()); });
      if (skipped) continue;
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

Status validate_video_vae_tensors(const NamedTensors& tensors, const VideoVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  return validate_video_vae_schema(tensors, video_vae_decoder_schema(config), {"encoder.", "quant_conv."});
}

namespace {

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

Result<VideoLinear> table_linear(const VideoVaeTensorTable& t, const std::string& prefix, int64_t out, int64_t in) {
  VideoLinear l;
  VORTEX_ASSIGN_OR_RETURN(Tensor w, t.f32(prefix + ".weight", {out, in}));
  VORTEX_ASSIGN_OR_RETURN(l.weight, cpu::PackedWeight::pack(w));
  VORTEX_ASSIGN_OR_RETURN(l.bias, t.f32(prefix + ".bias", {out}));
  return l;
}

}  // namespace

Result<VideoVae> assemble_video_vae(const NamedTensors& tensors, const VideoVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(validate_video_vae_tensors(tensors, config));
  const VideoVaeTensorTable t(tensors);
  const int64_t C = config.latent_channels, dim = config.decoder_dim(), ffn = config.decoder_ffn_dim();
  VideoVae vae;
  vae.config = config;
  VORTEX_ASSIGN_OR_RETURN(Tensor pq, t.f32("post_quant_conv.weight", {C, C}));
  VORTEX_ASSIGN_OR_RETURN(vae.post_quant_conv.weight, cpu::PackedWeight::pack(pq));
  VORTEX_ASSIGN_OR_RETURN(vae.post_quant_conv.bias, t.f32("post_quant_conv.bias", {C}));
  VORTEX_ASSIGN_OR_RETURN(vae.proj_in, table_linear(t, "decoder.proj_in", dim, C));
  VORTEX_ASSIGN_OR_RETURN(vae.register_tokens,
                          t.f32("decoder.register_tokens", {config.decoder_num_register_tokens, dim}));
  for (int i = 0; i < config.decoder_num_layers; ++i) {
    const std::string p = "decoder.transformer_blocks." + std::to_string(i);
    VideoVitBlock b;
    VORTEX_ASSIGN_OR_RETURN(b.norm1, t.f32(p + ".norm1.weight", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.norm2, t.f32(p + ".norm2.weight", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.scale1, t.f32(p + ".scale1", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.scale2, t.f32(p + ".scale2", {dim}));
    VORTEX_ASSIGN_OR_RETURN(b.to_q, table_linear(t, p + ".attn.to_q", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_k, table_linear(t, p + ".attn.to_k", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_v, table_linear(t, p + ".attn.to_v", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.to_out, table_linear(t, p + ".attn.to_out.0", dim, dim));
    VORTEX_ASSIGN_OR_RETURN(b.ff_in, table_linear(t, p + ".ff.net.0.proj", 2 * ffn, dim));
    VORTEX_ASSIGN_OR_RETURN(b.ff_out, table_linear(t, p + ".ff.net.2", dim, ffn));
    vae.blocks.push_back(std::move(b));
  }
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_weight, t.f32("decoder.norm_out.weight", {dim}));
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_bias, t.f32("decoder.norm_out.bias", {dim}));
  VORTEX_ASSIGN_OR_RETURN(vae.proj_out, table_linear(t, "decoder.proj_out", config.patch_values(), dim));
  return vae;
}

VideoVaeTensorTable::VideoVaeTensorTable(const NamedTensors& tensors) {
  for (const auto& [name, tensor] : tensors) by_name_[name] = tensor;
}

Result<Tensor> VideoVaeTensorTable::f32(const std::string& name, const Shape& shape) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return invalid_argument("missing tensor '" + name + "'");
  Tensor t = it->second.contiguous();
  if (t.dtype() != DType::kF32) {
    VORTEX_ASSIGN_OR_RETURN(t, t.to(DType::kF32));
  }
  return t.reshape(shape);
}

namespace {

Tensor synthetic_tensor(const VideoVaeTensorSpec& spec, uint64_t seed) {
  Tensor t = Tensor::empty(spec.shape, DType::kF32);
  float* d = t.data_as<float>();
  const uint64_t key = fnv1a64(spec.name) + seed * 0x9E3779B97F4A7C15ull;
  const bool norm_weight = ends_with(spec.name, "norm1.weight") || ends_with(spec.name, "norm2.weight") ||
                           ends_with(spec.name, "norm_out.weight");
  float scale = 0.5f;
  if (!norm_weight && ends_with(spec.name, ".weight")) {
    const int64_t fan_in = t.numel() / spec.shape[0];
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
  for (int64_t e = 0; e < t.numel(); ++e) {
    const uint64_t h = splitmix64(key + static_cast<uint64_t>(e));
    const float v = static_cast<float>(static_cast<double>(h >> 40) / 8388608.0 - 1.0);
    d[e] = norm_weight ? 1.0f + 0.25f * v : v * scale;
  }
  return t;
}

}  // namespace

NamedTensors synthetic_video_vae_schema_tensors(const std::vector<VideoVaeTensorSpec>& schema, uint64_t seed) {
  NamedTensors out;
  for (const auto& spec : schema) out.emplace_back(spec.name, synthetic_tensor(spec, seed));
  return out;
}

NamedTensors synthetic_video_vae_tensors(const VideoVaeConfig& config, uint64_t seed) {
  return synthetic_video_vae_schema_tensors(video_vae_decoder_schema(config), seed);
}

namespace {

namespace fs = std::filesystem;

Result<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return not_found(path.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument(path.string() + ": not valid JSON");
  return json;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The original (pre-conversion) layout is recognised by the keys the conversion removes.
bool is_original_layout(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    if (starts_with(name, "decoder.x_embedder.") || contains(name, ".attn.to_qkv.") || contains(name, ".ff.w1.") ||
        name == "decoder.mask_token" || starts_with(name, "encoder.down.")) {
      return true;
    }
  }
  return false;
}

// The conversion script's _rename_video_vae_key: the encoder's CompVis spelling
// (encoder.down.<i>.block.<j>, nin_shortcut, down.<i>.downsample) onto diffusers' module paths, and
// the decoder's renames.
std::string rename_original_key(std::string key) {
  const auto replace = [&](const std::string& from, const std::string& to) {
    if (auto at = key.find(from); at != std::string::npos) key.replace(at, from.size(), to);
  };
  if (starts_with(key, "encoder.down.")) {
    const std::string rest = key.substr(std::string("encoder.down.").size());
    const size_t dot = rest.find('.');
    if (dot != std::string::npos) {
      key = rest.substr(dot + 1);
      replace("block.", "resnets.");
      replace("nin_shortcut.", "conv_shortcut.");
      replace("downsample.", "downsamplers.0.");
      key = "encoder.down_blocks." + rest.substr(0, dot) + "." + key;
    }
  }
  replace("decoder.x_embedder.", "decoder.proj_in.");
  replace(".attn.to_out.", ".attn.to_out.0.");
  replace(".ff.w1.", ".ff.net.0.proj.");
  replace(".ff.w2.", ".ff.net.2.");
  return key;
}

// Row blocks of an F32 [rows, ...] tensor: out rows [dst, dst + count) = in rows [src, src + count).
void copy_rows(const Tensor& in, Tensor& out, int64_t src, int64_t dst, int64_t count) {
  const int64_t width = in.numel() / in.size(0);
  std::copy_n(in.data_as<const float>() + src * width, count * width, out.data_as<float>() + dst * width);
}

Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[0] = rows;
  return out;
}

// convert_video_vae_key: drop decoder.mask_token; split the per-head-interleaved fused QKV rows
// [head0: q k v, head1: q k v, ...] into to_q / to_k / to_v; swap ff.w1's [gate; up] to diffusers'
// [up; gate]; rename the rest.
Result<NamedTensors> convert_original_layout(const NamedTensors& in, const VideoVaeConfig& c) {
  NamedTensors out;
  const int64_t heads = c.decoder_num_attention_heads, D = c.decoder_attention_head_dim;
  for (const auto& [name, tensor] : in) {
    if (name == "decoder.mask_token") continue;
    const bool qkv = contains(name, ".attn.to_qkv."), w1 = contains(name, ".ff.w1.");
    if (!qkv && !w1) {
      out.emplace_back(rename_original_key(name), tensor);
      continue;
    }
    if (tensor.rank() < 1) return invalid_argument("tensor '" + name + "': a scalar, expected rows");
    Tensor t = tensor.contiguous();
    if (t.dtype() != DType::kF32) {
      VORTEX_ASSIGN_OR_RETURN(t, t.to(DType::kF32));
    }
    const int64_t rows = t.size(0);
    if (qkv) {
      if (rows != 3 * heads * D) {
        return invalid_argument("tensor '" + name + "': shape " + t.shape().to_string() + " has " +
                                std::to_string(rows) + " rows, expected " + std::to_string(3 * heads * D) + " = " +
                                std::to_string(heads) + " heads · 3 · " + std::to_string(D));
      }
      const size_t at = name.find(".attn.to_qkv.");
      const std::string prefix = name.substr(0, at), suffix = name.substr(at + std::string(".attn.to_qkv.").size());
      const char* parts[3] = {"to_q", "to_k", "to_v"};
      for (int part = 0; part < 3; ++part) {
        Tensor dst = Tensor::empty(with_rows(t.shape(), heads * D), DType::kF32);
        for (int64_t h = 0; h < heads; ++h) copy_rows(t, dst, (h * 3 + part) * D, h * D, D);
        out.emplace_back(prefix + ".attn." + parts[part] + "." + suffix, std::move(dst));
      }
      continue;
    }
    if (rows % 2 != 0) {
      return invalid_argument("tensor '" + name + "': shape " + t.shape().to_string() +
                              " has an odd row count, expected [gate; up] halves");
    }
    Tensor dst = Tensor::empty(t.shape(), DType::kF32);
    copy_rows(t, dst, rows / 2, 0, rows / 2);  // up first
    copy_rows(t, dst, 0, rows / 2, rows / 2);  // then gate
    out.emplace_back(rename_original_key(name), std::move(dst));
  }
  return out;
}

// The safetensors files behind `path`: the file itself, or in a folder a sharded index
// (diffusion_pytorch_model.safetensors.index.json) or one diffusion_pytorch_model / model file.
Result<std::vector<std::string>> weight_files(const std::string& path) {
  if (!fs::is_directory(path)) return std::vector<std::string>{path};
  const fs::path dir(path);
  const fs::path index = dir / "diffusion_pytorch_model.safetensors.index.json";
  if (fs::exists(index)) {
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json json, read_json(index));
    if (!json.is_object() || !json.contains("weight_map") || !json["weight_map"].is_object()) {
      return invalid_argument(index.string() + ": no 'weight_map' object");
    }
    std::set<std::string> shards;
    for (const auto& [key, file] : json["weight_map"].items()) {
      if (!file.is_string()) return invalid_argument(index.string() + ": weight_map['" + key + "'] is not a string");
      shards.insert((dir / file.get<std::string>()).string());
    }
    return std::vector<std::string>(shards.begin(), shards.end());
  }
  for (const char* name : {"diffusion_pytorch_model.safetensors", "model.safetensors"}) {
    if (fs::exists(dir / name)) return std::vector<std::string>{(dir / name).string()};
  }
  return not_found(path + ": holds neither diffusion_pytorch_model.safetensors(.index.json) nor model.safetensors");
}

// The original checkpoint's pair: the wrapper config.json at `wrapper_dir` and the source
// model's config.json in its source_path. The weights are `path` when that names a file, else the
// source model's source_safetensors_path.
// `from_source_dir`, when the caller was pointed at the source model's folder, must be the folder
// the wrapper names.
Result<VideoVaeCheckpoint> read_original(const std::string& path, const fs::path& wrapper_dir,
                                         const fs::path& from_source_dir = {}) {
  const fs::path wrapper_file = wrapper_dir / "config.json";
  VORTEX_ASSIGN_OR_RETURN(nlohmann::json wrapper, read_json(wrapper_file));
  if (!is_original_video_vae_wrapper(wrapper)) {
    return invalid_argument(wrapper_file.string() + ": not the original video VAE wrapper config (no 'source_path')");
  }
  const auto source_path = wrapper.find("source_path");
  if (!source_path->is_string()) {
    return invalid_argument(wrapper_file.string() + ": video VAE config field 'source_path' must be a string");
  }
  const fs::path source_dir = wrapper_dir / source_path->get<std::string>();
  const fs::path source_file = source_dir / "config.json";
  std::error_code ec;
  if (!from_source_dir.empty() && !fs::equivalent(source_dir, from_source_dir, ec)) {
    return invalid_argument(wrapper_file.string() + ": video VAE config field 'source_path' names " +
                            source_dir.string() + ", not " + from_source_dir.string());
  }
  VORTEX_ASSIGN_OR_RETURN(nlohmann::json source, read_json(source_file));
  VORTEX_ASSIGN_OR_RETURN(OriginalVideoVaeConfig original, video_vae_config_from_original(wrapper, source,
                                                                                          wrapper_file.string(),
                                                                                          source_file.string()));
  const std::string weights =
      fs::is_directory(path) ? (source_dir / original.source_safetensors_path).string() : path;
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(weights));
  NamedTensors tensors;
  for (const auto& name : file.names()) {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(name));
    tensors.emplace_back(name, std::move(t));
  }
  // The source model is the pre-conversion module, so its keys are the original ones; a converted
  // file put there loads as well.
  if (is_original_layout(tensors)) {
    auto converted = convert_original_layout(tensors, original.config);
    if (!converted.ok()) return converted.status().with_context(weights);
    tensors = std::move(*converted);
  }
  return VideoVaeCheckpoint{original.config, original.tiling, std::move(tensors), weights};
}

}  // namespace

Result<VideoVaeCheckpoint> read_video_vae_checkpoint(const std::string& path) {
  const fs::path folder = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  std::optional<VideoVaeConfig> config;
  if (fs::exists(folder / "config.json")) {
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json json, read_json(folder / "config.json"));
    if (is_original_video_vae_wrapper(json)) return read_original(path, folder);
    if (is_original_video_vae_source(json)) {
      // Pointed at the source model: its statistics and tiling live in the wrapper one folder up.
      const fs::path parent = fs::absolute(folder).lexically_normal().parent_path();
      if (!fs::exists(parent / "config.json")) {
        return not_found((folder / "config.json").string() + " is the original source model's config; the wrapper " +
                         "config.json with latents_mean / latents_std should be in " + parent.string());
      }
      return read_original(path, parent, folder);
    }
    auto c = video_vae_config_from_json(json);
    if (!c.ok()) return c.status().with_context((folder / "config.json").string());
    config = *c;
  }
  VORTEX_ASSIGN_OR_RETURN(std::vector<std::string> files, weight_files(path));
  NamedTensors tensors;
  std::unordered_map<std::string, std::string> origin;  // tensor name → file, for the error messages
  for (const std::string& file_path : files) {
    VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(file_path));
    if (!config) {
      if (auto it = file.metadata().find("config"); it != file.metadata().end()) {
        auto c = video_vae_config_from_json_string(it->second);
        if (!c.ok()) return c.status().with_context(file_path + ": metadata 'config'");
        config = *c;
      }
    }
    for (const auto& name : file.names()) {
      VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(name));
      if (!origin.emplace(name, file_path).second) {
        return invalid_argument(file_path + ": tensor '" + name + "' also appears in " + origin[name]);
      }
      tensors.emplace_back(name, std::move(t));
    }
  }
  // One file names the error; with shards, the first is as good as any for a missing tensor.
  const std::string where = files.size() == 1 ? files[0] : path;
  if (!config) {
    return not_found(where + ": no video VAE config (config.json beside the weights, or a 'config' metadata key)");
  }
  if (is_original_layout(tensors)) {
    auto converted = convert_original_layout(tensors, *config);
    if (!converted.ok()) return converted.status().with_context(where);
    tensors = std::move(*converted);
  }
  return VideoVaeCheckpoint{*config, std::nullopt, std::move(tensors), where};
}

Result<VideoVae> load_video_vae(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(VideoVaeCheckpoint checkpoint, read_video_vae_checkpoint(path));
  auto vae = assemble_video_vae(checkpoint.tensors, checkpoint.config);
  if (!vae.ok()) return vae.status().with_context(checkpoint.where);
  if (checkpoint.tiling) vae->tiling = *checkpoint.tiling;
  return vae;
}

}  // namespace vortex::vae
