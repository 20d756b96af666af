#include "text/qwen3_vision_encoder.h"

#include <cmath>
#include <filesystem>

#include "core/portable_math.h"
#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "cpu/gemm.h"
#include "cpu/image_resize.h"
#include "cpu/norm.h"
#include "cpu/rows.h"
#include "models/h3/tensor_views.h"
#include "text/hf_files.h"

namespace vortex::text {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;


Result<int64_t> optional_positive_int(const json& j, const std::string& key, int64_t fallback,
                                      const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return positive_int(j, key, where);
}

Result<std::array<double, 3>> channel_triple(const json& j, const std::string& key, std::array<double, 3> fallback,
                                             const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (v.is_number()) return std::array<double, 3>{v.get<double>(), v.get<double>(), v.get<double>()};
  if (!v.is_array() || v.size() != 3 || !v[0].is_number() || !v[1].is_number() || !v[2].is_number()) {
    return corrupt_data(where + ": '" + key + "' is " + v.dump() + ", expected three numbers");
  }
  return std::array<double, 3>{v[0].get<double>(), v[1].get<double>(), v[2].get<double>()};
}

// The processors resize, rescale and normalise; a config that turns one off is another recipe.
Status check_recipe_flags(const json& p, const std::string& at) {
  for (const char* flag : {"do_resize", "do_rescale", "do_normalize"}) {
    if (p.contains(flag) && p[flag].is_boolean() && !p[flag].get<bool>()) {
      return unimplemented(at + ": " + flag + " is false (the Qwen3-VL recipe resizes, rescales and normalises)");
    }
  }
  return ok_status();
}

// rescale_factor, image_mean and image_std, missing ones taking the processor class's defaults.
Status read_normalisation(const json& p, const std::string& at, std::array<double, 3> default_mean,
                          std::array<double, 3> default_std, double* rescale, std::array<double, 3>* mean,
                          std::array<double, 3>* stdev) {
  if (p.contains("rescale_factor")) {
    if (!p["rescale_factor"].is_number() || p["rescale_factor"].get<double>() <= 0.0) {
      return corrupt_data(at + ": rescale_factor is " + p["rescale_factor"].dump());
    }
    *rescale = p["rescale_factor"].get<double>();
  }
  VORTEX_ASSIGN_OR_RETURN(*mean, channel_triple(p, "image_mean", default_mean, at));
  VORTEX_ASSIGN_OR_RETURN(*stdev, channel_triple(p, "image_std", default_std, at));
  for (double s : *stdev) {
    if (!(s > 0.0)) return corrupt_data(at + ": image_std has a value that is not positive");
  }
  return ok_status();
}

// The patch's (row, column) in its image for patch index i in block-major order.
std::array<int64_t, 2> patch_position(int64_t i, const VisionGrid& grid) {
  const int64_t m = grid.merge, blocks_w = grid.width / m;
  const int64_t block_row = i / (m * m * blocks_w), block_col = (i / (m * m)) % blocks_w;
  return {block_row * m + (i / m) % m, block_col * m + i % m};
}

// Bilinear (align_corners) taps of a `side`-long table for position `index` of `size`, in fp32 as
// the reference computes them: src = index · (side − 1) / max(size − 1, 1), weights 1 − |distance|.
void axis_taps(int64_t index, int64_t size, int64_t side, int64_t taps[2], float weights[2]) {
  const float src = static_cast<float>(index) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float floor = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    taps[o] = std::clamp<int64_t>(static_cast<int64_t>(floor) + o, 0, side - 1);
    const float distance = std::fabs(src - floor - static_cast<float>(o));
    weights[o] = std::max(1.0f - distance, 0.0f);
  }
}

Status check_blocks_arg(int64_t first, int64_t last, int64_t depth) {
  if (first < 0 || last < first || last > depth) {
    return invalid_argument("vision blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                            ") are outside the tower's 0.." + std::to_string(depth));
  }
  return ok_status();
}

}  // namespace

Result<Qwen3VisionConfig> Qwen3VisionConfig::from_json(const json& config, const std::string& where) {
  if (!config.contains("vision_config") || !config["vision_config"].is_object()) {
    return corrupt_data(where + ": no vision_config object (not a Qwen3-VL config)");
  }
  const json& v = config["vision_config"];
  const std::string at = where + ": vision_config";
  Qwen3VisionConfig c;
  VORTEX_ASSIGN_OR_RETURN(c.depth, positive_int(v, "depth", at));
  VORTEX_ASSIGN_OR_RETURN(c.hidden, positive_int(v, "hidden_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.intermediate, positive_int(v, "intermediate_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.heads, positive_int(v, "num_heads", at));
  VORTEX_ASSIGN_OR_RETURN(c.in_channels, optional_positive_int(v, "in_channels", 3, at));
  VORTEX_ASSIGN_OR_RETURN(c.patch, positive_int(v, "patch_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.merge, positive_int(v, "spatial_merge_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.temporal_patch, positive_int(v, "temporal_patch_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.out_hidden, positive_int(v, "out_hidden_size", at));
  VORTEX_ASSIGN_OR_RETURN(c.num_position_embeddings, positive_int(v, "num_position_embeddings", at));
  c.position_grid_side = static_cast<int64_t>(std::sqrt(static_cast<double>(c.num_position_embeddings)));
  if (c.position_grid_side * c.position_grid_side != c.num_position_embeddings) {
    return corrupt_data(at + ": num_position_embeddings " + std::to_string(c.num_position_embeddings) +
                        " is not a square");
  }
  if (c.in_channels != 3) return unimplemented(at + ": in_channels " + std::to_string(c.in_channels) + " (RGB only)");
  if (c.hidden % c.heads != 0 || c.head_dim() % 4 != 0) {
    return corrupt_data(at + ": hidden_size " + std::to_string(c.hidden) + " over num_heads " +
                        std::to_string(c.heads) + " is not a head dim that is a multiple of 4");
  }
  if (v.value("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh") {
    return unimplemented(at + ": hidden_act " + v["hidden_act"].dump() + " (only gelu_pytorch_tanh is supported)");
  }
  if (v.contains("deepstack_visual_indexes")) {
    const json& d = v["deepstack_visual_indexes"];
    if (!d.is_array()) return corrupt_data(at + ": deepstack_visual_indexes is not a list");
    for (const json& i : d) {
      if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= c.depth ||
          (!c.deepstack_layers.empty() && i.get<int64_t>() <= c.deepstack_layers.back())) {
        return corrupt_data(at + ": deepstack_visual_indexes " + d.dump() + " must rise within 0.." +
                            std::to_string(c.depth - 1));
      }
      c.deepstack_layers.push_back(i.get<int64_t>());
    }
  }
  if (v.contains("rope_parameters") && v["rope_parameters"].is_object()) {
    const json& r = v["rope_parameters"];
    if (r.value("rope_type", "axial") != "axial") {
      return unimplemented(at + ": rope_type " + r["rope_type"].dump() + " (only \"axial\" is supported)");
    }
    if (r.contains("rope_theta")) {
      if (!r["rope_theta"].is_number() || r["rope_theta"].get<double>() <= 1.0) {
        return corrupt_data(at + ": rope_parameters.rope_theta is " + r["rope_theta"].dump());
      }
      c.rope_theta = r["rope_theta"].get<double>();
    }
  }
  return c;
}

Result<Qwen3ImageProcessorConfig> Qwen3ImageProcessorConfig::from_json(const json& config, const std::string& where) {
  // processor_config.json nests the image processor's settings; preprocessor_config.json is them.
  const bool nested = config.contains("image_processor") && config["image_processor"].is_object();
  const json& p = nested ? config["image_processor"] : config;
  const std::string at = nested ? where + ": image_processor" : where;
  const std::string type = p.value("image_processor_type", "Qwen2VLImageProcessor");
  if (type.rfind("Qwen2VLImageProcessor", 0) != 0) {
    return unimplemented(at + ": image_processor_type " + type + " (Qwen2VLImageProcessor expected)");
  }
  VORTEX_RETURN_IF_ERROR(check_recipe_flags(p, at));
  // Missing fields take Qwen2VLImageProcessor's class defaults, as transformers does.
  Qwen3ImageProcessorConfig c;
  VORTEX_ASSIGN_OR_RETURN(c.patch, optional_positive_int(p, "patch_size", 14, at));
  VORTEX_ASSIGN_OR_RETURN(c.merge, optional_positive_int(p, "merge_size", 2, at));
  VORTEX_ASSIGN_OR_RETURN(c.temporal_patch, optional_positive_int(p, "temporal_patch_size", 2, at));
  c.min_pixels = 56 * 56;
  c.max_pixels = 28 * 28 * 1280;
  if (p.contains("size") && p["size"].is_object()) {
    VORTEX_ASSIGN_OR_RETURN(c.min_pixels, positive_int(p["size"], "shortest_edge", at + ": size"));
    VORTEX_ASSIGN_OR_RETURN(c.max_pixels, positive_int(p["size"], "longest_edge", at + ": size"));
  }
  VORTEX_ASSIGN_OR_RETURN(c.min_pixels, optional_positive_int(p, "min_pixels", c.min_pixels, at));
  VORTEX_ASSIGN_OR_RETURN(c.max_pixels, optional_positive_int(p, "max_pixels", c.max_pixels, at));
  if (c.min_pixels > c.max_pixels) {
    return corrupt_data(at + ": min_pixels " + std::to_string(c.min_pixels) + " exceeds max_pixels " +
                        std::to_string(c.max_pixels));
  }
  // Qwen2VLImageProcessor's defaults are OpenAI CLIP's mean and std.
  VORTEX_RETURN_IF_ERROR(read_normalisation(p, at, {0.48145466, 0.4578275, 0.40821073},
                                            {0.26862954, 0.26130258, 0.27577711}, &c.rescale_factor, &c.mean, &c.std));
  return c;
}

Result<std::array<int64_t, 2>> Qwen3ImageProcessorConfig::target_size(int64_t height, int64_t width) const {
  if (height < 1 || width < 1) return invalid_argument("image is " + std::to_string(height) + " x " +
                                                       std::to_string(width) + " pixels");
  if (std::max(height, width) > 200 * std::min(height, width)) {
    return invalid_argument("image " + std::to_string(height) + " x " + std::to_string(width) +
                            ": the image processor takes aspect ratios below 200");
  }
  const int64_t factor = patch * merge;
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  int64_t h_bar = python_round(h / f) * factor, w_bar = python_round(w / f) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return std::array<int64_t, 2>{h_bar, w_bar};
}

Result<Qwen3VideoProcessorConfig> Qwen3VideoProcessorConfig::from_json(const json& config, const std::string& where) {
  // processor_config.json nests the video processor's settings; video_preprocessor_config.json is them.
  const bool nested = config.contains("video_processor") && config["video_processor"].is_object();
  const json& p = nested ? config["video_processor"] : config;
  const std::string at = nested ? where + ": video_processor" : where;
  const std::string type = p.value("video_processor_type", "Qwen3VLVideoProcessor");
  if (type.rfind("Qwen3VLVideoProcessor", 0) != 0) {
    return unimplemented(at + ": video_processor_type " + type + " (Qwen3VLVideoProcessor expected)");
  }
  VORTEX_RETURN_IF_ERROR(check_recipe_flags(p, at));
  if (p.contains("cap_pixels_per_frame") && p["cap_pixels_per_frame"].is_boolean() &&
      p["cap_pixels_per_frame"].get<bool>()) {
    return unimplemented(at + ": cap_pixels_per_frame is true (only the uncapped pixel budget is implemented)");
  }
  // Missing fields take Qwen3VLVideoProcessor's class defaults, as transformers does.
  Qwen3VideoProcessorConfig c;
  VORTEX_ASSIGN_OR_RETURN(c.patch, optional_positive_int(p, "patch_size", 16, at));
  VORTEX_ASSIGN_OR_RETURN(c.merge, optional_positive_int(p, "merge_size", 2, at));
  VORTEX_ASSIGN_OR_RETURN(c.temporal_patch, optional_positive_int(p, "temporal_patch_size", 2, at));
  c.min_pixels = 128 * 32 * 32;
  c.max_pixels = 768 * 32 * 32;
  if (p.contains("size") && p["size"].is_object()) {
    VORTEX_ASSIGN_OR_RETURN(c.min_pixels, positive_int(p["size"], "shortest_edge", at + ": size"));
    VORTEX_ASSIGN_OR_RETURN(c.max_pixels, positive_int(p["size"], "longest_edge", at + ": size"));
  }
  VORTEX_RETURN_IF_ERROR(read_normalisation(p, at, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, &c.rescale_factor, &c.mean,
                                            &c.std));
  return c;
}

Result<std::array<int64_t, 2>> Qwen3VideoProcessorConfig::target_size(int64_t frames, int64_t height,
                                                                      int64_t width) const {
  if (height < 1 || width < 1 || frames < temporal_patch) {
    return invalid_argument("video of " + std::to_string(frames) + " frames of " + std::to_string(height) + " x " +
                            std::to_string(width) + " pixels (the video processor takes at least " +
                            std::to_string(temporal_patch) + " frames)");
  }
  const int64_t factor = patch * merge;
  double h = static_cast<double>(height), w = static_cast<double>(width);
  const double f = static_cast<double>(factor), t = static_cast<double>(frames);
  if (height < factor || width < factor) {  // scaled up until both sides reach a factor, truncated
    const double scale = std::max(f / h, f / w);
    h = std::trunc(h * scale);
    w = std::trunc(w * scale);
  }
  if (std::max(h, w) / std::min(h, w) > 200.0) {
    return invalid_argument("video " + std::to_string(height) + " x " + std::to_string(width) +
                            ": the video processor takes aspect ratios below 200");
  }
  int64_t h_bar = python_round(h / f) * factor, w_bar = python_round(w / f) * factor;
  const int64_t t_bar = python_round(t / static_cast<double>(temporal_patch)) * temporal_patch;
  if (t_bar * h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(t * h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (t * h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return std::array<int64_t, 2>{h_bar, w_bar};
}

Result<Qwen3VisionEncoder> Qwen3VisionEncoder::load(const std::string& model_path, const std::string& processor_path) {
  const std::string config_path = (fs::path(model_folder(model_path)) / "config.json").string();
  VORTEX_ASSIGN_OR_RETURN(json config_json, read_json_file(config_path));
  Qwen3VisionEncoder enc;
  VORTEX_ASSIGN_OR_RETURN(enc.config_, Qwen3VisionConfig::from_json(config_json, config_path));
  std::string processor_file = processor_path;
  if (fs::is_directory(processor_path)) {
    processor_file = (fs::path(processor_path) / "preprocessor_config.json").string();
    if (!fs::exists(processor_file) && fs::exists(fs::path(processor_path) / "processor_config.json")) {
      processor_file = (fs::path(processor_path) / "processor_config.json").string();
    }
  }
  VORTEX_ASSIGN_OR_RETURN(json processor_json, read_json_file(processor_file));
  VORTEX_ASSIGN_OR_RETURN(enc.processor_, Qwen3ImageProcessorConfig::from_json(processor_json, processor_file));
  const Qwen3VisionConfig& c = enc.config_;
  const Qwen3ImageProcessorConfig& p = enc.processor_;
  if (p.patch != c.patch || p.merge != c.merge || p.temporal_patch != c.temporal_patch) {
    return corrupt_data(processor_file + ": patch / merge / temporal patch " + std::to_string(p.patch) + " / " +
                        std::to_string(p.merge) + " / " + std::to_string(p.temporal_patch) + " differ from " +
                        config_path + "'s " + std::to_string(c.patch) + " / " + std::to_string(c.merge) + " / " +
                        std::to_string(c.temporal_patch));
  }
  enc.load_video_processor(processor_file, processor_json);

  VORTEX_ASSIGN_OR_RETURN(ShardedCheckpoint ckpt, open_model_weights(model_path));
  std::string prefix;
  for (const char* candidate : {"model.visual.", "visual."}) {
    if (ckpt.has(std::string(candidate) + "patch_embed.proj.weight")) {
      prefix = candidate;
      break;
    }
  }
  if (prefix.empty()) {
    return not_found(ckpt.path() + ": no 'model.visual.patch_embed.proj.weight': not a Qwen3-VL checkpoint with "
                     "its vision tower");
  }
  const int64_t C = c.hidden, F = c.intermediate, M = C * c.merge * c.merge;
  const Shape patch_shape({C, c.in_channels, c.temporal_patch, c.patch, c.patch});
  VORTEX_ASSIGN_OR_RETURN(Tensor patch_w, checked_weight(ckpt, prefix + "patch_embed.proj.weight", patch_shape));
  VORTEX_ASSIGN_OR_RETURN(enc.patch_w_, patch_w.reshape(Shape({C, c.patch_values()})));
  VORTEX_ASSIGN_OR_RETURN(enc.patch_b_, checked_weight(ckpt, prefix + "patch_embed.proj.bias", Shape({C})));
  VORTEX_ASSIGN_OR_RETURN(enc.pos_embed_,
                          checked_weight(ckpt, prefix + "pos_embed.weight", Shape({c.num_position_embeddings, C})));
  enc.blocks_.resize(static_cast<size_t>(c.depth));
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string b = prefix + "blocks." + std::to_string(i) + ".";
    Block& l = enc.blocks_[static_cast<size_t>(i)];
    const auto w = [&](const std::string& name, const Shape& shape) { return checked_weight(ckpt, b + name, shape); };
    VORTEX_ASSIGN_OR_RETURN(l.norm1_w, w("norm1.weight", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.norm1_b, w("norm1.bias", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.qkv_w, w("attn.qkv.weight", Shape({3 * C, C})));
    VORTEX_ASSIGN_OR_RETURN(l.qkv_b, w("attn.qkv.bias", Shape({3 * C})));
    VORTEX_ASSIGN_OR_RETURN(l.proj_w, w("attn.proj.weight", Shape({C, C})));
    VORTEX_ASSIGN_OR_RETURN(l.proj_b, w("attn.proj.bias", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.norm2_w, w("norm2.weight", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.norm2_b, w("norm2.bias", Shape({C})));
    VORTEX_ASSIGN_OR_RETURN(l.fc1_w, w("mlp.linear_fc1.weight", Shape({F, C})));
    VORTEX_ASSIGN_OR_RETURN(l.fc1_b, w("mlp.linear_fc1.bias", Shape({F})));
    VORTEX_ASSIGN_OR_RETURN(l.fc2_w, w("mlp.linear_fc2.weight", Shape({C, F})));
    VORTEX_ASSIGN_OR_RETURN(l.fc2_b, w("mlp.linear_fc2.bias", Shape({C})));
  }
  const auto load_merger = [&](const std::string& m, bool after_shuffle) -> Result<Merger> {
    Merger out;
    out.norm_after_shuffle = after_shuffle;
    const int64_t norm_width = after_shuffle ? M : C;
    VORTEX_ASSIGN_OR_RETURN(out.norm_w, checked_weight(ckpt, m + "norm.weight", Shape({norm_width})));
    VORTEX_ASSIGN_OR_RETURN(out.norm_b, checked_weight(ckpt, m + "norm.bias", Shape({norm_width})));
    VORTEX_ASSIGN_OR_RETURN(out.fc1_w, checked_weight(ckpt, m + "linear_fc1.weight", Shape({M, M})));
    VORTEX_ASSIGN_OR_RETURN(out.fc1_b, checked_weight(ckpt, m + "linear_fc1.bias", Shape({M})));
    VORTEX_ASSIGN_OR_RETURN(out.fc2_w, checked_weight(ckpt, m + "linear_fc2.weight", Shape({c.out_hidden, M})));
    VORTEX_ASSIGN_OR_RETURN(out.fc2_b, checked_weight(ckpt, m + "linear_fc2.bias", Shape({c.out_hidden})));
    return out;
  };
  VORTEX_ASSIGN_OR_RETURN(enc.merger_, load_merger(prefix + "merger.", false));
  for (size_t j = 0; j < c.deepstack_layers.size(); ++j) {
    VORTEX_ASSIGN_OR_RETURN(Merger m, load_merger(prefix + "deepstack_merger_list." + std::to_string(j) + ".", true));
    enc.deepstack_mergers_.push_back(std::move(m));
  }
  return enc;
}

Result<VisionGrid> Qwen3VisionEncoder::grid_for(int64_t height, int64_t width) const {
  VORTEX_ASSIGN_OR_RETURN(const auto target, processor_.target_size(height, width));
  return VisionGrid{target[0] / config_.patch, target[1] / config_.patch, config_.merge};
}

Result<Tensor> Qwen3VisionEncoder::image_patches(const Tensor& rgb, VisionGrid* grid) const {
  if (rgb.dtype() != DType::kU8 || rgb.rank() != 3 || rgb.size(2) != 3) {
    return invalid_argument("image is " + rgb.describe() + ", expected u8 [height, width, 3] (RGB)");
  }
  VORTEX_ASSIGN_OR_RETURN(*grid, grid_for(rgb.size(0), rgb.size(1)));
  // The image processor repeats a picture over the temporal patch.
  const std::vector<Tensor> frames(static_cast<size_t>(config_.temporal_patch), rgb);
  return frame_patches(frames, *grid, processor_.rescale_factor, processor_.mean, processor_.std);
}

void Qwen3VisionEncoder::load_video_processor(const std::string& processor_file, const json& processor_json) {
  std::string where = processor_file;
  json settings = processor_json;
  if (!(processor_json.contains("video_processor") && processor_json["video_processor"].is_object())) {
    where = (fs::path(processor_file).parent_path() / "video_preprocessor_config.json").string();
    if (!fs::exists(where)) {
      video_processor_error_ = not_found(where + " does not exist: video references need the video processor's "
                                         "settings beside the image processor's");
      return;
    }
    auto read = read_json_file(where);
    if (!read.ok()) {
      video_processor_error_ = read.status();
      return;
    }
    settings = std::move(*read);
  }
  auto parsed = Qwen3VideoProcessorConfig::from_json(settings, where);
  if (!parsed.ok()) {
    video_processor_error_ = parsed.status();
    return;
  }
  if (parsed->patch != config_.patch || parsed->merge != config_.merge ||
      parsed->temporal_patch != config_.temporal_patch) {
    video_processor_error_ = corrupt_data(where + ": patch / merge / temporal patch " + std::to_string(parsed->patch) +
                                          " / " + std::to_string(parsed->merge) + " / " +
                                          std::to_string(parsed->temporal_patch) + " differ from the vision tower's");
    return;
  }
  video_processor_ = *parsed;
}

Result<VisionGrid> Qwen3VisionEncoder::video_grid_for(int64_t frames, int64_t height, int64_t width) const {
  if (!video_processor_error_.ok()) return video_processor_error_;
  VORTEX_ASSIGN_OR_RETURN(const auto target, video_processor_.target_size(frames, height, width));
  return VisionGrid{target[0] / config_.patch, target[1] / config_.patch, config_.merge};
}

Result<Tensor> Qwen3VisionEncoder::video_block_patches(const std::vector<Tensor>& frames,
                                                       const VisionGrid& grid) const {
  if (!video_processor_error_.ok()) return video_processor_error_;
  if (static_cast<int64_t>(frames.size()) != config_.temporal_patch) {
    return invalid_argument("a video block takes " + std::to_string(config_.temporal_patch) + " frames, got " +
                            std::to_string(frames.size()));
  }
  return frame_patches(frames, grid, video_processor_.rescale_factor, video_processor_.mean, video_processor_.std);
}

Result<Tensor> Qwen3VisionEncoder::frame_patches(const std::vector<Tensor>& frames, const VisionGrid& grid,
                                                 double rescale_factor, const std::array<double, 3>& mean_in,
                                                 const std::array<double, 3>& std_in) const {
  const int64_t P = config_.patch, T = config_.temporal_patch;
  const int64_t H = grid.height * P, W = grid.width * P;
  if (frames.empty() || frames[0].dtype() != DType::kU8 || frames[0].rank() != 3 || frames[0].size(2) != 3) {
    return invalid_argument("frame 0 is " + (frames.empty() ? std::string("missing") : frames[0].describe()) +
                            ", expected u8 [height, width, 3] (RGB)");
  }
  // Every frame at frame 0's size; the processor resizes them to the grid's (bicubic, antialiased,
  // on the 8-bit pixels as torchvision does) when that differs.
  const int64_t source_h = frames[0].size(0), source_w = frames[0].size(1);
  std::vector<Tensor> dense;
  for (size_t t = 0; t < frames.size(); ++t) {
    const Tensor& f = frames[t];
    if (f.dtype() != DType::kU8 || f.rank() != 3 || f.size(0) != source_h || f.size(1) != source_w ||
        f.size(2) != 3) {
      return invalid_argument("frame " + std::to_string(t) + " is " + f.describe() + ", expected u8 [" +
                              std::to_string(source_h) + ", " + std::to_string(source_w) + ", 3] (RGB) as frame 0");
    }
    if (source_h == H && source_w == W) {
      dense.push_back(f.contiguous());
    } else {
      VORTEX_ASSIGN_OR_RETURN(Tensor resized, cpu::resize_bicubic_rgb8(f.contiguous(), H, W));
      dense.push_back(std::move(resized));
    }
  }
  // The reference folds the rescale into mean and std in fp32: (x − mean/r) / (std/r).
  std::array<float, 3> mean{}, stdev{};
  for (int c = 0; c < 3; ++c) {
    const float inv_rescale = static_cast<float>(1.0 / rescale_factor);
    mean[c] = static_cast<float>(mean_in[c]) * inv_rescale;
    stdev[c] = static_cast<float>(std_in[c]) * inv_rescale;
  }
  const int64_t K = config_.patch_values();
  Tensor out = Tensor::empty({grid.patches(), K}, DType::kF32);
  float* o = out.data_as<float>();
  for (int64_t i = 0; i < grid.patches(); ++i) {
    const auto [row, col] = patch_position(i, grid);
    float* dst = o + i * K;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t t = 0; t < T; ++t) {
        const uint8_t* px = dense[static_cast<size_t>(t)].data_as<const uint8_t>();
        for (int64_t y = 0; y < P; ++y) {
          const uint8_t* src = px + ((row * P + y) * W + col * P) * 3 + c;
          for (int64_t x = 0; x < P; ++x) {
            *dst++ = (static_cast<float>(src[x * 3]) - mean[c]) / stdev[c];
          }
        }
      }
    }
  }
  return out;
}

Result<Tensor> Qwen3VisionEncoder::position_rows(const VisionGrid& grid) const {
  const int64_t N = grid.patches(), C = config_.hidden, side = config_.position_grid_side;
  // The learned grid resampled to this image: four taps per patch, the products and their sum in
  // fp32 (tap order h0w0, h0w1, h1w0, h1w1), rounded to bf16.
  Tensor out = Tensor::empty({N, C}, DType::kBF16);
  const TensorView table = pos_embed_.view();
  std::vector<float> pos(static_cast<size_t>(C)), entry(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) {
    const auto [row, col] = patch_position(i, grid);
    int64_t h_taps[2], w_taps[2];
    float h_weights[2], w_weights[2];
    axis_taps(row, grid.height, side, h_taps, h_weights);
    axis_taps(col, grid.width, side, w_taps, w_weights);
    for (int a = 0; a < 2; ++a) {
      for (int b = 0; b < 2; ++b) {
        const float weight = h_weights[a] * w_weights[b];
        cpu::load_row(cpu::row_ptr(table, h_taps[a] * side + w_taps[b]), table.dtype, C, entry.data());
        for (int64_t k = 0; k < C; ++k) {
          const float product = entry[k] * weight;
          pos[k] = (a == 0 && b == 0) ? product : pos[k] + product;
        }
      }
    }
    cpu::store_row(pos.data(), C, cpu::row_ptr(out.view(), i), DType::kBF16);
  }
  return out;
}

Qwen3VisionEncoder::RopeTables Qwen3VisionEncoder::rope_tables(const VisionGrid& grid) const {
  const int64_t N = grid.patches(), D = config_.head_dim();
  // The 2-D RoPE: frequencies over a quarter head each for the patch row and column.
  const int64_t quarter = D / 4;
  RopeTables t{Tensor::empty({N, D}, DType::kF32), Tensor::empty({N, D}, DType::kF32)};
  for (int64_t j = 0; j < quarter; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(D / 2);
    const float inv_freq = 1.0f / portable_powf(static_cast<float>(config_.rope_theta), exponent);
    for (int64_t i = 0; i < N; ++i) {
      const auto position = patch_position(i, grid);
      for (int axis = 0; axis < 2; ++axis) {
        const float angle = static_cast<float>(position[axis]) * inv_freq;
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t k = i * D + half * (D / 2) + axis * quarter + j;
          t.cos.data_as<float>()[k] = portable_cosf(angle);
          t.sin.data_as<float>()[k] = portable_sinf(angle);
        }
      }
    }
  }
  return t;
}

Status Qwen3VisionEncoder::check_patches(const Tensor& patches, const VisionGrid& grid) const {
  const Qwen3VisionConfig& c = config_;
  if (patches.rank() != 2 || patches.size(0) != grid.patches() || patches.size(1) != c.patch_values() ||
      grid.merge != c.merge || grid.height % c.merge != 0 || grid.width % c.merge != 0) {
    return invalid_argument("vision patches are " + patches.describe() + " for a " + std::to_string(grid.height) +
                            " x " + std::to_string(grid.width) + " grid, expected [" +
                            std::to_string(grid.patches()) + ", " + std::to_string(c.patch_values()) +
                            "] with both sides multiples of " + std::to_string(c.merge));
  }
  return ok_status();
}

Result<Tensor> Qwen3VisionEncoder::embed(const Tensor& patches, const VisionGrid& grid) const {
  VORTEX_RETURN_IF_ERROR(check_patches(patches, grid));
  VORTEX_ASSIGN_OR_RETURN(const Tensor pixels, patches.to(DType::kBF16));  // the pipeline feeds bf16 pixels
  const int64_t N = grid.patches(), C = config_.hidden;
  Tensor x = Tensor::empty({N, C}, DType::kBF16);
  const TensorView bias = patch_b_.view();
  VORTEX_RETURN_IF_ERROR(cpu::linear(pixels.view(), patch_w_.view(), &bias, x.view()));
  VORTEX_ASSIGN_OR_RETURN(const Tensor pos, position_rows(grid));
  VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), pos.view()));
  return x;
}

Status Qwen3VisionEncoder::run_blocks(Tensor& x, const VisionGrid& grid, int64_t first, int64_t last,
                                      std::vector<Tensor>* deepstack) const {
  const Qwen3VisionConfig& c = config_;
  VORTEX_RETURN_IF_ERROR(check_blocks_arg(first, last, c.depth));
  const int64_t N = grid.patches(), C = c.hidden, F = c.intermediate, D = c.head_dim();
  if (x.dtype() != DType::kBF16 || x.shape() != Shape({N, C})) {
    return invalid_argument("vision states are " + x.describe() + ", expected bf16 [" + std::to_string(N) + ", " +
                            std::to_string(C) + "]");
  }
  const RopeTables rope = rope_tables(grid);
  const Tensor &cos = rope.cos, &sin = rope.sin;
  Tensor normed = Tensor::empty({N, C}, DType::kBF16), qkv = Tensor::empty({N, 3 * C}, DType::kBF16);
  Tensor rotated = Tensor::empty({N, 2 * C}, DType::kF32);  // q and k widened: the RoPE runs in fp32
  Tensor attn = Tensor::empty({N, C}, DType::kBF16), branch = Tensor::empty({N, C}, DType::kBF16);
  Tensor hidden = Tensor::empty({N, F}, DType::kBF16);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t b = first; b < last; ++b) {
    const Block& l = blocks_[static_cast<size_t>(b)];
    const TensorView n1w = l.norm1_w.view(), n1b = l.norm1_b.view(), n2w = l.norm2_w.view(), n2b = l.norm2_b.view();
    const TensorView qkv_b = l.qkv_b.view(), proj_b = l.proj_b.view(), fc1_b = l.fc1_b.view(), fc2_b = l.fc2_b.view();
    VORTEX_RETURN_IF_ERROR(cpu::layer_norm(x.view(), n1w, n1b, kVisionNormEps, normed.view()));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.qkv_w.view(), &qkv_b, qkv.view()));
    VORTEX_ASSIGN_OR_RETURN(const Tensor qk, qkv.slice(1, 0, 2 * C));
    VORTEX_RETURN_IF_ERROR(copy_into(qk, rotated));
    VORTEX_RETURN_IF_ERROR(cpu::apply_rope(h3::heads_view(rotated, 0, 2 * c.heads, D), cos, sin));
    VORTEX_RETURN_IF_ERROR(copy_into(rotated, qk));
    VORTEX_RETURN_IF_ERROR(cpu::attention(h3::heads_view(qkv, 0, c.heads, D), h3::heads_view(qkv, C, c.heads, D),
                                          h3::heads_view(qkv, 2 * C, c.heads, D), h3::heads_view(attn, 0, c.heads, D),
                                          scale));
    VORTEX_RETURN_IF_ERROR(cpu::linear(attn.view(), l.proj_w.view(), &proj_b, branch.view()));
    VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), branch.view()));
    VORTEX_RETURN_IF_ERROR(cpu::layer_norm(x.view(), n2w, n2b, kVisionNormEps, normed.view()));
    VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), l.fc1_w.view(), &fc1_b, hidden.view()));
    VORTEX_RETURN_IF_ERROR(cpu::gelu(hidden.view(), hidden.view(), cpu::GeluApproximation::kTanh));
    VORTEX_RETURN_IF_ERROR(cpu::linear(hidden.view(), l.fc2_w.view(), &fc2_b, branch.view()));
    VORTEX_RETURN_IF_ERROR(cpu::residual_add(x.view(), branch.view()));
    for (size_t j = 0; j < c.deepstack_layers.size(); ++j) {
      if (c.deepstack_layers[j] != b || !deepstack) continue;
      VORTEX_ASSIGN_OR_RETURN(Tensor feature, merge(deepstack_mergers_[j], x));
      deepstack->push_back(std::move(feature));
    }
  }
  return ok_status();
}

Result<Tensor> Qwen3VisionEncoder::merge(const Merger& merger, const Tensor& x) const {
  const int64_t N = x.size(0), C = x.size(1), group = config_.merge * config_.merge, M = C * group;
  const TensorView nw = merger.norm_w.view(), nb = merger.norm_b.view();
  Tensor normed;
  if (merger.norm_after_shuffle) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor shuffled, x.reshape(Shape({N / group, M})));
    normed = Tensor::empty({N / group, M}, DType::kBF16);
    VORTEX_RETURN_IF_ERROR(cpu::layer_norm(shuffled.view(), nw, nb, kVisionNormEps, normed.view()));
  } else {
    Tensor per_patch = Tensor::empty({N, C}, DType::kBF16);
    VORTEX_RETURN_IF_ERROR(cpu::layer_norm(x.view(), nw, nb, kVisionNormEps, per_patch.view()));
    VORTEX_ASSIGN_OR_RETURN(normed, per_patch.reshape(Shape({N / group, M})));
  }
  const TensorView b1 = merger.fc1_b.view(), b2 = merger.fc2_b.view();
  Tensor hidden = Tensor::empty({N / group, M}, DType::kBF16);
  Tensor out = Tensor::empty({N / group, config_.out_hidden}, DType::kBF16);
  VORTEX_RETURN_IF_ERROR(cpu::linear(normed.view(), merger.fc1_w.view(), &b1, hidden.view()));
  VORTEX_RETURN_IF_ERROR(cpu::gelu(hidden.view(), hidden.view(), cpu::GeluApproximation::kErf));
  VORTEX_RETURN_IF_ERROR(cpu::linear(hidden.view(), merger.fc2_w.view(), &b2, out.view()));
  return out;
}

Result<VisionFeatures> Qwen3VisionEncoder::encode(const Tensor& patches, const VisionGrid& grid) const {
  VisionFeatures features;
  features.grid = grid;
  VORTEX_ASSIGN_OR_RETURN(Tensor x, embed(patches, grid));
  VORTEX_RETURN_IF_ERROR(run_blocks(x, grid, 0, config_.depth, &features.deepstack));
  VORTEX_ASSIGN_OR_RETURN(features.merged, merge(merger_, x));
  return features;
}

Result<VisionFeatures> Qwen3VisionEncoder::encode_image(const Tensor& rgb) const {
  VisionGrid grid;
  VORTEX_ASSIGN_OR_RETURN(const Tensor patches, image_patches(rgb, &grid));
  return encode(patches, grid);
}

}  // namespace vortex::text
