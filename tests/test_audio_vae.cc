// The H3 audio VAE decoder: config parsing and presets, the state-dict schema and its errors,
// loading from files in both checkpoint layouts, bad decode inputs, the whole decoder against a
// naive double-precision decoder written from the reference's definitions, and parity with the
// diffusers reference (tests/golden/audio_vae_*, made by tools/golden/make_audio_vae_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "audio_vae_test_util.h"
#include "formats/safetensors.h"
#include "h3_golden_util.h"
#include "models/vae/audio_vae.h"
#include "models/vae/resample.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using test::Seq;
using vae::AudioVaeConfig;
using vae::NamedTensors;

AudioVaeConfig preset(const std::string& name) {
  auto c = vae::audio_vae_config_preset(name);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

// Latent statistics off their identity values, so de-normalisation is exercised.
AudioVaeConfig with_statistics(AudioVaeConfig c) {
  for (int i = 0; i < c.latent_channels; ++i) {
    c.latents_mean[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
    c.latents_std[i] = 0.6f + 0.03f * static_cast<float>(i % 7);
  }
  return c;
}

std::string error_of(const Status& s) { return s.ok() ? std::string("(ok)") : s.message(); }
template <class T>
std::string error_of(const Result<T>& r) {
  return error_of(r.status());
}

// ---- config ------------------------------------------------------------------------------------

TEST(AudioVaeConfig, PresetsValidateAndTheReleaseHopsEightHundred) {
  for (const auto& name : vae::audio_vae_config_preset_names()) EXPECT_TRUE(preset(name).validate().ok()) << name;
  const AudioVaeConfig h3 = preset("h3");
  EXPECT_EQ(h3.hop_length(), 800);
  EXPECT_EQ(h3.sampling_rate / h3.hop_length(), 40);  // latents per second
  EXPECT_EQ(h3.decoded_samples(207), 207 * 800);      // the canonical clip's audio latents
  EXPECT_EQ(h3.stage_channels(h3.num_upsamples()), 8);
  EXPECT_EQ(preset("small").decoded_samples(7), 7 * 20);
  EXPECT_FALSE(vae::audio_vae_config_preset("nope").ok());
}

TEST(AudioVaeConfig, JsonRoundTripAndFieldErrors) {
  const AudioVaeConfig c = with_statistics(preset("small"));
  auto back = vae::audio_vae_config_from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, c);

  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
      {"decoder_rates",
       [](nlohmann::json& j) {
         j["decoder_rates"] = {5, 2};
       }},
      {"decoder_kernel_sizes",
       [](nlohmann::json& j) {
         j["decoder_kernel_sizes"] = {9, 4};
       }},
      {"resblock_kernel_sizes",
       [](nlohmann::json& j) {
         j["resblock_kernel_sizes"] = {3, 6, 11};
       }},
      {"resblock_dilation_sizes",
       [](nlohmann::json& j) {
         j["resblock_dilation_sizes"] = {{1, 3, 5}};
       }},
      {"latents_mean", [](nlohmann::json& j) { j.erase("latents_mean"); }},
      {"latents_std",
       [](nlohmann::json& j) {
         j["latents_std"] = {1.0, 2.0};
       }},
      {"latent_dim", [](nlohmann::json& j) { j["latent_dim"] = 65; }},
      {"decoder_dim", [](nlohmann::json& j) { j["decoder_dim"] = "32"; }},
      {"encoder_dim", [](nlohmann::json& j) { j["encoder_dim"] = 4294967360ull; }},  // not wrapped to 64
      {"encoder_rates", [](nlohmann::json& j) { j["encoder_rates"] = {2, 4, 4, 5, -4294967291ll}; }},
      {"_class_name", [](nlohmann::json& j) { j["_class_name"] = "AutoencoderKLMiniMaxH3"; }},
  };
  for (const auto& [field, edit] : cases) {
    nlohmann::json j = c.to_json();
    edit(j);
    auto r = vae::audio_vae_config_from_json(j);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << field << ": " << r.status().message();
  }
}

nlohmann::json original_metadata() {
  return {{"metadata",
           {{"kwargs",
             {{"encoder_dim", 64},
              {"encoder_rates", {2, 4, 4, 5, 5}},
              {"latent_dim", 2048},
              {"vae_latent_channels", 32},
              {"decoder_dim", 1024},
              {"decoder_rates", {5, 5, 2, 2, 2, 2, 2}},
              {"sample_rate", 32000},
              {"decoder_type", "bigvgan"},
              {"attn_proj", true}}}}}};
}

nlohmann::json original_wrapper(const AudioVaeConfig& c) {
  return {{"latent_channels", c.latent_channels},
          {"sample_rate", c.sampling_rate},
          {"latents_mean", c.latents_mean},
          {"latents_std", c.latents_std}};
}

TEST(AudioVaeConfig, OriginalMetadataGivesTheReleaseConfig) {
  const AudioVaeConfig h3 = with_statistics(preset("h3"));
  auto c = vae::audio_vae_config_from_original(original_metadata(), original_wrapper(h3));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, h3);  // kernel sizes 2r - r%2 = [9, 9, 4, ...], heads 8, AMP (3, 7, 11) x (1, 3, 5)
  nlohmann::json wrapper = original_wrapper(h3);
  wrapper["sample_rate"] = 16000;
  EXPECT_NE(error_of(vae::audio_vae_config_from_original(original_metadata(), wrapper)).find("sample rate"),
            std::string::npos);
  nlohmann::json meta = original_metadata();
  meta["metadata"]["kwargs"]["decoder_type"] = "vocos";
  EXPECT_NE(error_of(vae::audio_vae_config_from_original(meta, original_wrapper(h3))).find("decoder_type"),
            std::string::npos);
}

// ---- schema and loading ------------------------------------------------------------------------

NamedTensors without(const NamedTensors& all, const std::string& name) {
  NamedTensors out;
  for (const auto& nt : all)
    if (nt.first != name) out.push_back(nt);
  return out;
}

TEST(AudioVaeSchema, ErrorsNameTheTensor) {
  const AudioVaeConfig c = preset("test");
  const NamedTensors all = vae::synthetic_audio_vae_tensors(c, 1);
  ASSERT_TRUE(vae::validate_audio_vae_tensors(all, c).ok()) << error_of(vae::validate_audio_vae_tensors(all, c));

  EXPECT_EQ(error_of(vae::assemble_audio_vae(without(all, "decoder.conv_post.weight_v"), c)),
            "missing tensor 'decoder.conv_post.weight_v'");
  NamedTensors extra = all;
  extra.emplace_back("decoder.extra", Tensor::zeros({1}, DType::kF32));
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(extra, c)).find("unexpected tensor 'decoder.extra'"),
            std::string::npos);
  NamedTensors reshaped = all;
  for (auto& [name, t] : reshaped)
    if (name == "decoder.ups.1.0.weight_v") t = Tensor::zeros({8, 4, 5}, DType::kF32);
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(reshaped, c)).find("tensor 'decoder.ups.1.0.weight_v': shape"),
            std::string::npos);
  NamedTensors twice = all;
  twice.push_back(all.back());
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(twice, c)).find("appears twice"), std::string::npos);
  NamedTensors ints = all;
  for (auto& [name, t] : ints)
    if (name == "dec_in_proj.bias") t = Tensor::zeros(t.shape(), DType::kI32);
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(ints, c)).find("dec_in_proj.bias"), std::string::npos);

  // The encoder side may be absent as a whole, not in part.
  const NamedTensors decoder_only = vae::synthetic_audio_vae_tensors(c, 1, /*with_encoder=*/false);
  EXPECT_TRUE(vae::validate_audio_vae_tensors(decoder_only, c).ok());
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(without(all, "pre_block.attn.zero_k_bias"), c))
                .find("missing tensor 'pre_block.attn.zero_k_bias'"),
            std::string::npos);
}

Tensor decode_or_die(const vae::AudioVae& v, const Tensor& latents) {
  auto wave = vae::decode_audio(v, latents);
  EXPECT_TRUE(wave.ok()) << wave.status().to_string();
  return wave.ok() ? *wave : Tensor();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(AudioVaeSchema, FusedWeightNormIsAccepted) {
  const AudioVaeConfig c = preset("test");
  const NamedTensors all = vae::synthetic_audio_vae_tensors(c, 2);
  std::map<std::string, Tensor> by_name(all.begin(), all.end());
  NamedTensors fused;
  for (const auto& [name, t] : all) {
    if (name.ends_with(".weight_g")) continue;
    if (name.ends_with(".weight_v")) {
      const std::string prefix = name.substr(0, name.size() - 9);
      auto w = vae::fuse_weight_norm(prefix, by_name[prefix + ".weight_g"], t);
      ASSERT_TRUE(w.ok());
      fused.emplace_back(prefix + ".weight", *w);
    } else {
      fused.emplace_back(name, t);
    }
  }
  auto a = vae::assemble_audio_vae(all, c);
  auto b = vae::assemble_audio_vae(fused, c);
  ASSERT_TRUE(a.ok() && b.ok()) << error_of(b);
  std::mt19937 rng(3);
  const Tensor latents = test::random_tensor(rng, {2, 5, c.latent_channels});
  EXPECT_TRUE(bitwise_equal(decode_or_die(*a, latents), decode_or_die(*b, latents)));
  NamedTensors both = all;
  both.emplace_back("decoder.conv_pre.weight", by_name["decoder.conv_pre.weight_v"]);
  EXPECT_NE(error_of(vae::validate_audio_vae_tensors(both, c)).find("both present"), std::string::npos);
}

// An original-checkpoint folder (model.safetensors, metadata.json + config.json) for `c`, whose
// AMP tables must be the release's (the original metadata does not carry them).
void write_original_folder(const test_util::TempDir& dir, const AudioVaeConfig& c, const NamedTensors& tensors) {
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors).ok());
  nlohmann::json meta = original_metadata();
  auto& kwargs = meta["metadata"]["kwargs"];
  kwargs["encoder_dim"] = c.encoder_dim;
  kwargs["encoder_rates"] = c.encoder_rates;
  kwargs["latent_dim"] = c.latent_dim;
  kwargs["vae_latent_channels"] = c.latent_channels;
  kwargs["decoder_dim"] = c.decoder_dim;
  kwargs["decoder_rates"] = c.decoder_rates;
  std::ofstream(dir.file("metadata.json")) << meta.dump();
  std::ofstream(dir.file("config.json")) << original_wrapper(c).dump();
}

TEST(AudioVaeLoad, DiffusersAndOriginalFolders) {
  const AudioVaeConfig c = with_statistics(preset("small"));
  const NamedTensors all = vae::synthetic_audio_vae_tensors(c, 4);
  test_util::TempDir diffusers, original, mismatched;
  ASSERT_TRUE(write_safetensors(diffusers.file("diffusion_pytorch_model.safetensors"), all).ok());
  std::ofstream(diffusers.file("config.json")) << c.to_json().dump(2);
  write_original_folder(original, c, all);

  auto from_diffusers = vae::load_audio_vae(diffusers.path().string());
  ASSERT_TRUE(from_diffusers.ok()) << from_diffusers.status().to_string();
  EXPECT_EQ(from_diffusers->config, c);
  auto from_original = vae::load_audio_vae(original.path().string());
  ASSERT_TRUE(from_original.ok()) << from_original.status().to_string();
  AudioVaeConfig expected = c;
  expected.num_attention_heads = 8;  // the original metadata's fixed value; no decoder shape depends on it
  EXPECT_EQ(from_original->config, expected);
  std::mt19937 rng(7);
  const Tensor latents = test::random_tensor(rng, {2, 3, c.latent_channels});
  EXPECT_TRUE(bitwise_equal(decode_or_die(*from_diffusers, latents), decode_or_die(*from_original, latents)));

  // The "test" config's AMP tables differ from the release's: its original folder fails on the
  // schema, naming a tensor.
  const AudioVaeConfig t = preset("test");
  write_original_folder(mismatched, t, vae::synthetic_audio_vae_tensors(t, 4));
  auto bad = vae::load_audio_vae(mismatched.path().string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tensor '"), std::string::npos) << bad.status().message();

  test_util::TempDir empty;
  EXPECT_EQ(vae::load_audio_vae(empty.path().string()).status().code(), StatusCode::kNotFound);
}

// The original pair is read strictly: a kwarg or wrapper key the conversion script does not map is
// refused, naming the file and the field; the wrapper's own file names are honoured.
TEST(AudioVaeConfig, OriginalRefusesWhatItCannotMapNamingFileAndField) {
  const AudioVaeConfig h3 = with_statistics(preset("h3"));
  nlohmann::json wrapper = original_wrapper(h3);
  wrapper["auto_map"] = {{"AutoModel", "modeling_audio_vae.AudioVae"}};
  wrapper["source_config_path"] = "model_config.yaml";
  wrapper["source_metadata_path"] = "metadata.json";
  wrapper["source_safetensors_path"] = "model.safetensors";
  wrapper["_note"] = "bookkeeping keys are skipped";
  ASSERT_TRUE(vae::audio_vae_config_from_original(original_metadata(), wrapper).ok());

  struct Case {
    bool in_metadata;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {true, [](auto& m) { m["metadata"]["kwargs"]["n_codebooks"] = 9; }, "'metadata.kwargs.n_codebooks' is not one"},
      {true, [](auto& m) { m["metadata"]["kwargs"].erase("attn_proj"); }, "'metadata.kwargs.attn_proj' is missing"},
      {true, [](auto& m) { m["metadata"]["kwargs"]["attn_proj"] = false; }, "'metadata.kwargs.attn_proj' is false"},
      {true, [](auto& m) { m["metadata"]["kwargs"]["decoder_dim"] = "1024"; }, "'metadata.kwargs.decoder_dim' must be"},
      {true, [](auto& m) { m["metadata"].erase("kwargs"); }, "no 'metadata.kwargs' object"},
      {false, [](auto& w) { w["hop_length"] = 800; }, "'hop_length' is not one"},
      {false, [](auto& w) { w.erase("latent_channels"); }, "'latent_channels' is missing"},
      {false, [](auto& w) { w["latent_channels"] = 16; }, "latent width disagreement"},
      {false, [](auto& w) { w.erase("latents_mean"); }, "'latents_mean' is missing"},
  };
  for (const Case& c : cases) {
    nlohmann::json meta = original_metadata(), w = original_wrapper(h3);
    c.edit(c.in_metadata ? meta : w);
    auto r = vae::audio_vae_config_from_original(meta, w, "ckpt/audio_vae/metadata.json", "ckpt/audio_vae/config.json");
    ASSERT_FALSE(r.ok()) << c.expect;
    const std::string m = r.status().message();
    EXPECT_NE(m.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << m;
    const std::string file = c.in_metadata ? "ckpt/audio_vae/metadata.json: " : "ckpt/audio_vae/config.json: ";
    EXPECT_EQ(m.rfind(file, 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(AudioVaeLoad, OriginalWrapperNamesItsFiles) {
  const AudioVaeConfig c = with_statistics(preset("small"));
  test_util::TempDir dir;
  fs::create_directories(dir.path() / "weights");
  fs::create_directories(dir.path() / "meta");
  ASSERT_TRUE(write_safetensors(dir.file("weights/vae.safetensors"), vae::synthetic_audio_vae_tensors(c, 4)).ok());
  nlohmann::json meta = original_metadata();
  auto& kwargs = meta["metadata"]["kwargs"];
  kwargs["encoder_dim"] = c.encoder_dim;
  kwargs["encoder_rates"] = c.encoder_rates;
  kwargs["latent_dim"] = c.latent_dim;
  kwargs["decoder_dim"] = c.decoder_dim;
  kwargs["decoder_rates"] = c.decoder_rates;
  test_util::write_bytes(dir.file("meta/kwargs.json"), meta.dump());
  nlohmann::json wrapper = original_wrapper(c);
  wrapper["source_metadata_path"] = "meta/kwargs.json";
  wrapper["source_safetensors_path"] = "weights/vae.safetensors";
  test_util::write_bytes(dir.file("config.json"), wrapper.dump());
  auto v = vae::load_audio_vae(dir.path().string());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->config.decoder_rates, c.decoder_rates);
  EXPECT_EQ(v->config.latents_std, c.latents_std);

  // Without its metadata the wrapper is not read as a diffusers config with default fields.
  fs::remove(dir.file("meta/kwargs.json"));
  auto missing = vae::load_audio_vae(dir.path().string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("meta/kwargs.json"), std::string::npos) << missing.status().message();
}

// ---- decode: bad input -------------------------------------------------------------------------

TEST(AudioVaeDecode, BadInputIsInvalidArgumentNamingTheField) {
  const AudioVaeConfig c = preset("test");
  auto v = vae::assemble_audio_vae(vae::synthetic_audio_vae_tensors(c, 5), c);
  ASSERT_TRUE(v.ok());
  std::mt19937 rng(6);
  const int64_t C = c.latent_channels;
  struct Case {
    Tensor latents;
    std::string expect;
  };
  Tensor nan = test::random_tensor(rng, {2, 4, C});
  nan.data_as<float>()[C + 3] = std::numeric_limits<float>::quiet_NaN();
  Tensor inf = test::random_tensor(rng, {2, 4, C});
  inf.data_as<float>()[4 * C] = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {test::random_tensor(rng, {8, C}), "rank 3"},
      {test::random_tensor(rng, {8, C}), "packed [2·A, " + std::to_string(C) + "] rows"},
      {test::random_tensor(rng, {4, 2, C}), "frame-major"},
      {test::random_tensor(rng, {2, C, 4}), "channel-first"},
      {test::random_tensor(rng, {1, 4, C}), "stereo dim"},
      {test::random_tensor(rng, {3, 4, C}), "stereo dim"},
      {test::random_tensor(rng, {2, 4, C + 1}), "channel dim"},
      {test::random_tensor(rng, {2, 0, C}), "frame dim"},
      {nan, "non-finite value nan at [0, 1, 3] (left channel, latent frame 1 of 4)"},
      {inf, "non-finite value inf at [1, 0, 0] (right channel, latent frame 0 of 4)"},
      {Tensor::zeros({2, 4, C}, DType::kI32), "F32, BF16 or F16"},
      {Tensor(), "undefined"},
  };
  for (const Case& cc : cases) {
    auto r = vae::decode_audio(*v, cc.latents);
    ASSERT_FALSE(r.ok()) << cc.expect;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << cc.expect;
    EXPECT_EQ(r.status().message().rfind("latents", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(cc.expect), std::string::npos) << r.status().message();
  }
  auto bf16 = test::random_tensor(rng, {2, 3, C}).to(DType::kBF16);
  ASSERT_TRUE(bf16.ok());
  auto wave = vae::decode_audio(*v, *bf16);
  ASSERT_TRUE(wave.ok()) << wave.status().to_string();
  EXPECT_EQ(wave->shape(), (Shape{2, 3 * c.hop_length()}));
}

// ---- decode: the whole decoder against naive double loops --------------------------------------

// The reference decoder's definition, in double, from the raw state-dict tensors (weight norm,
// PyTorch weight layouts and paddings, replicate-padded resampling, scatter transposed convs).
class NaiveDecoder {
 public:
  NaiveDecoder(const NamedTensors& tensors, const AudioVaeConfig& c) : c_(c), t_(tensors.begin(), tensors.end()) {}

  Seq decode(const Seq& latents, Seq* pre_clamp) const {
    Seq h = conv("dec_in_proj", latents, false, true, 1);
    h = conv("decoder.conv_pre", h, true, true, 1);
    for (int i = 0; i < c_.num_upsamples(); ++i) {
      const std::string p = "decoder.ups." + std::to_string(i) + ".0";
      const int64_t rate = c_.decoder_rates[i], k = c_.decoder_kernel_sizes[i];
      h = test::naive_conv_transpose1d(h, weight_norm(p), vals(p + ".bias"), c_.stage_channels(i + 1), k, rate,
                                       (k - rate) / 2);
      Seq sum;
      for (int j = 0; j < c_.num_kernels(); ++j) {
        const Seq b = amp(h, "decoder.resblocks." + std::to_string(i * c_.num_kernels() + j),
                          c_.resblock_kernel_sizes[j], c_.resblock_dilation_sizes[j]);
        if (j == 0) {
          sum = b;
        } else {
          for (size_t e = 0; e < sum.v.size(); ++e) sum.v[e] += b.v[e];
        }
      }
      for (double& e : sum.v) e /= c_.num_kernels();
      h = sum;
    }
    h = alias_free(h, "decoder.activation_post");
    h = conv("decoder.conv_post", h, true, false, 1);
    *pre_clamp = h;
    for (double& e : h.v) e = std::clamp(e, -1.0, 1.0);
    return h;
  }

 private:
  std::vector<double> vals(const std::string& name) const { return test::values_of(t_.at(name)); }
  std::vector<double> weight_norm(const std::string& p) const {
    return test::naive_weight_norm(vals(p + ".weight_g"), vals(p + ".weight_v"));
  }
  // Same-length convolution (padding (k·d - d) / 2).
  Seq conv(const std::string& p, const Seq& x, bool wn, bool bias, int64_t dilation) const {
    const Tensor& v = t_.at(wn ? p + ".weight_v" : p + ".weight");
    const int64_t k = v.size(2);
    return test::naive_conv1d(x, wn ? weight_norm(p) : vals(p + ".weight"),
                              bias ? vals(p + ".bias") : std::vector<double>{}, v.size(0), k, 1, dilation,
                              (k * dilation - dilation) / 2);
  }
  Seq alias_free(const Seq& x, const std::string& p) const {
    std::vector<double> f, m;
    for (double a : vals(p + ".act.alpha")) f.push_back(std::exp(a));
    for (double b : vals(p + ".act.beta")) m.push_back(1.0 / (std::exp(b) + 1e-9));
    const Seq up = test::naive_upsample(x, vals(p + ".upsample.filter"), 2);
    return test::naive_downsample(test::naive_snake(up, f, m), vals(p + ".downsample.lowpass.filter"), 2);
  }
  Seq amp(Seq h, const std::string& p, int64_t k, const std::vector<int>& dilations) const {
    for (size_t m = 0; m < dilations.size(); ++m) {
      const std::string acts = p + ".activations.";
      Seq r = alias_free(h, acts + std::to_string(2 * m));
      r = conv(p + ".convs1." + std::to_string(m), r, true, true, dilations[m]);
      r = alias_free(r, acts + std::to_string(2 * m + 1));
      r = conv(p + ".convs2." + std::to_string(m), r, true, true, 1);
      for (size_t e = 0; e < h.v.size(); ++e) h.v[e] += r.v[e];
    }
    (void)k;
    return h;
  }

  AudioVaeConfig c_;
  std::map<std::string, Tensor> t_;
};

TEST(AudioVaeDecode, MatchesANaiveDoubleDecoder) {
  // One latent (every dilated convolution's padding reaches past both ends) and seven.
  for (const std::string name : {"test", "small"}) {
    for (const int64_t A : {1, 7}) {
      const std::string what = name + " A=" + std::to_string(A);
      const AudioVaeConfig c = with_statistics(preset(name));
      const NamedTensors tensors = vae::synthetic_audio_vae_tensors(c, 8);
      auto v = vae::assemble_audio_vae(tensors, c);
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      std::mt19937 rng(9);
      const Tensor latents = test::random_tensor(rng, {2, A, c.latent_channels});
      Tensor pre_clamp;
      vae::AudioVaeObserver observer = [&](const std::string& n, const Tensor& t) {
        if (n == "decoder.conv_post") pre_clamp = t.clone();
      };
      auto wave = vae::decode_audio(*v, latents, &observer);
      ASSERT_TRUE(wave.ok()) << wave.status().to_string();
      ASSERT_EQ(wave->shape(), (Shape{2, A * c.hop_length()}));

      Seq x = test::seq_from(latents);
      for (size_t e = 0; e < x.v.size(); ++e) {
        const int64_t ch = e % x.C;
        x.v[e] = x.v[e] * c.latents_std[ch] + c.latents_mean[ch];
      }
      Seq ref_pre;
      const Seq ref = NaiveDecoder(tensors, c).decode(x, &ref_pre);
      ASSERT_TRUE(pre_clamp.defined());
      const double err_pre = test::seq_rel_l2(test::seq_from(pre_clamp), ref_pre);
      EXPECT_LE(err_pre, 1e-5) << what << ": conv_post (before the clamp)";
      Seq got = test::seq_from(*wave->reshape({2, A * c.hop_length(), 1}));
      EXPECT_LE(test::seq_rel_l2(got, ref), 1e-5) << what << ": waveform";
      RecordProperty(name + "_A" + std::to_string(A) + "_rel_l2", std::to_string(err_pre));
    }
  }
}

// ---- parity with the diffusers reference -------------------------------------------------------

class AudioVaeParity : public testing::TestWithParam<std::string> {};

// fp32 throughout; only the summation order differs from the reference.
constexpr double kParityBound = 1e-4;

TEST_P(AudioVaeParity, EveryIntermediateMatchesTheReference) {
  const std::string folder = GetParam();
  const std::string io_path = test::golden_path(folder + "/io_fp32.safetensors");
  if (!fs::exists(io_path)) {
    GTEST_SKIP() << io_path << " is not there yet: make it on the GPU machine with "
                 << "`PYTHONPATH=.ref python3 tools/golden/make_audio_vae_golden.py --out tests/golden`";
  }
  const std::string weights_path = test::golden_path(folder + "/diffusers.safetensors");
  auto v = vae::load_audio_vae(weights_path);  // config.json beside the weights
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  auto io = SafetensorsFile::open(io_path);
  ASSERT_TRUE(io.ok()) << io.status().to_string();
  auto rows = io->get("in.audio_rows");  // [2·A, C], left rows then right rows
  ASSERT_TRUE(rows.ok());
  auto latents = rows->contiguous().reshape({2, rows->size(0) / 2, rows->size(1)});
  ASSERT_TRUE(latents.ok());

  std::vector<std::pair<std::string, Tensor>> seen;
  vae::AudioVaeObserver observer = [&](const std::string& n, const Tensor& t) {
    if (io->has("out." + n)) seen.emplace_back(n, t.clone());
  };
  auto wave = vae::decode_audio(*v, *latents, &observer);
  ASSERT_TRUE(wave.ok()) << wave.status().to_string();

  int compared = 0;
  for (const auto& [name, value] : seen) {  // forward order: the first failure is the first divergence
    auto ref = io->get("out." + name);
    ASSERT_TRUE(ref.ok());
    // The reference's [B, C, T] is this decoder's [B, T, C] transposed.
    Tensor mine = value.rank() == 3 ? *value.permute({0, 2, 1}) : value;
    ASSERT_EQ(mine.shape(), ref->shape()) << name;
    const double err = test::rel_l2(mine, *ref);
    ++compared;
    ASSERT_LE(err, kParityBound) << "first diverging intermediate: " << name << " (rel-L2 " << err << ")";
    RecordProperty(name, std::to_string(err));
  }
  EXPECT_GE(compared, 8);
  EXPECT_TRUE(io->has("out.waveform"));

  // The checkpoint's Kaiser-sinc buffers are the reference's fp32 computation of our filter.
  auto weights = SafetensorsFile::open(weights_path);
  ASSERT_TRUE(weights.ok());
  const std::vector<float> taps = vae::kaiser_sinc_filter(0.25, 0.3, vae::kAliasFreeTaps);
  int filters = 0;
  for (const auto& name : weights->names()) {
    if (!name.ends_with(".filter")) continue;
    auto f = weights->get(name);
    ASSERT_TRUE(f.ok());
    ASSERT_EQ(f->numel(), vae::kAliasFreeTaps) << name;
    for (int k = 0; k < vae::kAliasFreeTaps; ++k) ASSERT_NEAR(element_as_double(*f, k), taps[k], 1e-6) << name;
    ++filters;
  }
  EXPECT_GT(filters, 0);
}

INSTANTIATE_TEST_SUITE_P(Goldens, AudioVaeParity, testing::Values("audio_vae_tiny", "audio_vae_small"));

}  // namespace
}  // namespace vortex
