// load_video_vae: a diffusers-layout folder (config.json) and an original-layout file (config in
// the metadata; made here by inverting the conversion script's mapping) decode bitwise alike, and
// a broken original tensor is a one-line error naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "audio_vae_test_util.h"
#include "formats/safetensors.h"
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

}  // namespace
}  // namespace vortex
