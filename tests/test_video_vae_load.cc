// load_video_vae: a diffusers-layout folder (config.json) and an original-layout file (config in
// the metadata; made here by inverting the conversion script's mapping) decode bitwise alike, and
// a broken original tensor is a one-line error naming the file and the tensor. The original
// checkpoint's own configs (the wrapper video_vae/config.json and the source model's
// source/config.json, written here the way the release lays them out) map onto the same config
// and tiling, and every setting they cannot map is refused naming the file and the field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "audio_vae_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/vae/video_vae.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  if (auto at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// F32 rows [src, src + count) of `in` appended to `out` (a flat buffer of whole rows).
void append_rows(const Tensor& in, int64_t src, int64_t count, std::vector<float>& out) {
  const int64_t width = in.numel() / in.size(0);
  const float* d = in.data_as<const float>() + src * width;
  out.insert(out.end(), d, d + count * width);
}

// The inverse of convert_video_vae_key on the decoder's diffusers tensors.
vae::NamedTensors to_original_layout(const vae::NamedTensors& diffusers, const vae::VideoVaeConfig& c) {
  std::map<std::string, Tensor> by_name(diffusers.begin(), diffusers.end());
  const int64_t heads = c.decoder_num_attention_heads, D = c.decoder_attention_head_dim;
  vae::NamedTensors out;
  for (const auto& [name, t] : diffusers) {
    if (name.find(".attn.to_k.") != std::string::npos || name.find(".attn.to_v.") != std::string::npos) continue;
    if (name.find(".attn.to_q.") != std::string::npos) {
      const Tensor& q = t;
      const Tensor& k = by_name.at(replaced(name, ".to_q.", ".to_k."));
      const Tensor& v = by_name.at(replaced(name, ".to_q.", ".to_v."));
      std::vector<float> fused;
      for (int64_t h = 0; h < heads; ++h)
        for (const Tensor* part : {&q, &k, &v}) append_rows(*part, h * D, D, fused);
      Shape shape = t.shape();
      shape[0] = 3 * heads * D;
      out.emplace_back(replaced(name, ".attn.to_q.", ".attn.to_qkv."), Tensor::from_f32(fused, shape));
      continue;
    }
    if (name.find(".ff.net.0.proj.") != std::string::npos) {
      const int64_t half = t.size(0) / 2;
      std::vector<float> swapped;
      append_rows(t, half, half, swapped);  // gate
      append_rows(t, 0, half, swapped);     // then up
      out.emplace_back(replaced(name, ".ff.net.0.proj.", ".ff.w1."), Tensor::from_f32(swapped, t.shape()));
      continue;
    }
    std::string n = replaced(name, "decoder.proj_in.", "decoder.x_embedder.");
    n = replaced(n, ".attn.to_out.0.", ".attn.to_out.");
    n = replaced(n, ".ff.net.2.", ".ff.w2.");
    out.emplace_back(n, t);
  }
  out.emplace_back("decoder.mask_token", Tensor::zeros({1, 1, c.decoder_dim()}, DType::kF32));
  return out;
}

TEST(VideoVaeLoad, DiffusersAndOriginalLayoutsDecodeBitwiseAlike) {
  const vae::VideoVaeConfig c = *vae::video_vae_config_preset("test");
  const vae::NamedTensors tensors = vae::synthetic_video_vae_tensors(c, 23);
  test_util::TempDir dir;
  const auto diffusers_dir = dir.path() / "vae";
  std::filesystem::create_directory(diffusers_dir);
  test_util::write_bytes((diffusers_dir / "config.json").string(), c.to_json().dump());
  ASSERT_TRUE(write_safetensors((diffusers_dir / "diffusion_pytorch_model.safetensors").string(), tensors).ok());
  const std::string original = dir.file("original.safetensors");
  const vae::NamedTensors original_tensors = to_original_layout(tensors, c);
  ASSERT_TRUE(write_safetensors(original, original_tensors, {{"config", c.to_json().dump()}}).ok());

  auto a = vae::load_video_vae(diffusers_dir.string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = vae::load_video_vae(original);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->config, c);

  std::mt19937 rng(29);
  const Tensor z = test::random_tensor(rng, {c.latent_channels, 1, 2, 3});
  auto ya = vae::decode_video_chunk(*a, z);
  auto yb = vae::decode_video_chunk(*b, z);
  ASSERT_TRUE(ya.ok() && yb.ok());
  ASSERT_EQ(ya->shape(), yb->shape());
  EXPECT_EQ(std::memcmp(ya->data(), yb->data(), ya->nbytes()), 0);
  // Also against the in-memory assembly, so that the loader cannot agree with itself by accident.
  auto direct = vae::assemble_video_vae(tensors, c);
  ASSERT_TRUE(direct.ok());
  auto yd = vae::decode_video_chunk(*direct, z);
  ASSERT_TRUE(yd.ok());
  EXPECT_EQ(std::memcmp(ya->data(), yd->data(), ya->nbytes()), 0);
}

TEST(VideoVaeLoad, ErrorsNameTheFileAndTensor) {
  const vae::VideoVaeConfig c = *vae::video_vae_config_preset("test");
  vae::NamedTensors original = to_original_layout(vae::synthetic_video_vae_tensors(c, 3), c);
  const std::string bad_name = "decoder.transformer_blocks.1.attn.to_qkv.bias";
  for (auto& [name, t] : original) {
    if (name == bad_name) t = Tensor::zeros({t.size(0) - 3}, DType::kF32);
  }
  test_util::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  ASSERT_TRUE(write_safetensors(path, original, {{"config", c.to_json().dump()}}).ok());
  auto loaded = vae::load_video_vae(path);
  ASSERT_FALSE(loaded.ok());
  const std::string message = loaded.status().to_string();
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(bad_name), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  // No config anywhere.
  const std::string bare = dir.file("bare.safetensors");
  ASSERT_TRUE(write_safetensors(bare, vae::synthetic_video_vae_tensors(c, 3)).ok());
  auto missing = vae::load_video_vae(bare);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().to_string().find(bare), std::string::npos);

  // A diffusers-layout tensor of the wrong shape, via config.json in the folder.
  vae::NamedTensors tensors = vae::synthetic_video_vae_tensors(c, 3);
  tensors[5].second = Tensor::zeros({7}, DType::kF32);
  test_util::TempDir folder;
  test_util::write_bytes(folder.file("config.json"), c.to_json().dump());
  ASSERT_TRUE(write_safetensors(folder.file("diffusion_pytorch_model.safetensors"), tensors).ok());
  auto wrong = vae::load_video_vae(folder.path().string());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().to_string().find(tensors[5].first), std::string::npos) << wrong.status().to_string();
  EXPECT_NE(wrong.status().to_string().find("diffusion_pytorch_model.safetensors"), std::string::npos);
}

// ---- the original checkpoint's own configs ------------------------------------------------------

vae::VideoVaeConfig with_statistics(vae::VideoVaeConfig c) {
  for (int i = 0; i < c.latent_channels; ++i) {
    c.latents_mean[i] = 0.125f * static_cast<float>(i % 5) - 0.25f;
    c.latents_std[i] = 0.75f + 0.0625f * static_cast<float>(i % 7);
  }
  return c;
}

// The source model's constructor arguments for `c`, under their original names, with the
// release's fixed switches.
nlohmann::json original_source(const vae::VideoVaeConfig& c) {
  std::vector<int> mult;
  for (int b : c.block_out_channels) mult.push_back(b / c.block_out_channels[0]);
  return {{"_class_name", "AutoencoderKLLegacy"},
          {"in_channels", c.in_channels},
          {"out_ch", c.out_channels},
          {"ch", c.block_out_channels[0]},
          {"ch_mult", mult},
          {"z_channels", c.latent_channels},
          {"embed_dim", c.latent_channels},
          {"num_res_blocks", c.layers_per_block},
          {"num_res_blocks_decoder", nullptr},
          {"space_down", c.spatial_downsample_factors},
          {"space_up", std::vector<int>(c.spatial_downsample_factors.rbegin(), c.spatial_downsample_factors.rend())},
          {"time_down", c.temporal_downsample_factors},
          {"time_up", nullptr},
          {"padding_mode", c.spatial_padding_mode},
          {"padding_mode_t", nullptr},
          {"use_3d_conv", true},
          {"use_t_isolated_gn", true},
          {"causal_encoder", true},
          {"causal_decoder", false},
          {"use_vit_decoder", true},
          {"zq_ch_encoder", nullptr},
          {"zq_ch_decoder", nullptr},
          {"shift_factor", 0.0},
          {"scaling_factor", 1.0},
          {"pixel_norm_type", "imagenet"},
          {"vit_decoder_kwargs",
           {{"num_layers", c.decoder_num_layers},
            {"heads", c.decoder_num_attention_heads},
            {"dim_head", c.decoder_attention_head_dim},
            {"rope_theta", c.decoder_rope_theta},
            {"rope_dim_ratio", c.decoder_rope_dim_ratio},
            {"norm_type", "rms_norm"},
            {"norm_affine", true},
            {"qk_norm_type", "rms_norm"},
            {"qk_norm_affine", false},
            {"ffn_activation_fn", "silu"},
            {"ffn_use_gated", true}}}};
}

nlohmann::json original_wrapper(const vae::VideoVaeConfig& c, int tile, int overlap) {
  return {{"auto_map", {{"AutoModel", "modeling_vae.VideoVae"}}},
          {"source_class_name", "AutoencoderKLLegacy"},
          {"source_path", "source"},
          {"source_safetensors_path", "model.safetensors"},
          {"latent_channels", c.latent_channels},
          {"latents_mean", c.latents_mean},
          {"latents_std", c.latents_std},
          {"vae_clip_length", c.clip_length},
          {"vae_token_drop", c.token_drop},
          {"vae_encoder_tiling", 1},
          {"vae_decoder_tiling", 1},
          {"vae_parallel_tiling", 1},
          {"vae_tile_size", tile},
          {"vae_tile_overlap_min", overlap},
          {"vae_encoder_parallel", 0},
          {"vae_decoder_parallel", 0},
          {"vae_chunk_dim", -1}};
}

TEST(VideoVaeOriginalConfig, ReleaseFilesMapOntoTheConfigAndTiling) {
  const vae::VideoVaeConfig h3 = with_statistics(*vae::video_vae_config_preset("h3"));
  auto o = vae::video_vae_config_from_original(original_wrapper(h3, 256, 64), original_source(h3));
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->config, h3);
  EXPECT_TRUE(o->tiling.enabled);
  EXPECT_EQ(o->tiling.tile_height, 256);
  EXPECT_EQ(o->tiling.tile_width, 256);
  EXPECT_EQ(o->tiling.min_overlap_height, 64);
  EXPECT_EQ(o->tiling.min_overlap_width, 64);
  EXPECT_EQ(o->source_path, "source");
  EXPECT_EQ(o->source_safetensors_path, "model.safetensors");

  // Other geometry and tiling settings are carried, not replaced by the release's.
  nlohmann::json wrapper = original_wrapper(h3, 512, 128);
  wrapper["vae_decoder_tiling"] = 0;
  wrapper["vae_clip_length"] = 9;
  wrapper["vae_token_drop"] = 1;
  nlohmann::json source = original_source(h3);
  source.erase("embed_dim");  // z_channels alone names the width
  source["vit_decoder_kwargs"]["num_layers"] = 2;
  auto other = vae::video_vae_config_from_original(wrapper, source);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_FALSE(other->tiling.enabled);
  EXPECT_EQ(other->tiling.tile_width, 512);
  EXPECT_EQ(other->config.clip_length, 9);
  EXPECT_EQ(other->config.token_drop, 1);
  EXPECT_EQ(other->config.decoder_num_layers, 2);
  EXPECT_EQ(other->config.latent_channels, 24);
}

TEST(VideoVaeOriginalConfig, RefusesWhatItCannotMapNamingFileAndField) {
  const vae::VideoVaeConfig h3 = with_statistics(*vae::video_vae_config_preset("h3"));
  struct Case {
    bool in_wrapper;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {true, [](auto& j) { j["vae_frame_rate"] = 24; }, "'vae_frame_rate' is not one this reader knows"},
      {true, [](auto& j) { j.erase("latents_std"); }, "'latents_std' is missing"},
      {true, [](auto& j) { j.erase("vae_token_drop"); }, "'vae_token_drop' is missing"},
      {true, [](auto& j) { j["latent_channels"] = 16; }, "'latent_channels' 16 differs"},
      {true, [](auto& j) { j["latents_mean"].erase(0); }, "'latents_mean' has 23 entries"},
      {true, [](auto& j) { j["vae_tile_size"] = 250; }, "vae_tile_size"},
      {true, [](auto& j) { j["vae_tile_overlap_min"] = 256; }, "need 0 < overlap < tile"},
      {true, [](auto& j) { j["vae_decoder_tiling"] = "yes"; }, "'vae_decoder_tiling'"},
      {true, [](auto& j) { j["vae_clip_length"] = 0; }, "'vae_clip_length' must be positive"},
      {false, [](auto& j) { j["attn_resolutions"] = nlohmann::json::array(); }, "'attn_resolutions' is not one"},
      {false, [](auto& j) { j["use_vit_decoder"] = false; }, "'use_vit_decoder' is false"},
      {false, [](auto& j) { j["causal_decoder"] = true; }, "'causal_decoder' is true"},
      {false, [](auto& j) { j["scaling_factor"] = 0.5; }, "'scaling_factor' is 0.5"},
      {false, [](auto& j) { j["shift_factor"] = 0.1; }, "'shift_factor'"},
      {false, [](auto& j) { j["pixel_norm_type"] = "minus_one_one"; }, "'pixel_norm_type'"},
      {false, [](auto& j) { j["embed_dim"] = 16; }, "'z_channels'"},
      {false, [](auto& j) { j.erase("ch"); }, "'ch' is missing"},
      {false, [](auto& j) { j.erase("out_ch"); }, "'out_ch' is missing"},
      {false, [](auto& j) { j.erase("time_down"); }, "'time_down' is missing"},
      {false, [](auto& j) { j["space_down"] = {2, 0}; }, "'space_down/time_down'"},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["norm_type"] = "layer_norm"; },
       "'vit_decoder_kwargs.norm_type' is \"layer_norm\""},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["qk_norm_affine"] = true; }, "'vit_decoder_kwargs.qk_norm_affine'"},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["ffn_use_gated"] = false; }, "'vit_decoder_kwargs.ffn_use_gated'"},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["num_register_tokens"] = 8; },
       "'vit_decoder_kwargs.num_register_tokens' is not one"},
      {false, [](auto& j) { j["vit_decoder_kwargs"].erase("rope_theta"); }, "'vit_decoder_kwargs.rope_theta' is missing"},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["rope_dim_ratio"] = 0.7; }, "'vit_decoder_kwargs.rope_dim_ratio'"},
      {false, [](auto& j) { j["vit_decoder_kwargs"]["heads"] = "32"; }, "'vit_decoder_kwargs.heads' must be an integer"},
      // Out of int's range: refused, not wrapped (4294967328 would become 32).
      {false, [](auto& j) { j["vit_decoder_kwargs"]["heads"] = 4294967328ull; },
       "'vit_decoder_kwargs.heads' must be an integer (32-bit)"},
      {false, [](auto& j) { j["vit_decoder_kwargs"] = 3; }, "'vit_decoder_kwargs' must be an object"},
  };
  for (const Case& c : cases) {
    nlohmann::json wrapper = original_wrapper(h3, 256, 64), source = original_source(h3);
    c.edit(c.in_wrapper ? wrapper : source);
    auto r = vae::video_vae_config_from_original(wrapper, source, "ckpt/video_vae/config.json",
                                                 "ckpt/video_vae/source/config.json");
    ASSERT_FALSE(r.ok()) << c.expect;
    const std::string m = r.status().message();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << m;
    EXPECT_NE(m.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << m;
    const std::string file = c.in_wrapper ? "ckpt/video_vae/config.json: " : "ckpt/video_vae/source/config.json: ";
    EXPECT_EQ(m.rfind(file, 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

// The release's folder: video_vae/config.json (wrapper) and video_vae/source/{config.json,
// model.safetensors} with the original tensor names.
void write_original_checkpoint(const std::filesystem::path& root, const vae::VideoVaeConfig& c, int tile,
                               int overlap, uint64_t seed) {
  std::filesystem::create_directories(root / "video_vae" / "source");
  test_util::write_bytes((root / "video_vae" / "config.json").string(), original_wrapper(c, tile, overlap).dump(2));
  test_util::write_bytes((root / "video_vae" / "source" / "config.json").string(), original_source(c).dump(2));
  ASSERT_TRUE(write_safetensors((root / "video_vae" / "source" / "model.safetensors").string(),
                                to_original_layout(vae::synthetic_video_vae_tensors(c, seed), c))
                  .ok());
}

TEST(VideoVaeLoad, OriginalCheckpointFolderWithItsOwnConfigs) {
  const vae::VideoVaeConfig c = with_statistics(*vae::video_vae_config_preset("test"));
  test_util::TempDir dir;
  write_original_checkpoint(dir.path(), c, 16, 4, 31);
  const auto root = dir.path() / "video_vae";
  auto from_root = vae::load_video_vae(root.string());
  ASSERT_TRUE(from_root.ok()) << from_root.status().to_string();
  EXPECT_EQ(from_root->config, c);
  EXPECT_EQ(from_root->tiling.tile_height, 16);
  EXPECT_EQ(from_root->tiling.min_overlap_width, 4);
  // The source folder and its weights file find the wrapper one folder up.
  for (const auto& path : {root / "source", root / "source" / "model.safetensors"}) {
    auto v = vae::load_video_vae(path.string());
    ASSERT_TRUE(v.ok()) << path << ": " << v.status().to_string();
    EXPECT_EQ(v->config, c) << path;
    EXPECT_EQ(v->tiling.tile_width, 16) << path;
  }

  // decode_video uses the checkpoint's tiling by default: 6 x 6 latents are 2 x 2 tiles here.
  auto direct = vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 31), c);
  ASSERT_TRUE(direct.ok());
  std::mt19937 rng(37);
  const Tensor latents = test::random_tensor(rng, {c.latent_channels, 7, 6, 6});
  auto a = vae::decode_video(*from_root, latents);
  auto b = vae::decode_video(*direct, latents, vae::VideoTiling{true, 16, 16, 4, 4});
  auto whole = vae::decode_video(*direct, latents, vae::VideoTiling{false});
  ASSERT_TRUE(a.ok() && b.ok() && whole.ok());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0);
  EXPECT_GT(test::rel_l2(*a, *whole), 0.0);  // the tiles did change the frames

  // A bad field names the file it is in.
  nlohmann::json source = original_source(c);
  source["vit_decoder_kwargs"]["norm_type"] = "layer_norm";
  test_util::write_bytes((root / "source" / "config.json").string(), source.dump());
  auto bad = vae::load_video_vae(root.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find((root / "source" / "config.json").string() + ": "), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("vit_decoder_kwargs.norm_type"), std::string::npos);

  // The source model's folder without the wrapper above it has no statistics to decode with.
  test_util::TempDir lone;
  std::filesystem::create_directories(lone.path() / "source");
  test_util::write_bytes((lone.path() / "source" / "config.json").string(), original_source(c).dump());
  auto orphan = vae::load_video_vae((lone.path() / "source").string());
  ASSERT_FALSE(orphan.ok());
  EXPECT_EQ(orphan.status().code(), StatusCode::kNotFound);
  EXPECT_NE(orphan.status().message().find("latents_mean"), std::string::npos) << orphan.status().message();
}

}  // namespace
}  // namespace vortex
