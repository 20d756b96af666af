// The audio VAE's state-dict schema, its validation, decoder assembly, config resolution, loading
// and synthetic weights.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "core/rng.h"
#include "models/h3/synthetic_rule.h"
#include "models/vae/audio_vae.h"
#include "models/vae/audio_vae_encoder.h"
#include "models/vae/resample.h"

namespace vortex::vae {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
  return s.substr(0, s.size() - suffix.size());
}

std::string idx(int i) { return std::to_string(i); }

class SchemaBuilder {
 public:
  explicit SchemaBuilder(std::vector<AudioVaeTensorSpec>& out) : out_(out) {}
  AudioVaePart part = AudioVaePart::kEncoder;

  void add(const std::string& name, Shape shape) { out_.push_back({name, shape, part}); }
  // torch.nn.utils.weight_norm(dim=0) of a Conv1d [O, C, K] or ConvTranspose1d [C_in, C_out, K]:
  // g keeps the first dim. `bias_size` 0 means no bias.
  void weight_normed(const std::string& prefix, Shape weight, int64_t bias_size) {
    if (bias_size > 0) add(prefix + ".bias", {bias_size});
    add(prefix + ".weight_g", {weight[0], 1, 1});
    add(prefix + ".weight_v", weight);
  }
  void plain(const std::string& prefix, Shape weight, int64_t bias_size) {
    add(prefix + ".weight", weight);
    if (bias_size > 0) add(prefix + ".bias", {bias_size});
  }
  void layer_norm(const std::string& prefix, int64_t n) { plain(prefix, {n}, n); }
  void alias_free_snake(const std::string& prefix, int64_t channels) {
    add(prefix + ".act.alpha", {channels});
    add(prefix + ".act.beta", {channels});
    add(prefix + ".upsample.filter", {1, 1, kAliasFreeTaps});
    add(prefix + ".downsample.lowpass.filter", {1, 1, kAliasFreeTaps});
  }

 private:
  std::vector<AudioVaeTensorSpec>& out_;
};

}  // namespace

std::vector<AudioVaeTensorSpec> audio_vae_schema(const AudioVaeConfig& c) {
  std::vector<AudioVaeTensorSpec> specs;
  SchemaBuilder s(specs);
  // Encoder (DAC): k7 stem, blocks of three residual units (dilations 1/3/9) and a strided conv.
  s.part = AudioVaePart::kEncoder;
  int64_t d = c.encoder_dim;
  s.weight_normed("encoder.block.0", {d, 1, 7}, d);
  for (size_t i = 0; i < c.encoder_rates.size(); ++i) {
    d *= 2;
    const int64_t h = d / 2;
    const std::string p = "encoder.block." + std::to_string(i + 1) + ".block";
    for (int j = 0; j < 3; ++j) {
      const std::string r = p + "." + idx(j) + ".block";
      s.add(r + ".0.alpha", {1, h, 1});
      s.weight_normed(r + ".1", {h, h, 7}, h);
      s.add(r + ".2.alpha", {1, h, 1});
      s.weight_normed(r + ".3", {h, h, 1}, h);
    }
    s.add(p + ".3.alpha", {1, h, 1});
    s.weight_normed(p + ".4", {d, h, 2 * int64_t(c.encoder_rates[i])}, d);
  }
  const size_t n = c.encoder_rates.size();
  s.add("encoder.block." + std::to_string(n + 1) + ".alpha", {1, d, 1});
  s.weight_normed("encoder.block." + std::to_string(n + 2), {c.latent_dim, d, 3}, c.latent_dim);
  // pre_block: causal attention + GeGLU projection latent_dim -> latent_channels.
  const int64_t in = c.latent_dim, out = c.latent_channels;
  s.layer_norm("pre_block.norm1", in);
  s.add("pre_block.attn.q_bias", {in});
  s.add("pre_block.attn.v_bias", {in});
  s.add("pre_block.attn.zero_k_bias", {in});
  s.plain("pre_block.attn.qkv", {3 * in, in}, 0);
  s.plain("pre_block.attn.proj", {out, out}, out);
  s.plain("pre_block.proj", {out, in}, out);
  s.layer_norm("pre_block.norm3", in);
  s.layer_norm("pre_block.norm2", out);
  s.layer_norm("pre_block.mlp.norm", out);
  s.plain("pre_block.mlp.w0", {2 * out, out}, 2 * out);
  s.plain("pre_block.mlp.w1", {2 * out, out}, 2 * out);
  s.plain("pre_block.mlp.w2", {out, 2 * out}, out);
  s.plain("mean_proj", {out, out, 1}, out);
  s.plain("logs_proj", {out, out, 1}, out);
  // Decoder: dec_in_proj, then BigVGAN.
  s.part = AudioVaePart::kDecoder;
  s.plain("dec_in_proj", {c.latent_dim, out, 1}, c.latent_dim);
  s.weight_normed("decoder.conv_pre", {c.decoder_dim, c.latent_dim, 7}, c.decoder_dim);
  for (int i = 0; i < c.num_upsamples(); ++i) {
    s.weight_normed("decoder.ups." + idx(i) + ".0",
                    {c.stage_channels(i), c.stage_channels(i + 1), c.decoder_kernel_sizes[i]}, c.stage_channels(i + 1));
  }
  for (int i = 0; i < c.num_upsamples(); ++i) {
    const int64_t ch = c.stage_channels(i + 1);
    for (int j = 0; j < c.num_kernels(); ++j) {
      const std::string p = "decoder.resblocks." + idx(i * c.num_kernels() + j);
      const int64_t k = c.resblock_kernel_sizes[j];
      const int nd = static_cast<int>(c.resblock_dilation_sizes[j].size());
      for (int m = 0; m < nd; ++m) s.weight_normed(p + ".convs1." + idx(m), {ch, ch, k}, ch);
      for (int m = 0; m < nd; ++m) s.weight_normed(p + ".convs2." + idx(m), {ch, ch, k}, ch);
      for (int a = 0; a < 2 * nd; ++a) s.alias_free_snake(p + ".activations." + idx(a), ch);
    }
  }
  const int64_t last = c.stage_channels(c.num_upsamples());
  s.alias_free_snake("decoder.activation_post", last);
  s.weight_normed("decoder.conv_post", {1, last, 7}, 0);
  return specs;
}

Status validate_audio_vae_tensors(const NamedTensors& tensors, const AudioVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  std::unordered_map<std::string, const Tensor*> present;
  for (const auto& [name, tensor] : tensors) {
    if (!present.emplace(name, &tensor).second) return invalid_argument("tensor '" + name + "' appears twice");
  }
  const std::vector<AudioVaeTensorSpec> schema = audio_vae_schema(config);
  std::unordered_map<std::string, const AudioVaeTensorSpec*> by_name;
  for (const auto& spec : schema) by_name[spec.name] = &spec;

  const auto check = [](const std::string& name, const Tensor& t, const Shape& shape) -> Status {
    if (t.shape() != shape) {
      return invalid_argument("tensor '" + name + "': shape " + t.shape().to_string() + " but the config expects " +
                              shape.to_string());
    }
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      return invalid_argument("tensor '" + name + "': dtype " + dtype_name(t.dtype()) + " is not a float dtype");
    }
    return ok_status();
  };
  // A fused `<conv>.weight` may stand in for `<conv>.weight_g` + `<conv>.weight_v`.
  std::set<std::string> fused;
  bool any_encoder = false;
  for (const auto& [name, tensor] : tensors) {
    if (auto it = by_name.find(name); it != by_name.end()) {
      VORTEX_RETURN_IF_ERROR(check(name, tensor, it->second->shape));
      any_encoder |= it->second->part == AudioVaePart::kEncoder;
      continue;
    }
    if (ends_with(name, ".weight")) {
      const std::string prefix = strip_suffix(name, ".weight");
      if (auto it = by_name.find(prefix + ".weight_v"); it != by_name.end()) {
        VORTEX_RETURN_IF_ERROR(check(name, tensor, it->second->shape));
        if (present.count(prefix + ".weight_g") || present.count(prefix + ".weight_v")) {
          return invalid_argument("tensor '" + name + "' and its weight-norm pair '" + prefix +
                                  ".weight_g' / '.weight_v' are both present");
        }
        fused.insert(prefix);
        any_encoder |= it->second->part == AudioVaePart::kEncoder;
        continue;
      }
    }
    return invalid_argument("unexpected tensor '" + name + "' for this audio VAE config");
  }
  const AudioVaeTensorSpec* first_missing_encoder = nullptr;
  for (const auto& spec : schema) {
    if (present.count(spec.name)) continue;
    if (ends_with(spec.name, ".weight_g") && fused.count(strip_suffix(spec.name, ".weight_g"))) continue;
    if (ends_with(spec.name, ".weight_v") && fused.count(strip_suffix(spec.name, ".weight_v"))) continue;
    if (spec.part == AudioVaePart::kDecoder) return invalid_argument("missing tensor '" + spec.name + "'");
    if (first_missing_encoder == nullptr) first_missing_encoder = &spec;
  }
  if (any_encoder && first_missing_encoder != nullptr) {
    return invalid_argument("missing tensor '" + first_missing_encoder->name +
                            "' (the encoder side is only partly present)");
  }
  return ok_status();
}

namespace {

class TensorTable {
 public:
  explicit TensorTable(const NamedTensors& tensors) {
    for (const auto& [name, tensor] : tensors) by_name_[name] = tensor;
  }

  Result<Tensor> get(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return invalid_argument("missing tensor '" + name + "'");
    return it->second;
  }

  // The convolution weight of a weight-normed module: the fused `weight`, or g and v fused here.
  Result<Tensor> weight_normed(const std::string& prefix) const {
    if (auto it = by_name_.find(prefix + ".weight"); it != by_name_.end()) return it->second;
    VORTEX_ASSIGN_OR_RETURN(Tensor g, get(prefix + ".weight_g"));
    VORTEX_ASSIGN_OR_RETURN(Tensor v, get(prefix + ".weight_v"));
    return fuse_weight_norm(prefix, g, v);
  }

  Result<Conv1d> conv(const std::string& prefix, bool weight_norm, bool bias, int64_t dilation, int64_t padding,
                      int64_t stride = 1) const {
    Tensor w, b;
    if (weight_norm) {
      VORTEX_ASSIGN_OR_RETURN(w, weight_normed(prefix));
    } else {
      VORTEX_ASSIGN_OR_RETURN(w, get(prefix + ".weight"));
    }
    if (bias) {
      VORTEX_ASSIGN_OR_RETURN(b, get(prefix + ".bias"));
    }
    return make_conv1d(prefix + ".weight", w, b, stride, dilation, padding);
  }

  Result<std::vector<float>> values(const std::string& name) const {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, get(name));
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(element_as_double(t, i));
    return out;
  }

  Result<AliasFreeSnake> alias_free_snake(const std::string& prefix) const {
    AliasFreeSnake a;
    VORTEX_ASSIGN_OR_RETURN(Tensor alpha, get(prefix + ".act.alpha"));
    VORTEX_ASSIGN_OR_RETURN(Tensor beta, get(prefix + ".act.beta"));
    VORTEX_ASSIGN_OR_RETURN(a.snake, snake_beta_params(prefix + ".act", alpha, beta));
    VORTEX_ASSIGN_OR_RETURN(a.up_filter, values(prefix + ".upsample.filter"));
    VORTEX_ASSIGN_OR_RETURN(a.down_filter, values(prefix + ".downsample.lowpass.filter"));
    return a;
  }

 private:
  std::unordered_map<std::string, Tensor> by_name_;
};

}  // namespace

Result<AudioVae> assemble_audio_vae(const NamedTensors& tensors, const AudioVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(validate_audio_vae_tensors(tensors, config));
  const TensorTable table(tensors);
  AudioVae vae;
  vae.config = config;
  AudioDecoderWeights& d = vae.decoder;
  VORTEX_ASSIGN_OR_RETURN(d.dec_in_proj, table.conv("dec_in_proj", false, true, 1, 0));
  VORTEX_ASSIGN_OR_RETURN(d.conv_pre, table.conv("decoder.conv_pre", true, true, 1, 3));
  for (int i = 0; i < config.num_upsamples(); ++i) {
    const std::string p = "decoder.ups." + idx(i) + ".0";
    VORTEX_ASSIGN_OR_RETURN(Tensor w, table.weight_normed(p));
    VORTEX_ASSIGN_OR_RETURN(Tensor b, table.get(p + ".bias"));
    const int rate = config.decoder_rates[i], kernel = config.decoder_kernel_sizes[i];
    VORTEX_ASSIGN_OR_RETURN(ConvTranspose1d up, make_conv_transpose1d(p + ".weight", w, b, rate, (kernel - rate) / 2));
    d.ups.push_back(std::move(up));
  }
  for (int i = 0; i < config.num_upsamples(); ++i) {
    for (int j = 0; j < config.num_kernels(); ++j) {
      const std::string p = "decoder.resblocks." + idx(i * config.num_kernels() + j);
      const int k = config.resblock_kernel_sizes[j];
      AmpBlock block;
      block.dilations = config.resblock_dilation_sizes[j];
      for (size_t m = 0; m < block.dilations.size(); ++m) {
        const int dil = block.dilations[m];
        VORTEX_ASSIGN_OR_RETURN(Conv1d c1, table.conv(p + ".convs1." + idx(m), true, true, dil, (k * dil - dil) / 2));
        VORTEX_ASSIGN_OR_RETURN(Conv1d c2, table.conv(p + ".convs2." + idx(m), true, true, 1, (k - 1) / 2));
        block.convs1.push_back(std::move(c1));
        block.convs2.push_back(std::move(c2));
      }
      for (size_t a = 0; a < 2 * block.dilations.size(); ++a) {
        VORTEX_ASSIGN_OR_RETURN(AliasFreeSnake act, table.alias_free_snake(p + ".activations." + idx(a)));
        block.acts.push_back(std::move(act));
      }
      d.resblocks.push_back(std::move(block));
    }
  }
  VORTEX_ASSIGN_OR_RETURN(d.activation_post, table.alias_free_snake("decoder.activation_post"));
  VORTEX_ASSIGN_OR_RETURN(d.conv_post, table.conv("decoder.conv_post", true, false, 1, 3));
  return vae;
}

Result<AudioVaeEncoder> assemble_audio_vae_encoder(const NamedTensors& tensors, const AudioVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(validate_audio_vae_tensors(tensors, config));
  const TensorTable table(tensors);
  AudioVaeEncoder e;
  e.config = config;
  const auto snake = [&](const std::string& name) -> Result<SnakeParams> {
    VORTEX_ASSIGN_OR_RETURN(Tensor alpha, table.get(name));
    return snake_params(name, alpha);
  };
  const auto f32 = [&](const std::string& name) -> Result<Tensor> {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, table.get(name));
    return conv_tensor_f32(name, t);
  };
  VORTEX_ASSIGN_OR_RETURN(e.stem, table.conv("encoder.block.0", true, true, 1, 3));
  const size_t n = config.encoder_rates.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string p = "encoder.block." + std::to_string(i + 1) + ".block";
    AudioEncoderBlock block;
    int dilation = 1;
    for (int j = 0; j < 3; ++j, dilation *= 3) {
      const std::string r = p + "." + idx(j) + ".block";
      AudioResidualUnit unit;
      VORTEX_ASSIGN_OR_RETURN(unit.snake1, snake(r + ".0.alpha"));
      VORTEX_ASSIGN_OR_RETURN(unit.conv1, table.conv(r + ".1", true, true, dilation, 3 * dilation));
      VORTEX_ASSIGN_OR_RETURN(unit.snake2, snake(r + ".2.alpha"));
      VORTEX_ASSIGN_OR_RETURN(unit.conv2, table.conv(r + ".3", true, true, 1, 0));
      block.units.push_back(std::move(unit));
    }
    VORTEX_ASSIGN_OR_RETURN(block.snake, snake(p + ".3.alpha"));
    const int rate = config.encoder_rates[i];
    VORTEX_ASSIGN_OR_RETURN(block.down, table.conv(p + ".4", true, true, 1, (rate + 1) / 2, rate));
    e.blocks.push_back(std::move(block));
  }
  VORTEX_ASSIGN_OR_RETURN(e.snake_out, snake("encoder.block." + std::to_string(n + 1) + ".alpha"));
  VORTEX_ASSIGN_OR_RETURN(e.conv_out, table.conv("encoder.block." + std::to_string(n + 2), true, true, 1, 1));
  for (auto [norm, name] : {std::pair{&e.norm1, "pre_block.norm1"}, std::pair{&e.norm2, "pre_block.norm2"},
                            std::pair{&e.norm3, "pre_block.norm3"}, std::pair{&e.mlp_norm, "pre_block.mlp.norm"}}) {
    VORTEX_ASSIGN_OR_RETURN(norm->weight, f32(std::string(name) + ".weight"));
    VORTEX_ASSIGN_OR_RETURN(norm->bias, f32(std::string(name) + ".bias"));
  }
  VORTEX_ASSIGN_OR_RETURN(e.qkv_weight, f32("pre_block.attn.qkv.weight"));
  const int64_t d = config.latent_dim;
  e.qkv_bias = Tensor::empty({3 * d}, DType::kF32);
  const char* biases[3] = {"pre_block.attn.q_bias", "pre_block.attn.zero_k_bias", "pre_block.attn.v_bias"};
  for (int part = 0; part < 3; ++part) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor b, f32(biases[part]));
    std::copy(b.data_as<const float>(), b.data_as<const float>() + d, e.qkv_bias.data_as<float>() + part * d);
  }
  for (auto [w, b, name] : {std::tuple{&e.attn_proj_weight, &e.attn_proj_bias, "pre_block.attn.proj"},
                            std::tuple{&e.proj_weight, &e.proj_bias, "pre_block.proj"},
                            std::tuple{&e.w0_weight, &e.w0_bias, "pre_block.mlp.w0"},
                            std::tuple{&e.w1_weight, &e.w1_bias, "pre_block.mlp.w1"},
                            std::tuple{&e.w2_weight, &e.w2_bias, "pre_block.mlp.w2"}}) {
    VORTEX_ASSIGN_OR_RETURN(*w, f32(std::string(name) + ".weight"));
    VORTEX_ASSIGN_OR_RETURN(*b, f32(std::string(name) + ".bias"));
  }
  VORTEX_ASSIGN_OR_RETURN(e.mean_proj, table.conv("mean_proj", false, true, 1, 0));
  return e;
}

namespace {

Result<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return not_found(path.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return invalid_argument(path.string() + ": not valid JSON");
  return json;
}

// A string field of the original wrapper naming a file beside it, or `fallback`.
Result<fs::path> wrapper_file(const nlohmann::json& wrapper, const fs::path& folder, const char* key,
                              const char* fallback) {
  auto it = wrapper.find(key);
  if (it == wrapper.end() || it->is_null()) return folder / fallback;
  if (!it->is_string()) {
    return invalid_argument((folder / "config.json").string() + ": audio VAE config field '" + key +
                            "' must be a string");
  }
  return folder / it->get<std::string>();
}

}  // namespace

Result<AudioVaeConfig> resolve_audio_vae_config(const std::string& path, const SafetensorsFile& file) {
  const fs::path p(path);
  const fs::path folder = fs::is_directory(p) ? p : p.parent_path();
  const fs::path config_json = folder / "config.json";
  if (fs::exists(config_json)) {
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json config, read_json(config_json));
    // The original checkpoint's config.json only carries the latent statistics; its
    // architecture lives in the metadata file it names (metadata.json).
    if (is_original_audio_vae_wrapper(config)) {
      VORTEX_ASSIGN_OR_RETURN(fs::path metadata_json,
                              wrapper_file(config, folder, "source_metadata_path", "metadata.json"));
      if (!fs::exists(metadata_json)) {
        return not_found(config_json.string() + " is the original audio VAE's wrapper config; its constructor " +
                         "arguments (" + metadata_json.string() + ") are missing");
      }
      VORTEX_ASSIGN_OR_RETURN(nlohmann::json metadata, read_json(metadata_json));
      return audio_vae_config_from_original(metadata, config, metadata_json.string(), config_json.string());
    }
    auto c = audio_vae_config_from_json(config);
    if (!c.ok()) return c.status().with_context(config_json.string());
    return c;
  }
  if (auto it = file.metadata().find("config"); it != file.metadata().end()) {
    auto c = audio_vae_config_from_json_string(it->second);
    if (!c.ok()) return c.status().with_context(file.path() + ": metadata 'config'");
    return c;
  }
  return not_found(path + ": no audio VAE config (config.json beside the weights, or a 'config' metadata key)");
}

namespace {

// The weights file for a folder: the one an original wrapper names, else the diffusers or the
// original default name.
Result<std::string> audio_weights_in(const fs::path& folder) {
  if (fs::exists(folder / "config.json")) {
    VORTEX_ASSIGN_OR_RETURN(nlohmann::json config, read_json(folder / "config.json"));
    if (is_original_audio_vae_wrapper(config) && config.contains("source_safetensors_path")) {
      VORTEX_ASSIGN_OR_RETURN(fs::path named, wrapper_file(config, folder, "source_safetensors_path", ""));
      return named.string();
    }
  }
  for (const char* name : {"diffusion_pytorch_model.safetensors", "model.safetensors"}) {
    if (fs::exists(folder / name)) return (folder / name).string();
  }
  return not_found(folder.string() + ": holds neither diffusion_pytorch_model.safetensors nor model.safetensors");
}

}  // namespace

namespace {

// A checkpoint's config and every tensor, and the weights file they came from.
struct AudioCheckpoint {
  AudioVaeConfig config;
  NamedTensors tensors;
  std::string file_path;
};

Result<AudioCheckpoint> read_audio_checkpoint(const std::string& path) {
  AudioCheckpoint c;
  c.file_path = path;
  if (fs::is_directory(path)) {
    VORTEX_ASSIGN_OR_RETURN(c.file_path, audio_weights_in(path));
  }
  VORTEX_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(c.file_path));
  // A folder's config.json is the config, wherever in the folder its wrapper put the weights.
  VORTEX_ASSIGN_OR_RETURN(c.config, resolve_audio_vae_config(path, file));
  for (const auto& name : file.names()) {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, file.get(name));
    c.tensors.emplace_back(name, std::move(t));
  }
  return c;
}

}  // namespace

Result<AudioVae> load_audio_vae(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(const AudioCheckpoint c, read_audio_checkpoint(path));
  auto vae = assemble_audio_vae(c.tensors, c.config);
  if (!vae.ok()) return vae.status().with_context(c.file_path);
  return vae;
}

Result<AudioVaeEncoder> load_audio_vae_encoder(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(const AudioCheckpoint c, read_audio_checkpoint(path));
  auto encoder = assemble_audio_vae_encoder(c.tensors, c.config);
  if (!encoder.ok()) return encoder.status().with_context(c.file_path);
  return encoder;
}

NamedTensors synthetic_audio_vae_tensors(const AudioVaeConfig& config, uint64_t seed, bool with_encoder) {
  NamedTensors out;
  const std::vector<float> taps = kaiser_sinc_filter(0.5 / kAliasFreeRatio, 0.6 / kAliasFreeRatio, kAliasFreeTaps);
  for (const auto& spec : audio_vae_schema(config)) {
    if (!with_encoder && spec.part == AudioVaePart::kEncoder) continue;
    Tensor t = Tensor::empty(spec.shape, DType::kF32);
    float* v = t.data_as<float>();
    const int64_t n = t.numel();
    const std::string& name = spec.name;
    if (ends_with(name, ".filter")) {
      std::copy(taps.begin(), taps.end(), v);
    } else if (ends_with(name, "zero_k_bias")) {
      std::fill(v, v + n, 0.0f);
    } else {
      fill_normal(v, n, seed, h3::fnv1a64(name));
      float scale = 0.1f, offset = 0.0f;  // snake parameters (log space), q/v biases
      if (ends_with(name, ".bias")) {
        scale = 0.01f;
      } else if (name == "decoder.conv_post.weight_g") {
        offset = 0.25f;  // keeps most of the synthetic waveform inside the clamp
        scale = 0.0f;
      } else if (ends_with(name, ".weight_g")) {
        offset = 1.0f;  // fused rows of norm ~1
      } else if (ends_with(name, ".alpha") && spec.shape.rank() == 3) {
        offset = 1.0f;  // the encoder's Snake frequencies are linear, not log
      } else if ((ends_with(name, ".weight") || ends_with(name, ".weight_v")) && spec.shape.rank() >= 2) {
        scale = static_cast<float>(1.0 / std::sqrt(double(n / spec.shape[0])));
      } else if (ends_with(name, ".weight")) {  // layer norms
        offset = 1.0f;
      }
      for (int64_t i = 0; i < n; ++i) v[i] = offset + scale * v[i];
    }
    out.emplace_back(name, std::move(t));
  }
  return out;
}

}  // namespace vortex::vae
