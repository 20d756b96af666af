// Shared helpers for the tests that compare the H3 CPU program with the reference goldens.
#pragma once

#include <gtest/gtest.h>

#include <array>
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

// How many bytes of two contiguous U8 images of one shape differ (the resize goldens hold them to 0).
inline int64_t differing_bytes(const Tensor& a, const Tensor& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += a.data_as<const uint8_t>()[i] != b.data_as<const uint8_t>()[i];
  return n;
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

// A packed layout against a layout golden's `<name>.` tensors (position_ids, token_tags, the index
// lists, num_condition[_audio]) and its row-timestep plans `<name>.plan<k>.` at `plans[k]` (video,
// audio timesteps), bit for bit.
inline void expect_layout_is_golden(const SafetensorsFile& file, const std::string& name, const h3::PackedLayout& layout,
                                    const std::vector<std::array<float, 2>>& plans) {
  const auto get = [&](const std::string& key) {
    auto t = file.get(name + "." + key);
    EXPECT_TRUE(t.ok()) << name << "." << key;
    return t.ok() ? t->contiguous() : Tensor();
  };
  const Tensor positions = get("position_ids");
  ASSERT_EQ(positions.numel(), layout.num_rows * 3) << name;
  for (int64_t i = 0; i < positions.numel(); ++i) {
    ASSERT_EQ(positions.data_as<const double>()[i], layout.positions[i]) << name << ": row " << i / 3 << " axis " << i % 3;
  }
  std::vector<int32_t> tags;
  for (int64_t v : to_i64_vector(get("token_tags"))) tags.push_back(static_cast<int32_t>(v));
  EXPECT_EQ(tags, layout.tags) << name;
  EXPECT_EQ(to_i64_vector(get("video_indices")), layout.video_indices) << name;
  EXPECT_EQ(to_i64_vector(get("audio_indices")), layout.audio_indices) << name;
  EXPECT_EQ(to_i64_vector(get("num_condition"))[0], layout.num_condition) << name;
  if (file.has(name + ".num_condition_audio")) {
    EXPECT_EQ(to_i64_vector(get("num_condition_audio"))[0], layout.num_condition_audio) << name;
  }
  for (size_t k = 0; k < plans.size(); ++k) {
    const h3::RowTimesteps plan = h3::assign_row_timesteps(layout, plans[k][0], plans[k][1]);
    const std::string p = "plan" + std::to_string(k) + ".";
    const Tensor ts = get(p + "timesteps");
    ASSERT_EQ(static_cast<int64_t>(plan.timesteps.size()), ts.numel()) << name << " plan " << k;
    for (int64_t i = 0; i < ts.numel(); ++i) EXPECT_EQ(plan.timesteps[i], ts.data_as<const float>()[i]);
    std::vector<int64_t> index(plan.row_index.begin(), plan.row_index.end());
    EXPECT_EQ(index, to_i64_vector(get(p + "inverse"))) << name << " plan " << k;
  }
}

}  // namespace vortex::test
