// Shared helpers for the tests that compare the H3 CPU program with the reference goldens.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "must.h"
#include "models/h3/layout.h"
#include "models/h3/transformer.h"
#include "vortex/tensor.h"

namespace vortex::test {

inline std::string golden_path(const std::string& rel) { return std::string(VORTEX_SOURCE_DIR) + "/tests/golden/" + rel; }

// rel-L2 of a against b (the reference), in double.
inline double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = element_as_double(a, i), y = element_as_double(b, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The token ids of a text-encoder golden's io.safetensors (`input_ids`).
inline std::vector<int32_t> golden_token_ids(const SafetensorsFile& io) {
  const Tensor ids = must(io.get("input_ids"));
  std::vector<int32_t> out(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i) out[i] = static_cast<int32_t>(element_as_double(ids, i));
  return out;
}

inline std::vector<int64_t> to_i64_vector(const Tensor& t) {
  std::vector<int64_t> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int64_t>(element_as_double(t, i));
  return v;
}

// The packed layout and first-step inputs stored in an io_*.safetensors golden.
struct GoldenCase {
  h3::PackedLayout layout;
  Tensor text_states;
  h3::StepInputs step;
};

inline Result<GoldenCase> read_golden_case(const SafetensorsFile& io) {
  GoldenCase g;
  VORTEX_ASSIGN_OR_RETURN(Tensor positions, io.get("in.position_ids"));
  VORTEX_ASSIGN_OR_RETURN(Tensor tags, io.get("in.token_tags"));
  VORTEX_ASSIGN_OR_RETURN(Tensor text_idx, io.get("in.text_indices"));
  VORTEX_ASSIGN_OR_RETURN(Tensor audio_idx, io.get("in.audio_indices"));
  VORTEX_ASSIGN_OR_RETURN(Tensor video_idx, io.get("in.video_indices"));
  VORTEX_ASSIGN_OR_RETURN(Tensor timestep, io.get("in.timestep"));
  VORTEX_ASSIGN_OR_RETURN(Tensor t_idx, io.get("in.timestep_indices"));
  VORTEX_ASSIGN_OR_RETURN(g.text_states, io.get("in.encoder_hidden_states"));
  VORTEX_ASSIGN_OR_RETURN(g.step.video_rows, io.get("in.hidden_states"));
  VORTEX_ASSIGN_OR_RETURN(g.step.audio_rows, io.get("in.audio_hidden_states"));
  h3::PackedLayout& L = g.layout;
  L.num_rows = tags.numel();
  L.text_indices = to_i64_vector(text_idx);
  L.audio_indices = to_i64_vector(audio_idx);
  L.video_indices = to_i64_vector(video_idx);
  L.num_text = static_cast<int64_t>(L.text_indices.size());
  L.num_audio = static_cast<int64_t>(L.audio_indices.size());
  L.num_video = static_cast<int64_t>(L.video_indices.size());
  for (int64_t i = 0; i < positions.numel(); ++i) L.positions.push_back(element_as_double(positions, i));
  for (int64_t v : to_i64_vector(tags)) L.tags.push_back(static_cast<int32_t>(v));
  for (int64_t i = 0; i < timestep.numel(); ++i) {
    g.step.timesteps.timesteps.push_back(static_cast<float>(element_as_double(timestep, i)));
  }
  for (int64_t v : to_i64_vector(t_idx)) g.step.timesteps.row_index.push_back(static_cast<int32_t>(v));
  return g;
}

}  // namespace vortex::test
