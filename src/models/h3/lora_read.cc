// Reading a LoRA file into modules on the diffusers layout's linears (see lora.h for the layouts).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/quote.h"
#include "formats/safetensors.h"
#include "models/h3/lora.h"

namespace vortex::h3 {

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// A module as the file holds it, before it is placed on a diffusers linear.
struct FilePair {
  std::string source;  // the file's module name (for messages)
  Tensor down, up;     // as stored
  std::optional<double> alpha;
};

// A placed module whose scale is not resolved yet.
struct Placed {
  std::string target, source;
  Tensor down, up;  // F32
  std::optional<double> alpha;
  Tensor magnitude, bias;  // F32 [out] or empty (diffusers layouts only: peft's DoRA and lora_bias)
};

// `t` as a contiguous F32 tensor of `rank` (2: a factor; 1: a DoRA magnitude or a lora_B bias), every
// element finite.
Result<Tensor> finite_f32(const Tensor& t, const std::string& name, int rank) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
    return invalid_argument("tensor " + quote(name) + ": dtype " + dtype_name(t.dtype()) +
                            " (LoRA tensors are F32, BF16 or F16)");
  }
  if (t.rank() != rank) {
    return invalid_argument("tensor " + quote(name) + " is " + t.describe() + ", expected a " +
                            (rank == 2 ? "matrix" : "vector"));
  }
  Tensor f = t.dtype() == DType::kF32 ? t.contiguous() : *t.to(DType::kF32);
  const float* p = f.data_as<const float>();
  for (int64_t i = 0; i < f.numel(); ++i) {
    if (!std::isfinite(p[i]))
      return invalid_argument("tensor " + quote(name) + ": element " + std::to_string(i) + " is not finite");
  }
  return f;
}
Result<Tensor> as_f32(const Tensor& t, const std::string& name) { return finite_f32(t, name, 2); }

Result<double> scalar_value(const Tensor& t, const std::string& name) {
  if (t.numel() != 1) return invalid_argument("tensor " + quote(name) + " is " + t.describe() + ", expected one alpha");
  auto f = t.contiguous().to(DType::kF32);
  if (!f.ok()) return invalid_argument("tensor " + quote(name) + ": dtype " + dtype_name(t.dtype()) + " for an alpha");
  const double v = f->data_as<const float>()[0];
  if (!std::isfinite(v) || v <= 0)
    return invalid_argument("tensor " + quote(name) + ": alpha " + std::to_string(v) + " is not a positive number");
  return v;
}

// The file's tensors by name, taken as they are placed; whatever is left was not understood.
class FileTensors {
 public:
  std::map<std::string, Tensor> by_name;

  // The (down, up[, alpha]) pair of `base`, or nothing when its down factor is absent.
  Result<std::optional<FilePair>> pull(const std::string& base, const std::string& down_suffix,
                                       const std::string& up_suffix) {
    auto down = by_name.find(base + down_suffix);
    if (down == by_name.end()) return std::optional<FilePair>();
    auto up = by_name.find(base + up_suffix);
    if (up == by_name.end()) {
      return invalid_argument("tensor " + quote(base + down_suffix) + " has no " + quote(base + up_suffix));
    }
    FilePair pair{base, down->second, up->second, std::nullopt};
    by_name.erase(down);
    by_name.erase(up);
    auto alpha = by_name.find(base + ".alpha");
    if (alpha != by_name.end()) {
      VORTEX_ASSIGN_OR_RETURN(double a, scalar_value(alpha->second, alpha->first));
      pair.alpha = a;
      by_name.erase(alpha);
    }
    return std::optional<FilePair>(std::move(pair));
  }
};

// musubi-tuner flattens every dot of a module name to `_`; H3's names hold underscores of their own,
// so the dotted name is recovered by matching the whole flattened name.
Result<std::string> unflatten_musubi(const std::string& key) {
  static const std::pair<const char*, const char*> kModules[] = {
      {R"(blocks_(\d+)_attn_(qkv|out)_proj)", "blocks.$1.attn.$2_proj"},
      {R"(blocks_(\d+)_mlp_fc([12]))", "blocks.$1.mlp.fc$2"},
      {R"(blocks_(\d+)_adaln_proj_linear)", "blocks.$1.adaln_proj.linear"},
      {R"(token_refiner_blocks_(\d+)_attn_(qkv|out)_proj)", "token_refiner.blocks.$1.attn.$2_proj"},
      {R"(token_refiner_blocks_(\d+)_mlp_fc([12]))", "token_refiner.blocks.$1.mlp.fc$2"},
      {R"((video|audio)_patch_proj)", "$1_patch_proj"},
      {R"(condition_proj)", "condition_proj"},
      {R"(time_embedder_proj_(in|out))", "time_embedder.proj_$1"},
      {R"(final_layer_adaln_proj_linear)", "final_layer.adaln_proj.linear"},
      {R"(final_layer_(video|audio)_out)", "final_layer.$1_out"},
  };
  const std::string flat = key.substr(std::string("lora_unet_").size());
  const size_t dot = flat.find('.');
  const std::string module = flat.substr(0, dot), suffix = dot == std::string::npos ? "" : flat.substr(dot);
  for (const auto& [pattern, replacement] : kModules) {
    const std::regex re(pattern);
    if (std::regex_match(module, re)) return std::regex_replace(module, re, replacement) + suffix;
  }
  return invalid_argument("tensor " + quote(key) + " names no H3 module in musubi-tuner's `lora_unet_` layout");
}

// The original checkpoint's names, placed as diffusers' _convert_non_diffusers_minimax_h3_lora_to_diffusers
// places them: the names first made plain (prefix, peft infix, musubi's flattening), then the modules
// outside the blocks, then each block's.
class OriginalPlacer {
 public:
  OriginalPlacer(FileTensors& file, const H3Config& config) : file_(file), config_(config) {}

  Result<std::vector<Placed>> place(std::string& format) {
    VORTEX_RETURN_IF_ERROR(plain_names(format));
    VORTEX_RETURN_IF_ERROR(place_standalone());
    for (const auto& [source, target] : {std::pair<std::string, std::string>{"blocks", "transformer_blocks"},
                                         {"token_refiner.blocks", "token_refiner.refiner_blocks"}}) {
      const std::regex block_re("^" + replace_all(source, ".", "\\.") + "\\.(\\d+)\\.");
      int64_t layers = 0;
      for (const auto& [name, t] : file_.by_name) {
        std::smatch m;
        if (std::regex_search(name, m, block_re) && m[1].length() < 7) {
          layers = std::max<int64_t>(layers, std::stoll(m[1]) + 1);
        }
      }
      for (int64_t i = 0; i < layers; ++i) {
        VORTEX_RETURN_IF_ERROR(place_block(source + "." + std::to_string(i), target + "." + std::to_string(i)));
      }
    }
    if (!file_.by_name.empty()) {
      return invalid_argument("tensor " + quote(file_.by_name.begin()->first) +
                              " is not a LoRA factor of an H3 linear in this layout (" + format + ")");
    }
    return std::move(placed_);
  }

 private:
  // Drops `diffusion_model.`, DiffSynth's `.default.` infix and musubi's `lora_unet_` flattening, and
  // picks the factor suffixes (kohya's lora_down / lora_up, or lora_A / lora_B).
  Status plain_names(std::string& format) {
    std::map<std::string, Tensor> names;
    bool prefixed = false, musubi = false, kohya = false;
    for (auto& [name, t] : file_.by_name) {
      prefixed |= name.starts_with("diffusion_model.");
      names[name.starts_with("diffusion_model.") ? name.substr(16) : name] = t;
    }
    for (const auto& [name, t] : names) {
      diffsynth_ |= contains(name, ".lora_A.default.weight") || contains(name, ".lora_B.default.weight");
      musubi |= name.starts_with("lora_unet_");
    }
    file_.by_name.clear();
    for (auto& [name, t] : names) {
      std::string plain = name;
      if (diffsynth_)
        plain = replace_all(replace_all(plain, ".lora_A.default.", ".lora_A."), ".lora_B.default.", ".lora_B.");
      if (musubi) {
        if (!name.starts_with("lora_unet_")) {
          return invalid_argument("tensor " + quote(name) + " is not under `lora_unet_` like the rest");
        }
        VORTEX_ASSIGN_OR_RETURN(plain, unflatten_musubi(name));
      }
      kohya |= contains(plain, ".lora_down.weight");
      file_.by_name[plain] = t;
    }
    down_suffix_ = kohya ? ".lora_down.weight" : ".lora_A.weight";
    up_suffix_ = kohya ? ".lora_up.weight" : ".lora_B.weight";
    if (musubi) {
      format = "musubi-tuner (lora_unet_)";
    } else if (diffsynth_) {
      format = "DiffSynth-Studio (original names, interleaved QKV)";
    } else {
      format = std::string("original names") + (prefixed ? " under diffusion_model." : "") + (kohya ? ", kohya" : "");
    }
    return ok_status();
  }

  Status place_standalone() {
    static const std::pair<const char*, const char*> kStandalone[] = {
        {"video_patch_proj", "proj_in"},
        {"audio_patch_proj", "audio_proj_in"},
        {"condition_proj", "context_embedder"},
        {"time_embedder.proj_in", "time_embedder.linear_1"},
        {"time_embedder.proj_out", "time_embedder.linear_2"},
        {"final_layer.adaln_proj.linear", "norm_out.linear"},
        {"final_layer.video_out", "proj_out"},
        {"final_layer.audio_out", "audio_proj_out"},
    };
    for (const auto& [source, target] : kStandalone) {
      VORTEX_ASSIGN_OR_RETURN(auto pair, file_.pull(source, down_suffix_, up_suffix_));
      if (!pair) continue;
      VORTEX_ASSIGN_OR_RETURN(Tensor up, up_rows(*pair, 0, pair->up.size(0)));
      VORTEX_RETURN_IF_ERROR(add(*pair, target, std::move(up)));
    }
    return ok_status();
  }

  // One block (or refiner block): the fused QKV split into to_q / to_k / to_v (A shared, B in thirds,
  // DiffSynth's [h0: q k v, h1: q k v, ...] rows regrouped first), FC1's B halves swapped from
  // [gate; value] to [value; gate], the rest renamed.
  Status place_block(const std::string& source, const std::string& target) {
    const int64_t inner = config_.inner_dim(), ffn = config_.ffn_dim;
    VORTEX_ASSIGN_OR_RETURN(auto qkv, file_.pull(source + ".attn.qkv_proj", down_suffix_, up_suffix_));
    if (qkv) {
      if (qkv->up.rank() != 2 || qkv->up.size(0) != 3 * inner) {
        return invalid_argument("tensor " + quote(qkv->source + up_suffix_) + " is " + qkv->up.describe() +
                                ": a fused QKV of this model has 3 x " + std::to_string(inner) + " output rows");
      }
      VORTEX_ASSIGN_OR_RETURN(Tensor up, up_rows(*qkv, 0, 3 * inner));
      if (diffsynth_) {
        const int64_t heads = config_.num_attention_heads, d = config_.attention_head_dim, r = up.size(1);
        Tensor grouped = Tensor::empty(up.shape(), DType::kF32);
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t part = 0; part < 3; ++part) {
            std::copy_n(up.data_as<const float>() + (h * 3 + part) * d * r, d * r,
                        grouped.data_as<float>() + (part * heads + h) * d * r);
          }
        }
        up = grouped;
      }
      const char* parts[3] = {".attn.to_q", ".attn.to_k", ".attn.to_v"};
      for (int p = 0; p < 3; ++p) {
        VORTEX_ASSIGN_OR_RETURN(Tensor rows, up.slice(0, p * inner, (p + 1) * inner));
        VORTEX_RETURN_IF_ERROR(add(*qkv, target + parts[p], rows.contiguous()));
      }
    }
    VORTEX_ASSIGN_OR_RETURN(auto fc1, file_.pull(source + ".mlp.fc1", down_suffix_, up_suffix_));
    if (fc1) {
      if (fc1->up.rank() != 2 || fc1->up.size(0) != 2 * ffn) {
        return invalid_argument("tensor " + quote(fc1->source + up_suffix_) + " is " + fc1->up.describe() +
                                ": this model's fused SwiGLU projection has 2 x " + std::to_string(ffn) +
                                " output rows");
      }
      VORTEX_ASSIGN_OR_RETURN(Tensor gate, up_rows(*fc1, 0, ffn));
      VORTEX_ASSIGN_OR_RETURN(Tensor value, up_rows(*fc1, ffn, 2 * ffn));
      Tensor swapped = Tensor::empty(fc1->up.shape(), DType::kF32);
      std::copy_n(value.data_as<const float>(), value.numel(), swapped.data_as<float>());
      std::copy_n(gate.data_as<const float>(), gate.numel(), swapped.data_as<float>() + value.numel());
      VORTEX_RETURN_IF_ERROR(add(*fc1, target + ".ff.net.0.proj", swapped));
    }
    for (const auto& [from, to] : {std::pair<std::string, std::string>{".attn.out_proj", ".attn.to_out.0"},
                                   {".mlp.fc2", ".ff.net.2"},
                                   {".adaln_proj.linear", ".adaln_proj.linear"}}) {
      VORTEX_ASSIGN_OR_RETURN(auto pair, file_.pull(source + from, down_suffix_, up_suffix_));
      if (!pair) continue;
      VORTEX_ASSIGN_OR_RETURN(Tensor up, up_rows(*pair, 0, pair->up.size(0)));
      VORTEX_RETURN_IF_ERROR(add(*pair, target + to, std::move(up)));
    }
    return ok_status();
  }

  // Rows [begin, end) of the pair's up factor, as F32.
  Result<Tensor> up_rows(const FilePair& pair, int64_t begin, int64_t end) const {
    VORTEX_ASSIGN_OR_RETURN(Tensor up, as_f32(pair.up, pair.source + up_suffix_));
    VORTEX_ASSIGN_OR_RETURN(Tensor rows, up.slice(0, begin, end));
    return rows.contiguous();
  }

  Status add(const FilePair& pair, const std::string& target, Tensor up) {
    VORTEX_ASSIGN_OR_RETURN(Tensor down, as_f32(pair.down, pair.source + down_suffix_));
    placed_.push_back({target, pair.source, down, std::move(up), pair.alpha, {}, {}});
    return ok_status();
  }

  FileTensors& file_;
  const H3Config& config_;
  bool diffsynth_ = false;
  std::string down_suffix_, up_suffix_;
  std::vector<Placed> placed_;
};

// diffusers' names: `<partition>.<module>.lora_{A,B}.weight`, a peft dump's `.default.` infix, or bare.
Result<std::vector<Placed>> place_diffusers(FileTensors& file, std::string& partition, std::string& format) {
  bool peft_infix = false, transformer = false, transformer_ref = false;
  for (const auto& [name, t] : file.by_name) {
    peft_infix |= contains(name, ".default.weight");
    transformer |= name.starts_with("transformer.");
    transformer_ref |= name.starts_with("transformer_ref.");
  }
  if (transformer && transformer_ref) {
    return invalid_argument(
        "it holds layers for both partitions (`transformer.` and `transformer_ref.`); a model "
        "is one partition: save each partition's layers to a file of its own");
  }
  partition = transformer_ref ? "transformer_ref" : "transformer";
  const std::string prefix = transformer || transformer_ref ? partition + "." : "";
  format = prefix.empty() ? (peft_infix ? "peft state dict (diffusers names, .default.)" : "diffusers names, no prefix")
                          : "diffusers names under " + prefix;
  // What each tensor of a module is, by its name's ending (peft's: a DoRA magnitude is saved with
  // or without `.weight`).
  static const std::pair<const char*, int> kParts[] = {{".lora_A.weight", 0},
                                                       {".lora_B.weight", 1},
                                                       {".lora_B.bias", 2},
                                                       {".lora_magnitude_vector.weight", 3},
                                                       {".lora_magnitude_vector", 3}};
  std::map<std::string, std::array<std::string, 4>> modules;  // module -> names of A, B, bias, magnitude
  for (const auto& [name, t] : file.by_name) {
    if (!name.starts_with(prefix))
      return invalid_argument("tensor " + quote(name) + " is not under " + quote(prefix) + " like the rest");
    const std::string rest =
        prefix.empty() && peft_infix ? replace_all(name, ".default.", ".") : name.substr(prefix.size());
    int part = -1;
    std::string module;
    for (const auto& [ending, index] : kParts) {
      if (!rest.ends_with(ending)) continue;
      part = index;
      module = rest.substr(0, rest.size() - std::string(ending).size());
      break;
    }
    if (part < 0) {
      return invalid_argument("tensor " + quote(name) +
                              " is none of a module's lora_A / lora_B weight, lora_B bias or DoRA magnitude");
    }
    modules[module][part] = name;
  }
  std::vector<Placed> placed;
  for (const auto& [module, names] : modules) {
    if (names[0].empty() || names[1].empty()) {
      return invalid_argument("module " + quote(module) + " has no " + (names[0].empty() ? "lora_A" : "lora_B") +
                              " weight");
    }
    Placed p{module, module, {}, {}, std::nullopt, {}, {}};
    VORTEX_ASSIGN_OR_RETURN(p.down, as_f32(file.by_name.at(names[0]), names[0]));
    VORTEX_ASSIGN_OR_RETURN(p.up, as_f32(file.by_name.at(names[1]), names[1]));
    if (!names[2].empty()) {
      VORTEX_ASSIGN_OR_RETURN(p.bias, finite_f32(file.by_name.at(names[2]), names[2], 1));
    }
    if (!names[3].empty()) {
      VORTEX_ASSIGN_OR_RETURN(p.magnitude, finite_f32(file.by_name.at(names[3]), names[3], 1));
    }
    placed.push_back(std::move(p));
  }
  return placed;
}

// peft's pattern lookup (rank_pattern, alpha_pattern): the first key that ends the module name
// after a dot or from its start, the key read as a regular expression.
Result<std::optional<double>> pattern_value(const nlohmann::json& patterns, const std::string& module) {
  if (!patterns.is_object()) return std::optional<double>();
  for (const auto& [key, value] : patterns.items()) {
    std::regex re;
    try {
      re = std::regex("(^|.*\\.)" + key + "$");
    } catch (const std::regex_error&) {
      return invalid_argument("lora_adapter_metadata: pattern " + quote(key) + " is not a regular expression");
    }
    if (!std::regex_match(module, re)) continue;
    if (!value.is_number()) return invalid_argument("lora_adapter_metadata: pattern " + quote(key) + " has no number");
    return std::optional<double>(value.get<double>());
  }
  return std::optional<double>();
}

// Scales from diffusers' `lora_adapter_metadata` (peft's LoraConfig, keys under the partition).
Status scales_from_adapter_metadata(const std::string& text, const std::string& partition, std::vector<Placed>& placed,
                                    std::vector<LoraModule>& modules) {
  const nlohmann::json meta = nlohmann::json::parse(text, nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) return invalid_argument("lora_adapter_metadata is not a JSON object");
  auto field = [&](const std::string& key) {
    return meta.contains(partition + "." + key) ? meta[partition + "." + key] : nlohmann::json();
  };
  const nlohmann::json r = field("r"), alpha = field("lora_alpha");
  if (!r.is_number() || r.get<double>() <= 0)
    return invalid_argument("lora_adapter_metadata: no positive " + quote(partition + ".r"));
  if (!alpha.is_null() && !alpha.is_number())
    return invalid_argument("lora_adapter_metadata: " + quote(partition + ".lora_alpha") + " is not a number");
  // peft builds the adapter from this config; tensors it does not describe would be dropped, and
  // DoRA without its magnitudes would start from the base weights' norms: both refused.
  const bool use_dora = field("use_dora").is_boolean() && field("use_dora").get<bool>();
  const bool lora_bias = field("lora_bias").is_boolean() && field("lora_bias").get<bool>();
  for (const Placed& p : placed) {
    if (use_dora != p.magnitude.defined()) {
      return invalid_argument("lora_adapter_metadata says use_dora " + std::string(use_dora ? "true" : "false") +
                              " but module " + quote(p.source) + (use_dora ? " has no" : " has a") +
                              " lora_magnitude_vector");
    }
    if (!lora_bias && p.bias.defined()) {
      return invalid_argument("lora_adapter_metadata says lora_bias false but module " + quote(p.source) +
                              " has a lora_B bias");
    }
  }
  const bool rslora = field("use_rslora").is_boolean() && field("use_rslora").get<bool>();
  for (size_t i = 0; i < placed.size(); ++i) {
    VORTEX_ASSIGN_OR_RETURN(auto rank, pattern_value(field("rank_pattern"), placed[i].target));
    VORTEX_ASSIGN_OR_RETURN(auto module_alpha, pattern_value(field("alpha_pattern"), placed[i].target));
    const double module_rank = rank.value_or(r.get<double>());
    if (module_rank != static_cast<double>(placed[i].down.size(0))) {
      return invalid_argument("module " + quote(placed[i].source) + " has rank " +
                              std::to_string(placed[i].down.size(0)) + " but lora_adapter_metadata gives it " +
                              std::to_string(module_rank));
    }
    const double a = module_alpha.value_or(alpha.is_number() ? alpha.get<double>() : 8.0);
    modules[i].scale = a / (rslora ? std::sqrt(module_rank) : module_rank);
  }
  return ok_status();
}

}  // namespace

bool is_lora_tensor_name(const std::string& name) {
  for (const char* factor : {".lora_A.", ".lora_B.", ".lora_down.", ".lora_up."}) {
    if (contains(name, factor)) return true;
  }
  return name.starts_with("lora_unet_");
}

Result<LoraAdapter> read_lora(const std::string& path, const H3Config& config) {
  auto fail = [&](const Status& s) { return s.with_context("LoRA " + path); };
  auto opened = SafetensorsFile::open(path);
  if (!opened.ok()) return fail(opened.status());
  const SafetensorsFile& file = *opened;
  if (file.names().empty()) return fail(invalid_argument("it holds no tensors"));
  FileTensors tensors;
  bool original = false, alpha_tensors = false;
  for (const std::string& name : file.names()) {
    // kohya's DoRA layout: diffusers drops these tensors with a warning and loads the rest, which is
    // not the adapter as trained; refused instead (README).
    if (contains(name, "dora_scale")) {
      return fail(invalid_argument("tensor " + quote(name) + ": kohya's DoRA layout (dora_scale) is not supported; "
                                   "peft's (lora_magnitude_vector, diffusers names) is"));
    }
    for (const char* p : {"diffusion_model.", "blocks.", "token_refiner.blocks.", "final_layer.", "lora_unet_"}) {
      original |= name.starts_with(p);
    }
    alpha_tensors |= name.ends_with(".alpha");
    auto t = file.get(name);
    if (!t.ok()) return fail(t.status());
    tensors.by_name[name] = *t;
  }
  // The original checkpoint's layouts have no DoRA magnitudes or biases: diffusers' converter
  // refuses what it cannot place, and so does ours.
  if (original) {
    for (const auto& [name, t] : tensors.by_name) {
      if (contains(name, "lora_magnitude_vector"))
        return fail(invalid_argument("tensor " + quote(name) + ": DoRA magnitudes in the original checkpoint's "
                                     "names (diffusers reads them only under its own names)"));
      if (name.ends_with(".bias") && (contains(name, ".lora_B") || contains(name, ".lora_up")))
        return fail(invalid_argument("tensor " + quote(name) + ": LoRA biases in the original checkpoint's names "
                                     "(diffusers reads them only under its own names)"));
    }
  }
  LoraAdapter adapter;
  adapter.path = path;
  adapter.partition = "transformer";
  auto placed = original ? OriginalPlacer(tensors, config).place(adapter.format)
                         : place_diffusers(tensors, adapter.partition, adapter.format);
  if (!placed.ok()) return fail(placed.status());

  // Every module on a linear of this model, once, with factors that fit it.
  std::map<std::string, Shape> linears;
  std::set<std::string> with_bias;
  for (const TensorSpec& spec : diffusers_schema(config)) {
    if (spec.name.ends_with(".weight") && spec.shape.rank() == 2)
      linears[spec.name.substr(0, spec.name.size() - 7)] = spec.shape;
    if (spec.name.ends_with(".bias")) with_bias.insert(spec.name.substr(0, spec.name.size() - 5));
  }
  std::set<std::string> seen;
  for (Placed& p : *placed) {
    auto linear = linears.find(p.target);
    if (linear == linears.end()) {
      return fail(invalid_argument("module " + quote(p.source) + " targets " + quote(p.target) +
                                   ", which this model (" + std::to_string(config.num_layers) + " blocks, " +
                                   std::to_string(config.num_refiner_layers) + " refiner blocks) does not have"));
    }
    if (!seen.insert(p.target).second) return fail(invalid_argument("two modules target " + quote(p.target)));
    const Shape& w = linear->second;  // [out, in]
    const int64_t rank = p.down.size(0);
    if (rank < 1 || p.up.size(1) != rank || p.up.size(0) != w[0] || p.down.size(1) != w[1]) {
      return fail(invalid_argument("module " + quote(p.source) + ": factors A " + p.down.shape().to_string() +
                                   " and B " + p.up.shape().to_string() + " do not fit " + quote(p.target) + " " +
                                   w.to_string() + " (A [rank, in], B [out, rank]; a LoRA for another checkpoint?)"));
    }
    for (const auto& [vector, what] : {std::pair{&p.magnitude, "lora_magnitude_vector"}, {&p.bias, "lora_B bias"}}) {
      if (vector->defined() && vector->size(0) != w[0]) {
        return fail(invalid_argument("module " + quote(p.source) + ": its " + what + " " + vector->shape().to_string() +
                                     " does not fit " + quote(p.target) + " " + w.to_string()));
      }
    }
    // peft adds such a bias unmerged where the linear has none; a merge has nowhere to put it.
    if (p.bias.defined() && !with_bias.count(p.target)) {
      return fail(invalid_argument("module " + quote(p.source) + " has a lora_B bias, but " + quote(p.target) +
                                   " has no bias in this model (peft cannot merge it either)"));
    }
    adapter.modules.push_back({p.target, p.source, p.down, p.up, p.magnitude, p.bias, 1.0});
  }
  if (adapter.modules.empty()) return fail(invalid_argument("it holds no LoRA module"));
  const auto with = [&](Tensor LoraModule::*part) {
    return std::find_if(adapter.modules.begin(), adapter.modules.end(),
                        [&](const LoraModule& m) { return (m.*part).defined(); });
  };
  if (with(&LoraModule::magnitude) != adapter.modules.end() && with(&LoraModule::bias) != adapter.modules.end()) {
    return fail(invalid_argument("module " + quote(with(&LoraModule::magnitude)->source) + " is DoRA and module " +
                                 quote(with(&LoraModule::bias)->source) +
                                 " has a lora_B bias: peft refuses lora_bias with use_dora"));
  }

  const auto& meta = file.metadata();
  if (alpha_tensors) {
    adapter.alpha_source = ".alpha tensors";
    for (size_t i = 0; i < placed->size(); ++i) {
      const auto& alpha = (*placed)[i].alpha;
      if (alpha) adapter.modules[i].scale = *alpha / static_cast<double>(adapter.modules[i].down.size(0));
    }
  } else if (meta.count("lora_adapter_metadata")) {
    adapter.alpha_source = "lora_adapter_metadata";
    Status s =
        scales_from_adapter_metadata(meta.at("lora_adapter_metadata"), adapter.partition, *placed, adapter.modules);
    if (!s.ok()) return fail(s);
  } else if (meta.count("alpha")) {
    const std::string& text = meta.at("alpha");
    char* end = nullptr;
    const double alpha = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size()) {
      adapter.alpha_source = "none (alpha == rank)";
      adapter.warnings.push_back("its __metadata__ alpha " + quote(text) +
                                 " is not a number: ignored, loaded at alpha == rank");
    } else if (!std::isfinite(alpha) || alpha <= 0) {
      return fail(invalid_argument("its __metadata__ alpha " + quote(text) + " is not a positive number"));
    } else {
      adapter.alpha_source = "__metadata__ alpha " + text;
      for (LoraModule& m : adapter.modules) m.scale = alpha / static_cast<double>(m.down.size(0));
    }
  } else {
    adapter.alpha_source = "none (alpha == rank)";
  }
  return adapter;
}

}  // namespace vortex::h3
