// The H3 video VAE decoder: config geometry, building blocks against naive loops, weight
// validation, bad input, and parity with the diffusers reference (tests/golden/video_vae_test).
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>

#include "audio_vae_test_util.h"
#include "h3_golden_util.h"
#include "formats/safetensors.h"
#include "models/vae/video_vae.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;

vae::VideoVaeConfig test_config() { return *vae::video_vae_config_preset("test"); }

TEST(VideoVaeConfig, PresetsAndTemporalGeometry) {
  for (const std::string name : {"h3", "test"}) {
    auto c = vae::video_vae_config_preset(name);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->temporal_ratio(), 4);
    EXPECT_EQ(c->frame_pre_padding(), 3);
    EXPECT_EQ(c->tokens_chunk_size(), 5);
    EXPECT_EQ(c->token_overlap(), 2);
    EXPECT_EQ(c->frame_overlap(), 5);
    for (int n = 1; n < 6; ++n) EXPECT_EQ(c->decoded_frames(5 * n + 2), 17 * n + 5);
    for (int t : {0, 1, 2, 3, 5, 6, 8, 11}) EXPECT_EQ(c->decoded_frames(t), -1) << t;
  }
  const auto h3 = *vae::video_vae_config_preset("h3");
  EXPECT_EQ(h3.spatial_ratio(), 16);
  EXPECT_EQ(h3.decoder_dim(), 2048);
  EXPECT_EQ(h3.rope_dim(), 48);
  EXPECT_EQ(h3.patch_values(), 3 * 4 * 16 * 16);
  const auto t = test_config();
  EXPECT_EQ(t.spatial_ratio(), 4);
  EXPECT_EQ(t.decoder_dim(), 128);
  EXPECT_EQ(t.rope_dim(), 24);
  auto round = vae::video_vae_config_from_json(t.to_json());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(*round, t);
  auto bad = vae::video_vae_config_from_json(nlohmann::json{{"decoder_rope_dim_ratio", 0.7}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("decoder_rope_dim_ratio"), std::string::npos);
  EXPECT_FALSE(vae::video_vae_config_preset("nope").ok());
}

TEST(VideoVaeOps, SplitTilesFollowsTheReference) {
  auto s = vae::split_tiles(48, 32, 8, 4);  // slack 8 widens the one overlap twice
  EXPECT_EQ(s.starts, (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(s.overlaps, (std::vector<int64_t>{16}));
  auto one = vae::split_tiles(200, 256, 64, 16);
  EXPECT_EQ(one.starts, (std::vector<int64_t>{0}));
  EXPECT_EQ(one.tile, 200);
  auto wide = vae::split_tiles(1344, 256, 64, 16);  // the canonical width
  EXPECT_EQ(wide.overlaps, (std::vector<int64_t>{80, 80, 80, 80, 64, 64}));
  EXPECT_EQ(wide.starts.back() + wide.tile, 1344);
  auto tall = vae::split_tiles(768, 256, 64, 16);
  EXPECT_EQ(tall.starts.back() + tall.tile, 768);
}

TEST(VideoVaeOps, BlendMatchesNaiveLoops) {
  std::mt19937 rng(3);
  const Tensor a = test::random_tensor(rng, {2, 4, 3, 5});
  const Tensor b = test::random_tensor(rng, {2, 6, 3, 5});
  auto got = vae::blend_linear(a, b, 3, 1);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->shape(), b.shape());
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t f = 0; f < 6; ++f)
      for (int64_t i = 0; i < 15; ++i) {
        const double bv = b.data_as<float>()[(c * 6 + f) * 15 + i];
        double want = bv;
        if (f < 3) want = a.data_as<float>()[(c * 4 + 4 - 3 + f) * 15 + i] * (1.0 - f / 3.0) + bv * (f / 3.0);
        EXPECT_NEAR(got->data_as<float>()[(c * 6 + f) * 15 + i], want, 1e-6);
      }
  // The extent is capped by the shorter side.
  auto capped = vae::blend_linear(a, b, 9, 1);
  ASSERT_TRUE(capped.ok());
  EXPECT_NEAR(capped->data_as<float>()[0], a.data_as<float>()[0], 1e-6);
}

TEST(VideoVaeOps, LayerNormMatchesNaiveLoops) {
  std::mt19937 rng(5);
  const Tensor x = test::random_tensor(rng, {7, 40}, 2.0f, 0.5f);
  const Tensor w = test::random_tensor(rng, {40});
  const Tensor b = test::random_tensor(rng, {40});
  auto y = vae::video_layer_norm(x, w, b, 1e-5f);
  ASSERT_TRUE(y.ok());
  for (int64_t r = 0; r < 7; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < 40; ++c) mean += x.data_as<float>()[r * 40 + c];
    mean /= 40;
    for (int64_t c = 0; c < 40; ++c) var += std::pow(x.data_as<float>()[r * 40 + c] - mean, 2);
    var /= 40;
    for (int64_t c = 0; c < 40; ++c) {
      const double want = (x.data_as<float>()[r * 40 + c] - mean) / std::sqrt(var + 1e-5) * w.data_as<float>()[c] +
                          b.data_as<float>()[c];
      EXPECT_NEAR(y->data_as<float>()[r * 40 + c], want, 1e-5);
    }
  }
}

TEST(VideoVaeOps, RopeTablesMatchTheFormula) {
  const auto c = test_config();  // rope_dim 24: 4 frequencies per axis
  const int64_t T = 3, H = 2, W = 5, rope = 24, nf = 4;
  auto [cos, sin] = vae::video_rope_tables(c, T, H, W);
  const int64_t N = T * H * W, total = N + c.decoder_num_register_tokens + 1;
  ASSERT_EQ(cos.shape(), (Shape{total, rope}));
  for (int64_t n = 0; n < total; ++n) {
    const int64_t idx[3] = {n / (H * W), n / W % H, n % W}, size[3] = {T, H, W};
    for (int axis = 0; axis < 3; ++axis) {
      const double pos = n < N ? 2.0 * (idx[axis] + 0.5) / size[axis] - 1.0 : 0.0;
      for (int64_t k = 0; k < nf; ++k) {
        const double angle = 2.0 * std::numbers::pi * pos / std::pow(100.0, k * 6.0 / rope);
        for (int64_t half : {int64_t{0}, rope / 2}) {
          EXPECT_NEAR(cos.data_as<float>()[n * rope + half + axis * nf + k], std::cos(angle), 1e-5);
          EXPECT_NEAR(sin.data_as<float>()[n * rope + half + axis * nf + k], std::sin(angle), 1e-5);
        }
      }
    }
  }
}

TEST(VideoVaeWeights, ValidationNamesTheTensor) {
  const auto c = test_config();
  auto tensors = vae::synthetic_video_vae_tensors(c, 1);
  ASSERT_TRUE(vae::assemble_video_vae(tensors, c).ok());
  auto extra = tensors;
  extra.emplace_back("encoder.conv_in.weight", Tensor::zeros({1}, DType::kF32));  // encoder side is ignored
  EXPECT_TRUE(vae::validate_video_vae_tensors(extra, c).ok());
  auto missing = tensors;
  missing.erase(missing.begin() + 5);
  auto st = vae::validate_video_vae_tensors(missing, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find(tensors[5].first), std::string::npos);
  auto wrong = tensors;
  wrong[3].second = Tensor::zeros({3}, DType::kF32);
  st = vae::validate_video_vae_tensors(wrong, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find(tensors[3].first), std::string::npos);
  auto unexpected = tensors;
  unexpected.emplace_back("decoder.mask_token", Tensor::zeros({1}, DType::kF32));
  st = vae::validate_video_vae_tensors(unexpected, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("decoder.mask_token"), std::string::npos);
}

// The golden script rebuilds these weights in Python; values computed there (pure integer math).
TEST(VideoVaeWeights, SyntheticRuleIsPinned) {
  const auto tensors = vae::synthetic_video_vae_tensors(test_config(), 1234);
  for (const auto& [name, t] : tensors) {
    if (name != "decoder.register_tokens") continue;
    EXPECT_FLOAT_EQ(t.data_as<float>()[0], -0.4627692699432373f);
    EXPECT_FLOAT_EQ(t.data_as<float>()[1], -0.1762365698814392f);
    EXPECT_FLOAT_EQ(t.data_as<float>()[2], -0.23089611530303955f);
    return;
  }
  FAIL() << "no decoder.register_tokens";
}

TEST(VideoVaeDecode, ShapesRangeTilingAndBadInput) {
  const auto c = test_config();
  auto v = vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 7), c);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  std::mt19937 rng(11);
  const Tensor latents = test::random_tensor(rng, {24, 7, 3, 4});
  auto frames = vae::decode_video(*v, latents);
  ASSERT_TRUE(frames.ok()) << frames.status().to_string();
  EXPECT_EQ(frames->shape(), (Shape{3, 22, 12, 16}));
  for (int64_t i = 0; i < frames->numel(); ++i) {
    const float f = frames->data_as<float>()[i];
    ASSERT_TRUE(f >= 0.0f && f <= 1.0f) << i;
  }
  // Tiles no smaller than the frame decode it whole.
  vae::VideoTiling off;
  off.enabled = false;
  auto whole = vae::decode_video(*v, latents, off);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(test::rel_l2(*whole, *frames), 0.0);
  // Two chunks and 2x2 tiles: tiling changes the frames only a little, never the shape.
  const Tensor two = test::random_tensor(rng, {24, 12, 6, 6});
  vae::VideoTiling small{true, 16, 16, 4, 4};
  auto tiled = vae::decode_video(*v, two, small);
  auto plain = vae::decode_video(*v, two, off);
  ASSERT_TRUE(tiled.ok() && plain.ok());
  EXPECT_EQ(tiled->shape(), (Shape{3, 39, 24, 24}));
  EXPECT_EQ(plain->shape(), tiled->shape());

  const auto expect_bad = [&](const Tensor& t, const std::string& what) {
    auto r = vae::decode_video(*v, t);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(r.status().to_string().find(what), std::string::npos) << r.status().to_string();
  };
  expect_bad(test::random_tensor(rng, {24, 7, 4}), "[C, T, H, W]");
  expect_bad(test::random_tensor(rng, {23, 7, 2, 2}), "channels");
  expect_bad(test::random_tensor(rng, {24, 6, 2, 2}), "frames 6");
  Tensor nan = test::random_tensor(rng, {24, 7, 2, 2});
  nan.data_as<float>()[30] = std::nanf("");
  expect_bad(nan, "non-finite");
}

// The checks every decoder of these latents shares: one line naming the tensor and the dim, or the
// element and latent frame of the first non-finite value, in any float dtype.
TEST(VideoVaeDecode, LatentChecksNameTheDimAndTheElement) {
  const auto c = test_config();
  const auto error = [&](const Tensor& t) {
    const Status st = vae::validate_video_latents(c, t, "tensor 'video_latents'");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message().rfind("tensor 'video_latents': ", 0), 0u) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
    return st.message();
  };
  std::mt19937 rng(41);
  EXPECT_NE(error(test::random_tensor(rng, {24, 7, 2})).find("must be [C, T, H, W] = [24, frames, height / 4"),
            std::string::npos);
  EXPECT_NE(error(test::random_tensor(rng, {7, 24, 2, 2})).find("has 7 channels (dim 0)"), std::string::npos);
  EXPECT_NE(error(test::random_tensor(rng, {24, 8, 2, 2})).find("frames 8 (dim 1), not 5n + 2"), std::string::npos);
  EXPECT_NE(error(test::random_tensor(rng, {24, 2, 2, 2})).find("frames 2"), std::string::npos);
  EXPECT_NE(error(Tensor::zeros({24, 7, 0, 2}, DType::kF32)).find("empty height or width"), std::string::npos);
  EXPECT_NE(error(Tensor::zeros({24, 7, 2, 2}, DType::kI32)).find("F32, BF16 or F16"), std::string::npos);
  EXPECT_NE(error(Tensor()).find("undefined"), std::string::npos);

  Tensor nan = test::random_tensor(rng, {24, 12, 2, 3});
  nan.data_as<float>()[((5 * 12 + 9) * 2 + 1) * 3 + 2] = std::nanf("");
  EXPECT_NE(error(nan).find("non-finite value nan at [5, 9, 1, 2] (latent frame 9 of 12)"), std::string::npos);
  Tensor inf = test::random_tensor(rng, {24, 7, 2, 2});
  inf.data_as<float>()[inf.numel() - 1] = -std::numeric_limits<float>::infinity();
  auto inf16 = inf.to(DType::kF16);
  ASSERT_TRUE(inf16.ok());
  EXPECT_NE(error(*inf16).find("-inf at [23, 6, 1, 1] (latent frame 6 of 7)"), std::string::npos);

  auto fine = test::random_tensor(rng, {24, 7, 1, 1}).to(DType::kBF16);
  ASSERT_TRUE(fine.ok());
  EXPECT_TRUE(vae::validate_video_latents(c, *fine).ok());
  EXPECT_TRUE(vae::check_video_latent_shape(c, Shape{24, 17, 48, 84}).ok());
}

// The soundtrack must last as long as the picture, within one frame (the MP4 writer's rule), and
// tile sizes must fall on latent cells; both are known before anything is decoded.
TEST(VideoVaeDecode, SoundtrackLengthAndTilingAreCheckedUpFront) {
  const auto video = *vae::video_vae_config_preset("h3");
  const auto audio = *vae::audio_vae_config_preset("h3");
  // The canonical clip: 37 latent frames -> 124 frames at 24 fps; 207 audio latents -> 165600 samples.
  EXPECT_TRUE(vae::check_soundtrack_length(video, 37, audio, 207, 24).ok());
  EXPECT_TRUE(vae::check_soundtrack_length(video, 7, audio, 37, 24).ok());  // 22 frames
  const Status off = vae::check_soundtrack_length(video, 37, audio, 180, 24);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.message().find("180 audio latents decode to 144000 samples at 32000 Hz"), std::string::npos)
      << off.message();
  EXPECT_NE(off.message().find("the video's 124 frames at 24 fps (expected 165333 samples"), std::string::npos)
      << off.message();

  EXPECT_TRUE(vae::validate_tiling({true, 256, 256, 64, 64}, 16).ok());
  EXPECT_TRUE(vae::validate_tiling({false, 0, 0, 0, 0}, 16).ok());
  EXPECT_NE(vae::validate_tiling({true, 250, 256, 64, 64}, 16).message().find("multiples of the spatial ratio 16"),
            std::string::npos);
  EXPECT_NE(vae::validate_tiling({true, 256, 256, 64, 256}, 16).message().find("width tile 256 px with overlap 256"),
            std::string::npos);
}

// ---- parity with the diffusers reference -------------------------------------------------------

constexpr double kParityBound = 1e-4;  // fp32 throughout; only the summation order differs

TEST(VideoVaeParity, EveryIntermediateMatchesTheReference) {
  const std::string folder = test::golden_path("video_vae_test");
  const std::string io_path = folder + "/io_fp32.safetensors";
  if (!fs::exists(io_path)) {
    GTEST_SKIP() << io_path << " is not there yet: make it on the GPU machine with "
                 << "`PYTHONPATH=.ref python3 tools/golden/make_video_vae_golden.py --out tests/golden`";
  }
  auto io = SafetensorsFile::open(io_path);
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  const auto& meta = io->metadata();
  ASSERT_TRUE(meta.count("config") && meta.count("seed") && meta.count("tiling"));
  auto c = vae::video_vae_config_from_json_string(meta.at("config"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto v = vae::assemble_video_vae(vae::synthetic_video_vae_tensors(*c, std::stoull(meta.at("seed"))), *c);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  const auto tj = nlohmann::json::parse(meta.at("tiling"));
  vae::VideoTiling tiling{true, tj.at("tile_sample_min_height").get<int>(), tj.at("tile_sample_min_width").get<int>(),
                          tj.at("tile_sample_min_overlap_height").get<int>(),
                          tj.at("tile_sample_min_overlap_width").get<int>()};
  auto latents = io->get("in.latents");  // [C, T, H, W]
  ASSERT_TRUE(latents.ok());

  std::vector<std::pair<std::string, Tensor>> seen;
  std::map<std::string, int> count;
  vae::VideoVaeObserver observer = [&](const std::string& n, const Tensor& t) {
    if (count[n]++ == 0 && io->has("out." + n)) seen.emplace_back(n, t.clone());  // first chunk, first tile
  };
  auto frames = vae::decode_video(*v, latents->contiguous(), tiling, &observer);
  ASSERT_TRUE(frames.ok()) << frames.status().to_string();
  int compared = 0;
  for (const auto& [name, value] : seen) {  // forward order: the first failure is the first divergence
    auto ref = io->get("out." + name);
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(value.shape(), ref->shape()) << name;
    const double err = test::rel_l2(value, *ref);
    ++compared;
    ASSERT_LE(err, kParityBound) << "first diverging intermediate: " << name << " (rel-L2 " << err << ")";
    RecordProperty(name, std::to_string(err));
  }
  EXPECT_GE(compared, 8);
  // The finished clip: every chunk and tile stitched, de-normalised and clamped.
  auto ref_frames = io->get("out.frames");
  ASSERT_TRUE(ref_frames.ok()) << ref_frames.status().to_string();
  ASSERT_EQ(frames->shape(), ref_frames->shape());
  const double frames_err = test::rel_l2(*frames, *ref_frames);
  EXPECT_LE(frames_err, kParityBound) << "decoded frames rel-L2 " << frames_err;
  RecordProperty("frames", std::to_string(frames_err));
  std::printf("video VAE parity: %d intermediates and the frames within %.0e (frames rel-L2 %.3e)\n", compared,
              kParityBound, frames_err);
}

}  // namespace
}  // namespace vortex
