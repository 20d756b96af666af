// What the video VAE's decoder and encoder share to load their weights (video_vae_weights.cc):
// schema validation, the tensor lookup, the synthetic-weight rule and the checkpoint reader.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/vae/video_vae.h"

namespace vortex::vae {

// Every schema tensor present once with its shape and a float dtype; a tensor outside the schema
// is refused unless its name starts with one of `other_side` (the other half of the autoencoder).
Status validate_video_vae_schema(const NamedTensors& tensors, const std::vector<VideoVaeTensorSpec>& schema,
                                 const std::vector<std::string>& other_side);

class VideoVaeTensorTable {
 public:
  explicit VideoVaeTensorTable(const NamedTensors& tensors);
  // fp32, contiguous, reshaped to `shape` (same element count).
  Result<Tensor> f32(const std::string& name, const Shape& shape) const;

 private:
  std::unordered_map<std::string, Tensor> by_name_;
};

// The rule of synthetic_video_vae_tensors (video_vae.h), for every tensor of `schema`: weights of norms (names
// ending norm1.weight, norm2.weight, norm_out.weight) 1 + 0.25 · v; other `.weight`s v / sqrt(fan_in)
// with fan_in = numel / rows; everything else 0.5 · v.
NamedTensors synthetic_video_vae_schema_tensors(const std::vector<VideoVaeTensorSpec>& schema, uint64_t seed);

// A checkpoint's config, its tiling (original wrapper configs carry one), and every tensor under
// diffusers' names. `where` names the file (or folder) for errors.
struct VideoVaeCheckpoint {
  VideoVaeConfig config;
  std::optional<VideoTiling> tiling;
  NamedTensors tensors;
  std::string where;
};

// The files and configs load_video_vae (video_vae.h) accepts.
Result<VideoVaeCheckpoint> read_video_vae_checkpoint(const std::string& path);

}  // namespace vortex::vae
