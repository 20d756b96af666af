// The video VAE encoder's state-dict schema, its validation, assembly, loading and synthetic weights.
#include <string>

#include "models/vae/config_fields.h"
#include "models/vae/video_vae_checkpoint.h"
#include "models/vae/video_vae_encoder.h"

namespace vortex::vae {

namespace {

// The widths entering each level: the first level keeps conv_in's width.
std::vector<int64_t> level_inputs(const VideoVaeConfig& c) {
  std::vector<int64_t> in;
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    in.push_back(i == 0 ? c.block_out_channels[0] : c.block_out_channels[i - 1]);
  }
  return in;
}

// Out-of-range levels (a config whose lists disagree, refused by validate_encoder_config) have none.
bool has_downsampler(const VideoVaeConfig& c, size_t level) {
  if (level >= c.spatial_downsample_factors.size() || level >= c.temporal_downsample_factors.size()) return false;
  return c.spatial_downsample_factors[level] * c.temporal_downsample_factors[level] > 1;
}

std::string level_prefix(size_t level) { return "encoder.down_blocks." + std::to_string(level); }

std::string resnet_prefix(size_t level, int j) { return level_prefix(level) + ".resnets." + std::to_string(j); }

Result<CausalConv3d> table_conv(const VideoVaeTensorTable& t, const std::string& prefix, const Shape& shape,
                                Conv3dGeometry geometry) {
  VORTEX_ASSIGN_OR_RETURN(Tensor w, t.f32(prefix + ".weight", shape));
  VORTEX_ASSIGN_OR_RETURN(Tensor b, t.f32(prefix + ".bias", {shape[0]}));
  return make_causal_conv3d(prefix, w, b, geometry);
}

// A 3x3x3 conv with reflect 1 all round and two causal zero frames (conv_in, the resnets, conv_out).
Conv3dGeometry same_3x3x3() {
  Conv3dGeometry g;
  g.pad_top = g.pad_bottom = g.pad_left = g.pad_right = 1;
  g.temporal_padding = 2;
  return g;
}

// The encoder's own constraints on the config (VideoVaeConfig::validate checks the shared fields).
Status validate_encoder_config(const VideoVaeConfig& c) {
  const ConfigFields fields("video VAE");
  if (c.in_channels <= 0) return invalid_argument(fields.error("in_channels", "must be positive"));
  if (c.layers_per_block <= 0) return invalid_argument(fields.error("layers_per_block", "must be positive"));
  if (c.block_out_channels.empty() || c.block_out_channels.size() != c.spatial_downsample_factors.size() ||
      c.block_out_channels.size() != c.temporal_downsample_factors.size()) {
    return invalid_argument(fields.error("block_out_channels",
                                         "must be non-empty with one entry per spatial and temporal downsample factor"));
  }
  if (c.norm_num_groups <= 0) return invalid_argument(fields.error("norm_num_groups", "must be positive"));
  for (int width : c.block_out_channels) {
    if (width <= 0 || width % c.norm_num_groups != 0) {
      return invalid_argument(fields.error("block_out_channels", "entry " + std::to_string(width) +
                                                                     " must be a positive multiple of norm_num_groups (" +
                                                                     std::to_string(c.norm_num_groups) + ")"));
    }
  }
  for (int f : c.spatial_downsample_factors) {
    if (f != 1 && f != 2) {
      return invalid_argument(fields.error("spatial_downsample_factors", "entries must be 1 or 2 (got " +
                                                                              std::to_string(f) + ")"));
    }
  }
  if (!(c.norm_eps > 0.0f)) return invalid_argument(fields.error("norm_eps", "must be positive"));
  if (c.spatial_padding_mode != "reflect") {
    return invalid_argument(fields.error("spatial_padding_mode", "'" + c.spatial_padding_mode +
                                                                     "' is not implemented (the release's is 'reflect')"));
  }
  return ok_status();
}

}  // namespace

std::vector<VideoVaeTensorSpec> video_vae_encoder_schema(const VideoVaeConfig& c) {
  std::vector<VideoVaeTensorSpec> s;
  const auto conv = [&](const std::string& p, int64_t out, int64_t in, int64_t k) {
    s.push_back({p + ".weight", {out, in, k, k, k}});
    s.push_back({p + ".bias", {out}});
  };
  const auto norm = [&](const std::string& p, int64_t channels) {
    s.push_back({p + ".weight", {channels}});
    s.push_back({p + ".bias", {channels}});
  };
  const std::vector<int64_t> in = level_inputs(c);
  conv("encoder.conv_in", c.block_out_channels[0], c.in_channels, 3);
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    const int64_t out = c.block_out_channels[i];
    for (int j = 0; j < c.layers_per_block; ++j) {
      const std::string p = resnet_prefix(i, j);
      const int64_t width = j == 0 ? in[i] : out;
      norm(p + ".norm1", width);
      conv(p + ".conv1", out, width, 3);
      norm(p + ".norm2", out);
      conv(p + ".conv2", out, out, 3);
      if (width != out) conv(p + ".conv_shortcut", out, width, 1);
    }
    if (has_downsampler(c, i)) conv(level_prefix(i) + ".downsamplers.0.conv", out, out, 3);
  }
  norm("encoder.norm_out", c.block_out_channels.back());
  conv("encoder.conv_out", 2 * c.latent_channels, c.block_out_channels.back(), 3);
  conv("quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);
  return s;
}

Status validate_video_vae_encoder_tensors(const NamedTensors& tensors, const VideoVaeConfig& config) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  VORTEX_RETURN_IF_ERROR(validate_encoder_config(config));
  return validate_video_vae_schema(tensors, video_vae_encoder_schema(config), {"decoder.", "post_quant_conv."});
}

Result<VideoVaeEncoder> assemble_video_vae_encoder(const NamedTensors& tensors, const VideoVaeConfig& c) {
  VORTEX_RETURN_IF_ERROR(validate_video_vae_encoder_tensors(tensors, c));
  const VideoVaeTensorTable t(tensors);
  VideoVaeEncoder vae;
  vae.config = c;
  const std::vector<int64_t> in = level_inputs(c);
  const int64_t first = c.block_out_channels[0], last = c.block_out_channels.back(), moments = 2 * c.latent_channels;
  VORTEX_ASSIGN_OR_RETURN(vae.conv_in, table_conv(t, "encoder.conv_in", {first, c.in_channels, 3, 3, 3}, same_3x3x3()));
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    const int64_t out = c.block_out_channels[i];
    VideoEncoderLevel level;
    for (int j = 0; j < c.layers_per_block; ++j) {
      const std::string p = resnet_prefix(i, j);
      const int64_t width = j == 0 ? in[i] : out;
      VideoEncoderResnet r;
      VORTEX_ASSIGN_OR_RETURN(r.norm1_weight, t.f32(p + ".norm1.weight", {width}));
      VORTEX_ASSIGN_OR_RETURN(r.norm1_bias, t.f32(p + ".norm1.bias", {width}));
      VORTEX_ASSIGN_OR_RETURN(r.conv1, table_conv(t, p + ".conv1", {out, width, 3, 3, 3}, same_3x3x3()));
      VORTEX_ASSIGN_OR_RETURN(r.norm2_weight, t.f32(p + ".norm2.weight", {out}));
      VORTEX_ASSIGN_OR_RETURN(r.norm2_bias, t.f32(p + ".norm2.bias", {out}));
      VORTEX_ASSIGN_OR_RETURN(r.conv2, table_conv(t, p + ".conv2", {out, out, 3, 3, 3}, same_3x3x3()));
      if (width != out) {
        r.has_shortcut = true;
        VORTEX_ASSIGN_OR_RETURN(r.conv_shortcut, table_conv(t, p + ".conv_shortcut", {out, width, 1, 1, 1}, {}));
      }
      level.resnets.push_back(std::move(r));
    }
    if (has_downsampler(c, i)) {
      Conv3dGeometry g;
      g.st = c.temporal_downsample_factors[i];
      g.sh = g.sw = c.spatial_downsample_factors[i];
      if (g.sh == 2) g.pad_bottom = g.pad_right = 1;
      g.temporal_padding = 2;
      level.has_downsampler = true;
      VORTEX_ASSIGN_OR_RETURN(level.downsampler,
                              table_conv(t, level_prefix(i) + ".downsamplers.0.conv", {out, out, 3, 3, 3}, g));
    }
    vae.levels.push_back(std::move(level));
  }
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_weight, t.f32("encoder.norm_out.weight", {last}));
  VORTEX_ASSIGN_OR_RETURN(vae.norm_out_bias, t.f32("encoder.norm_out.bias", {last}));
  VORTEX_ASSIGN_OR_RETURN(vae.conv_out, table_conv(t, "encoder.conv_out", {moments, last, 3, 3, 3}, same_3x3x3()));
  VORTEX_ASSIGN_OR_RETURN(vae.quant_conv, table_conv(t, "quant_conv", {moments, moments, 1, 1, 1}, {}));
  return vae;
}

Result<VideoVaeEncoder> load_video_vae_encoder(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(VideoVaeCheckpoint checkpoint, read_video_vae_checkpoint(path));
  auto vae = assemble_video_vae_encoder(checkpoint.tensors, checkpoint.config);
  if (!vae.ok()) return vae.status().with_context(checkpoint.where);
  if (checkpoint.tiling) vae->tiling = *checkpoint.tiling;
  return vae;
}

NamedTensors synthetic_video_vae_encoder_tensors(const VideoVaeConfig& config, uint64_t seed) {
  return synthetic_video_vae_schema_tensors(video_vae_encoder_schema(config), seed);
}

}  // namespace vortex::vae
