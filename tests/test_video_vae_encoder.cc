// The H3 video VAE encoder: its ops against naive loops, weight validation and loading, bad input,
// and parity with the diffusers reference (tests/golden/video_vae_encoder_test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "audio_vae_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/vae/video_vae_encoder.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;

// PyTorch's F.pad(reflect) then an unpadded conv3d, in double, on [C, T, H, W] with weight
// [O, C, kt, kh, kw]; the spatial pads are (top, bottom, left, right), the temporal one zeros in front.
std::vector<double> naive_conv3d(const Tensor& x_cthw, const Tensor& w, const Tensor& b, const vae::Conv3dGeometry& g,
                                 Shape* out_shape) {
  const int64_t C = x_cthw.size(0), T = x_cthw.size(1), H = x_cthw.size(2), W = x_cthw.size(3);
  const int64_t O = w.size(0), kt = w.size(2), kh = w.size(3), kw = w.size(4);
  const int64_t Tp = T + g.temporal_padding, Hp = H + g.pad_top + g.pad_bottom, Wp = W + g.pad_left + g.pad_right;
  const auto reflect = [](int64_t i, int64_t n) { return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i); };
  std::vector<double> xp(static_cast<size_t>(C * Tp * Hp * Wp), 0.0);
  const float* xd = x_cthw.data_as<const float>();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t t = g.temporal_padding; t < Tp; ++t)
      for (int64_t h = 0; h < Hp; ++h)
        for (int64_t q = 0; q < Wp; ++q) {
          const int64_t sh = reflect(h - g.pad_top, H), sw = reflect(q - g.pad_left, W);
          xp[((c * Tp + t) * Hp + h) * Wp + q] = xd[((c * T + t - g.temporal_padding) * H + sh) * W + sw];
        }
  const int64_t To = (Tp - kt) / g.st + 1, Ho = (Hp - kh) / g.sh + 1, Wo = (Wp - kw) / g.sw + 1;
  *out_shape = Shape{To, Ho, Wo, O};  // channels-last, as causal_conv3d returns
  std::vector<double> y(static_cast<size_t>(To * Ho * Wo * O));
  const float* wd = w.data_as<const float>();
  const float* bd = b.data_as<const float>();
  for (int64_t t = 0; t < To; ++t)
    for (int64_t h = 0; h < Ho; ++h)
      for (int64_t q = 0; q < Wo; ++q)
        for (int64_t o = 0; o < O; ++o) {
          double s = bd[o];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t a = 0; a < kt; ++a)
              for (int64_t i = 0; i < kh; ++i)
                for (int64_t j = 0; j < kw; ++j)
                  s += static_cast<double>(wd[(((o * C + c) * kt + a) * kh + i) * kw + j]) *
                       xp[((c * Tp + t * g.st + a) * Hp + h * g.sh + i) * Wp + q * g.sw + j];
          y[((t * Ho + h) * Wo + q) * O + o] = s;
        }
  return y;
}

Tensor channels_last(const Tensor& x) {  // [C, T, H, W] -> [T, H, W, C]
  const int64_t C = x.size(0), P = x.numel() / C;
  Tensor out = Tensor::empty({x.size(1), x.size(2), x.size(3), C}, DType::kF32);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = 0; p < P; ++p) out.data_as<float>()[p * C + c] = x.data_as<const float>()[c * P + p];
  return out;
}

double rel_err(const Tensor& y, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = y.data_as<const float>()[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(VideoVaeEncoderOps, Conv3dMatchesNaiveLoops) {
  std::mt19937 rng(7);
  struct Case {
    const char* what;
    int64_t T, H, W, C, O, k;
    vae::Conv3dGeometry g;
  };
  vae::Conv3dGeometry same;
  same.pad_top = same.pad_bottom = same.pad_left = same.pad_right = 1;
  same.temporal_padding = 2;
  vae::Conv3dGeometry down = same;  // the downsampler: bottom / right reflect, stride (2, 2, 2)
  down.pad_top = down.pad_left = 0;
  down.st = down.sh = down.sw = 2;
  vae::Conv3dGeometry down_spatial = down;
  down_spatial.st = 1;
  const Case cases[] = {
      {"3x3x3 same, 5 frames", 5, 7, 6, 4, 5, 3, same},    {"3x3x3 same, one frame", 1, 5, 9, 3, 8, 3, same},
      {"downsample (2, 2, 2)", 9, 8, 6, 4, 4, 3, down},     {"downsample (1, 2, 2), odd", 3, 7, 5, 4, 3, 3, down_spatial},
      {"1x1x1", 4, 3, 5, 6, 7, 1, vae::Conv3dGeometry{}},
  };
  for (const Case& c : cases) {
    Tensor x = test::random_tensor(rng, {c.C, c.T, c.H, c.W});
    Tensor w = test::random_tensor(rng, {c.O, c.C, c.k, c.k, c.k}, 0.3f);
    Tensor b = test::random_tensor(rng, {c.O});
    auto conv = vae::make_causal_conv3d("conv", w, b, c.g);
    ASSERT_TRUE(conv.ok()) << conv.status().to_string();
    Shape shape;
    const std::vector<double> ref = naive_conv3d(x, w, b, c.g, &shape);
    for (auto variant : {cpu::GemmVariant::kLoops, cpu::GemmVariant::kBlas}) {
      if (!cpu::gemm_variant_available(variant)) continue;
      auto y = vae::causal_conv3d(*conv, channels_last(x), variant);
      ASSERT_TRUE(y.ok()) << c.what << ": " << y.status().to_string();
      ASSERT_EQ(y->shape(), shape) << c.what;
      EXPECT_LE(rel_err(*y, ref), 1e-6) << c.what << " (" << cpu::gemm_variant_name(variant) << ")";
    }
  }
}

TEST(VideoVaeEncoderOps, Conv3dRefusesBadInput) {
  std::mt19937 rng(8);
  vae::Conv3dGeometry same;
  same.pad_top = same.pad_bottom = same.pad_left = same.pad_right = 1;
  auto conv = vae::make_causal_conv3d("enc.conv", test::random_tensor(rng, {4, 3, 3, 3, 3}),
                                      test::random_tensor(rng, {4}), same);
  ASSERT_TRUE(conv.ok());
  auto wrong_channels = vae::causal_conv3d(*conv, Tensor::zeros({1, 4, 4, 5}, DType::kF32));
  ASSERT_FALSE(wrong_channels.ok());
  EXPECT_NE(wrong_channels.status().to_string().find("5 channels"), std::string::npos);
  auto too_small = vae::causal_conv3d(*conv, Tensor::zeros({3, 1, 4, 3}, DType::kF32));
  ASSERT_FALSE(too_small.ok());
  EXPECT_NE(too_small.status().to_string().find("reflect"), std::string::npos);
  auto no_bias = vae::make_causal_conv3d("enc.conv", test::random_tensor(rng, {4, 3, 3, 3, 3}), Tensor(), same);
  ASSERT_FALSE(no_bias.ok());
  EXPECT_NE(no_bias.status().to_string().find("enc.conv"), std::string::npos);
  auto rank = vae::make_causal_conv3d("enc.conv", test::random_tensor(rng, {4, 3, 3}), test::random_tensor(rng, {4}),
                                      same);
  ASSERT_FALSE(rank.ok());
}

TEST(VideoVaeEncoderOps, FrameGroupNormMatchesNaiveLoops) {
  std::mt19937 rng(9);
  const int64_t T = 3, H = 4, W = 5, C = 12, G = 4, Cg = C / G;
  for (bool silu : {false, true}) {
    Tensor x = test::random_tensor(rng, {T, H, W, C}, 2.0f, 0.5f);
    Tensor w = test::random_tensor(rng, {C});
    Tensor b = test::random_tensor(rng, {C});
    std::vector<double> ref(static_cast<size_t>(x.numel()));
    const float* xd = x.data_as<const float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < G; ++g) {
        double s = 0.0, sq = 0.0;
        for (int64_t p = 0; p < H * W; ++p)
          for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) s += xd[(t * H * W + p) * C + c];
        const double mean = s / (H * W * Cg);
        for (int64_t p = 0; p < H * W; ++p)
          for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) sq += std::pow(xd[(t * H * W + p) * C + c] - mean, 2);
        const double rstd = 1.0 / std::sqrt(sq / (H * W * Cg) + 1e-6);
        for (int64_t p = 0; p < H * W; ++p)
          for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) {
            const size_t i = static_cast<size_t>((t * H * W + p) * C + c);
            double v = (xd[i] - mean) * rstd * w.data_as<const float>()[c] + b.data_as<const float>()[c];
            ref[i] = silu ? v / (1.0 + std::exp(-v)) : v;
          }
      }
    ASSERT_TRUE(vae::frame_group_norm(x, w, b, static_cast<int>(G), 1e-6f, silu).ok());
    EXPECT_LE(rel_err(x, ref), 1e-6) << "silu " << silu;
  }
  Tensor x = Tensor::zeros({1, 2, 2, 6}, DType::kF32);
  auto st = vae::frame_group_norm(x, Tensor::zeros({6}, DType::kF32), Tensor::zeros({6}, DType::kF32), 4, 1e-6f, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("4 groups"), std::string::npos);
}

// ---- weights ---------------------------------------------------------------------------------------

vae::VideoVaeConfig small_config() {
  vae::VideoVaeConfig c = *vae::video_vae_config_preset("test");
  c.block_out_channels = {32, 64};
  c.spatial_downsample_factors = {2, 2};
  c.temporal_downsample_factors = {1, 2};
  return c;
}

TEST(VideoVaeEncoderWeights, ValidationNamesTheTensorAndTheField) {
  const vae::VideoVaeConfig c = small_config();
  vae::NamedTensors tensors = vae::synthetic_video_vae_encoder_tensors(c, 3);
  ASSERT_TRUE(vae::validate_video_vae_encoder_tensors(tensors, c).ok());
  // The decoder's tensors belong to the other half: accepted and ignored.
  auto both = tensors;
  for (auto& t : vae::synthetic_video_vae_tensors(c, 3)) both.push_back(t);
  EXPECT_TRUE(vae::validate_video_vae_encoder_tensors(both, c).ok());

  auto missing = tensors;
  missing.erase(missing.begin() + 5);
  auto st = vae::validate_video_vae_encoder_tensors(missing, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find(tensors[5].first), std::string::npos);

  auto unexpected = tensors;
  unexpected.emplace_back("encoder.mid_block.attn.weight", Tensor::zeros({1}, DType::kF32));
  st = vae::validate_video_vae_encoder_tensors(unexpected, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("encoder.mid_block.attn.weight"), std::string::npos);

  auto reshaped = tensors;
  reshaped[0].second = Tensor::zeros({32, 3, 3, 3, 1}, DType::kF32);
  st = vae::validate_video_vae_encoder_tensors(reshaped, c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("encoder.conv_in.weight"), std::string::npos);

  vae::VideoVaeConfig groups = c;
  groups.norm_num_groups = 24;
  st = vae::validate_video_vae_encoder_tensors(tensors, groups);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("block_out_channels"), std::string::npos);
  vae::VideoVaeConfig padding = c;
  padding.spatial_padding_mode = "zeros";
  st = vae::validate_video_vae_encoder_tensors(tensors, padding);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("spatial_padding_mode"), std::string::npos);
  vae::VideoVaeConfig lists = c;
  lists.temporal_downsample_factors = {1, 2, 1};
  EXPECT_FALSE(vae::validate_video_vae_encoder_tensors(tensors, lists).ok());
}

// The original checkpoint's CompVis names, from diffusers' (the inverse of the conversion script's rename).
std::string original_name(const std::string& name) {
  const std::string head = "encoder.down_blocks.";
  if (name.rfind(head, 0) != 0) return name;
  std::string rest = name.substr(head.size());
  const size_t dot = rest.find('.');
  std::string level = rest.substr(0, dot), tail = rest.substr(dot + 1);
  const auto swap = [&](const std::string& from, const std::string& to) {
    if (tail.rfind(from, 0) == 0) tail = to + tail.substr(from.size());
  };
  swap("resnets.", "block.");
  swap("downsamplers.0.", "downsample.");
  if (auto at = tail.find("conv_shortcut."); at != std::string::npos) tail.replace(at, 14, "nin_shortcut.");
  return "encoder.down." + level + "." + tail;
}

TEST(VideoVaeEncoderWeights, LoadsBothLayoutsFromAFolder) {
  const vae::VideoVaeConfig c = small_config();
  std::mt19937 rng(11);
  const Tensor pixels = test::random_tensor(rng, {3, 1, 16, 24});
  auto reference = vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(c, 5), c);
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  auto expected = vae::encode_video_chunk(*reference, pixels);
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  for (bool original : {false, true}) {
    test_util::TempDir dir;
    vae::NamedTensors tensors;
    for (auto& [name, t] : vae::synthetic_video_vae_encoder_tensors(c, 5)) {
      tensors.emplace_back(original ? original_name(name) : name, t);
    }
    // The diffusers file holds both halves; the original one here only the encoder's (CompVis names).
    if (!original) {
      for (auto& t : vae::synthetic_video_vae_tensors(c, 5)) tensors.push_back(t);
    }
    ASSERT_TRUE(write_safetensors(dir.file("diffusion_pytorch_model.safetensors"), tensors).ok());
    nlohmann::json config = c.to_json();
    config["_class_name"] = "AutoencoderKLMiniMaxH3";
    ASSERT_TRUE(write_file_atomically(dir.file("config.json"), config.dump()).ok());
    auto loaded = vae::load_video_vae_encoder(dir.path().string());
    ASSERT_TRUE(loaded.ok()) << "original " << original << ": " << loaded.status().to_string();
    auto got = vae::encode_video_chunk(*loaded, pixels);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(test::rel_l2(*got, *expected), 0.0) << "original " << original;
    if (!original) {  // the decoder loads from the same folder
      auto decoder = vae::load_video_vae(dir.path().string());
      EXPECT_TRUE(decoder.ok()) << decoder.status().to_string();
    }
  }
}

// ---- forward -----------------------------------------------------------------------------------

TEST(VideoVaeEncode, ShapesFramesAndBadInput) {
  const vae::VideoVaeConfig c = small_config();  // spatial ratio 4, temporal ratio 2
  auto v = vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(c, 2), c);
  ASSERT_TRUE(v.ok());
  std::mt19937 rng(12);
  const vae::VideoTiling untiled{false};
  // One frame: one latent frame; a clip: latent 0 sees only frame 0 (causal convs, per-frame norms).
  const Tensor clip = test::random_tensor(rng, {3, 5, 16, 12});
  auto frame0 = clip.slice(1, 0, 1);
  ASSERT_TRUE(frame0.ok());
  auto single = vae::encode_video_moments(*v, frame0->contiguous(), untiled);
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  EXPECT_EQ(single->shape(), (Shape{48, 1, 4, 3}));
  auto chunk = vae::encode_video_chunk(*v, clip);
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->shape(), (Shape{48, 3, 4, 3}));
  auto latent0 = chunk->slice(1, 0, 1);
  EXPECT_LE(test::rel_l2(latent0->contiguous(), *single), 1e-6);
  // 5 frames pad to one 17-frame clip (9 latents at ratio 2), minus token_drop 3.
  auto moments = vae::encode_video_moments(*v, clip, untiled);
  ASSERT_TRUE(moments.ok());
  EXPECT_EQ(moments->shape(), (Shape{48, 6, 4, 3}));
  // Tiled with one tile per axis is the untiled encode.
  auto one_tile = vae::encode_video_moments(*v, clip, vae::VideoTiling{true, 32, 32, 8, 8});
  ASSERT_TRUE(one_tile.ok());
  EXPECT_EQ(test::rel_l2(*one_tile, *moments), 0.0);

  const auto refused = [&](const Tensor& pixels, const char* part) {
    auto r = vae::encode_video_moments(*v, pixels, untiled);
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(r.status().to_string().find(part), std::string::npos) << r.status().to_string();
  };
  refused(Tensor::zeros({3, 1, 18, 12}, DType::kF32), "height 18");
  refused(Tensor::zeros({3, 1, 16, 4}, DType::kF32), "width 4");
  refused(Tensor::zeros({4, 1, 16, 12}, DType::kF32), "4 channels");
  refused(Tensor::zeros({3, 16, 12}, DType::kF32), "[3, T, H, W]");
  auto bad_tiling = vae::encode_video_moments(*v, clip, vae::VideoTiling{true, 30, 32, 8, 8});
  EXPECT_FALSE(bad_tiling.ok());

  Tensor eps = Tensor::zeros({24, 1, 4, 3}, DType::kF32);
  EXPECT_TRUE(vae::sample_video_condition(c, *single, eps).ok());
  auto wrong_eps = vae::sample_video_condition(c, *single, Tensor::zeros({24, 1, 3, 4}, DType::kF32));
  ASSERT_FALSE(wrong_eps.ok());
  EXPECT_NE(wrong_eps.status().to_string().find("eps"), std::string::npos);
  EXPECT_FALSE(vae::keyframe_pixels(Tensor::zeros({4, 4, 4}, DType::kU8)).ok());
  EXPECT_FALSE(vae::keyframe_pixels(Tensor::zeros({4, 4, 3}, DType::kF32)).ok());
  EXPECT_FALSE(vae::keyframe_pixels(Tensor::zeros({2, 4, 4, 4}, DType::kU8)).ok());
  EXPECT_FALSE(vae::keyframe_pixels(Tensor::zeros({1, 2, 4, 4, 3}, DType::kU8)).ok());
}

// The windows a chunk encoder takes: refused by index and reason; cut_window is the slice's copy.
TEST(VideoVaeEncode, WindowsAreCheckedAndCutAsSlices) {
  const vae::VideoVaeConfig c = small_config();  // spatial ratio 4
  std::mt19937 rng(13);
  const Tensor clip = test::random_tensor(rng, {3, 2, 16, 12});
  const std::vector<vae::PixelWindow> tiles = {{0, 0, 8, 8}, {8, 4, 8, 8}};
  EXPECT_TRUE(vae::check_video_encoder_windows(c, clip, tiles).ok());
  const auto refused = [&](const std::vector<vae::PixelWindow>& windows, const char* part) {
    const Status s = vae::check_video_encoder_windows(c, clip, windows);
    ASSERT_FALSE(s.ok()) << part;
    EXPECT_NE(s.to_string().find(part), std::string::npos) << s.to_string();
  };
  refused({{0, 0, 8, 8}, {12, 0, 8, 8}}, "window 1 (rows 12 + 8, columns 0 + 8) is not inside");
  refused({{0, 0, 8, 8}, {0, 0, 8, 12}}, "window 1 (rows 0 + 8, columns 0 + 12) differs in size");
  refused({{0, 0, 6, 8}}, "window 0 (rows 0 + 6, columns 0 + 8): height 6 must be a multiple of 4");
  refused({{0, 0, 8, 4}}, "width 4 must be a multiple of 4 and at least 8");
  refused({{-4, 0, 8, 8}}, "not inside");
  EXPECT_FALSE(vae::check_video_encoder_windows(c, Tensor::zeros({3, 2, 16}, DType::kF32), tiles).ok());

  auto cut = vae::cut_window(clip, tiles[1]);
  ASSERT_TRUE(cut.ok());
  ASSERT_EQ(cut->shape(), (Shape{3, 2, 8, 8}));
  const float* src = clip.data_as<const float>();
  const float* dst = cut->data_as<const float>();
  for (int64_t ch = 0; ch < 3; ++ch) {
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t y = 0; y < 8; ++y) {
        for (int64_t x = 0; x < 8; ++x) {
          ASSERT_EQ(dst[((ch * 2 + t) * 8 + y) * 8 + x], src[((ch * 2 + t) * 16 + 8 + y) * 12 + 4 + x]);
        }
      }
    }
  }
  auto whole = vae::cut_window(clip, {0, 0, 16, 12});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->data(), clip.data());  // the whole clip is not copied
  EXPECT_FALSE(vae::cut_window(clip, {0, 8, 16, 8}).ok());
}

// A video reference's frames [F, H, W, 3] become [3, F, H, W], each frame as keyframe_pixels puts it.
TEST(VideoVaeEncoder, KeyframePixelsTakeAFrameStack) {
  const int64_t F = 3, H = 5, W = 7;
  Tensor frames = Tensor::empty({F, H, W, 3}, DType::kU8);
  for (int64_t i = 0; i < frames.numel(); ++i) frames.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  auto stack = vae::keyframe_pixels(frames);
  ASSERT_TRUE(stack.ok()) << stack.status().to_string();
  ASSERT_EQ(stack->shape(), Shape({3, F, H, W}));
  for (int64_t f = 0; f < F; ++f) {
    Tensor frame = Tensor::empty({H, W, 3}, DType::kU8);
    std::memcpy(frame.data(), frames.data_as<uint8_t>() + f * H * W * 3, H * W * 3);
    auto one = vae::keyframe_pixels(frame);
    ASSERT_TRUE(one.ok());
    for (int64_t ch = 0; ch < 3; ++ch) {
      EXPECT_EQ(std::memcmp(stack->data_as<float>() + (ch * F + f) * H * W, one->data_as<float>() + ch * H * W,
                            H * W * sizeof(float)),
                0)
          << "frame " << f << " channel " << ch;
    }
  }
}

// ---- parity with the diffusers reference -------------------------------------------------------

constexpr double kParityBound = 1e-4;  // fp32 throughout; only the summation order differs

TEST(VideoVaeEncoderParity, KeyframeAndClipMatchTheReference) {
  const std::string folder = test::golden_path("video_vae_encoder_test");
  const std::string io_path = folder + "/io_fp32.safetensors";
  if (!fs::exists(io_path)) {
    GTEST_SKIP() << io_path << " is not there yet: make it on the GPU machine with "
                 << "`PYTHONPATH=.ref python3 tools/golden/make_video_vae_encoder_golden.py --out tests/golden`";
  }
  auto io = SafetensorsFile::open(io_path);
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  const auto& meta = io->metadata();
  auto c = vae::video_vae_config_from_json_string(meta.at("config"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto v = vae::assemble_video_vae_encoder(vae::synthetic_video_vae_encoder_tensors(*c, std::stoull(meta.at("seed"))),
                                           *c);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  const auto tj = nlohmann::json::parse(meta.at("tiling"));
  const vae::VideoTiling tiling{true, tj.at("tile_sample_min_height").get<int>(),
                                tj.at("tile_sample_min_width").get<int>(),
                                tj.at("tile_sample_min_overlap_height").get<int>(),
                                tj.at("tile_sample_min_overlap_width").get<int>()};
  const auto golden = [&](const std::string& name) {
    auto t = io->get(name);
    EXPECT_TRUE(t.ok()) << name;
    return t.ok() ? t->contiguous() : Tensor();
  };

  // The keyframe: pixels from RGB8, every intermediate of the first tile, the stitched moments.
  auto pixels = vae::keyframe_pixels(golden("in.keyframe_rgb8"));
  ASSERT_TRUE(pixels.ok()) << pixels.status().to_string();
  EXPECT_LE(test::rel_l2(*pixels, golden("out.keyframe.pixels")), 1e-7);
  std::vector<std::pair<std::string, Tensor>> seen;
  std::map<std::string, int> count;
  vae::VideoEncoderObserver observer = [&](const std::string& n, const Tensor& t) {
    if (count[n]++ == 0 && io->has("out.keyframe." + n)) seen.emplace_back(n, t.clone());
  };
  auto moments = vae::encode_video_moments(*v, *pixels, tiling, &observer);
  ASSERT_TRUE(moments.ok()) << moments.status().to_string();
  int compared = 0;
  for (const auto& [name, value] : seen) {  // forward order: the first failure is the first divergence
    const Tensor ref = golden("out.keyframe." + name);
    ASSERT_EQ(value.shape(), ref.shape()) << name;
    const double err = test::rel_l2(value, ref);
    ++compared;
    ASSERT_LE(err, kParityBound) << "first diverging intermediate: " << name << " (rel-L2 " << err << ")";
    RecordProperty(name, std::to_string(err));
  }
  EXPECT_EQ(compared, 7);  // conv_in, three levels, conv_out, quant_conv, the stitched moments
  EXPECT_GE(count["quant_conv"], 6);  // 2 x 3 tiles

  // The conditioning latents: the reference's seed-42 draw, fp16 rounding, normalisation. One fp16
  // step is 2^-11 relative, so a last-bit difference in the moments can move a value by that much.
  auto condition = vae::sample_video_condition(*c, *moments, golden("out.keyframe.eps"));
  ASSERT_TRUE(condition.ok()) << condition.status().to_string();
  const double condition_err = test::rel_l2(*condition, golden("out.keyframe.condition"));
  EXPECT_LE(condition_err, 5e-4);
  RecordProperty("condition", std::to_string(condition_err));

  // The clip: 12 frames padded to two 9-frame clips, each tiled, the last token_drop latents dropped.
  auto clip = vae::encode_video_moments(*v, golden("in.clip"), tiling);
  ASSERT_TRUE(clip.ok()) << clip.status().to_string();
  const Tensor clip_ref = golden("out.clip.moments");
  ASSERT_EQ(clip->shape(), clip_ref.shape());
  const double clip_err = test::rel_l2(*clip, clip_ref);
  EXPECT_LE(clip_err, kParityBound);
  std::printf("video VAE encoder parity: %d keyframe intermediates within %.0e, condition rel-L2 %.3e, clip %.3e\n",
              compared, kParityBound, condition_err, clip_err);
}

}  // namespace
}  // namespace vortex
