// Layout conversion, the streaming checkpoint writer and the synthetic weights: round trips that
// are bit-exact on the reference goldens, sharded output that the loaders accept, and weights that
// are deterministic and have the scales DESIGN section 1 asks for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/rng.h"
#include "h3_golden_util.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/synthetic.h"
#include "models/h3/synthetic_rule.h"
#include "models/h3/weights.h"
#include "safetensors_test_util.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using h3::NamedTensors;
using test::golden_path;
using test_util::TempDir;

// Stops the test with the Status's message when `expr` fails.
#define ASSERT_OK(expr)                                 \
  do {                                                  \
    const ::vortex::Status assert_ok_status_ = (expr);  \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_.to_string(); \
  } while (0)

Result<NamedTensors> read_checkpoint(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(const ShardedCheckpoint checkpoint, ShardedCheckpoint::open(path));
  return h3::read_all(checkpoint);
}

// The bits of an F32 tensor, for reporting a last-bit difference (rope.inv_freq).
std::string hex_values(const Tensor& t) {
  std::string out;
  const Tensor dense = t.contiguous();
  for (int64_t i = 0; i < dense.numel() && i < 32; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, static_cast<const char*>(dense.data()) + i * 4, 4);
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%08x ", bits);
    out += buf;
  }
  return out;
}

// Same names (any order), dtypes, shapes and bytes.
void expect_same_tensors(const NamedTensors& actual, const NamedTensors& expected) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, tensor] : actual) EXPECT_TRUE(by_name.emplace(name, tensor).second) << name << " twice";
  EXPECT_EQ(actual.size(), expected.size());
  for (const auto& [name, want] : expected) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    const Tensor got = it->second.contiguous();
    const Tensor ref = want.contiguous();
    ASSERT_EQ(got.dtype(), ref.dtype()) << name;
    ASSERT_EQ(got.shape(), ref.shape()) << name;
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.nbytes()), 0)
        << name << " differs" << (name == "rope.inv_freq" ? ": got " + hex_values(got) + "want " + hex_values(ref) : "");
  }
}

// Every tensor of the loaded model, named, for comparing two loads.
NamedTensors flatten(const h3::H3Weights& w) {
  NamedTensors out;
  auto linear = [&](const std::string& name, const h3::LinearWeights& l) {
    out.emplace_back(name + ".weight", l.weight);
    if (l.bias.defined()) out.emplace_back(name + ".bias", l.bias);
  };
  auto block = [&](const std::string& p, const h3::BlockWeights& b) {
    out.emplace_back(p + ".norm1", b.norm1);
    out.emplace_back(p + ".norm2", b.norm2);
    out.emplace_back(p + ".norm_q", b.norm_q);
    out.emplace_back(p + ".norm_k", b.norm_k);
    linear(p + ".qkv", b.qkv);
    linear(p + ".out", b.out);
    linear(p + ".fc1", b.fc1);
    linear(p + ".fc2", b.fc2);
    if (b.adaln.weight.defined()) linear(p + ".adaln", b.adaln);
  };
  linear("proj_in", w.proj_in);
  linear("audio_proj_in", w.audio_proj_in);
  linear("context_embedder", w.context_embedder);
  linear("time_linear_1", w.time_linear_1);
  linear("time_linear_2", w.time_linear_2);
  for (size_t i = 0; i < w.refiner.size(); ++i) block("refiner." + std::to_string(i), w.refiner[i]);
  out.emplace_back("refiner_final_norm", w.refiner_final_norm);
  for (size_t i = 0; i < w.blocks.size(); ++i) block("blocks." + std::to_string(i), w.blocks[i]);
  out.emplace_back("norm_out_norm", w.norm_out_norm);
  linear("norm_out_linear", w.norm_out_linear);
  linear("proj_out", w.proj_out);
  linear("audio_proj_out", w.audio_proj_out);
  return out;
}

class GoldenConversion : public testing::TestWithParam<std::string> {
 protected:
  std::string original() const { return golden_path(GetParam() + "/original.safetensors"); }
  std::string diffusers() const { return golden_path(GetParam() + "/diffusers.safetensors"); }
  h3::H3Config config() const { return *h3::config_from_file(golden_path(GetParam() + "/config.json")); }
};

// rope.inv_freq is recomputed from the config by diffusers_to_original and compared with the
// reference's stored bits here like every other tensor.
TEST_P(GoldenConversion, OriginalToDiffusersToOriginalIsBitExact) {
  auto orig = read_checkpoint(original());
  ASSERT_TRUE(orig.ok()) << orig.status().to_string();
  auto diff = read_checkpoint(diffusers());
  ASSERT_TRUE(diff.ok()) << diff.status().to_string();
  auto to_diffusers = h3::original_to_diffusers(*orig, config());
  ASSERT_TRUE(to_diffusers.ok()) << to_diffusers.status().to_string();
  expect_same_tensors(*to_diffusers, *diff);
  auto back = h3::diffusers_to_original(*to_diffusers, config());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_tensors(*back, *orig);
}

// What the device loaders read: each diffusers tensor asked for by name, the renamed ones the
// stored tensors themselves (no copy), a fused layer's parts gathered then.
TEST_P(GoldenConversion, HostWeightsHandOutTheConvertedTensorsOneAtATime) {
  auto orig = read_checkpoint(original());
  ASSERT_TRUE(orig.ok()) << orig.status().to_string();
  auto diff = read_checkpoint(diffusers());
  ASSERT_TRUE(diff.ok()) << diff.status().to_string();
  std::map<std::string, const void*> stored;
  for (const auto& [name, tensor] : *orig) stored[h3::original_name_to_diffusers(name)] = tensor.data();
  auto weights = h3::HostWeights::original(*orig, config());
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  NamedTensors handed;
  int gathered = 0;
  for (const auto& [name, want] : *diff) {
    auto got = weights->weight(name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), 1u) << name;
    EXPECT_EQ(got->front().first, name);
    const auto it = stored.find(name);
    const auto rows = weights->stored_rows(name);
    if (it != stored.end()) {
      EXPECT_EQ(got->front().second.data(), it->second) << name << " is the stored tensor";
      EXPECT_FALSE(rows.has_value()) << name;
    } else {
      ++gathered;
      // The rows a loader copies straight from the stored weight are the gathered part's.
      ASSERT_TRUE(rows.has_value()) << name;
      const Tensor from_rows = h3::gather_rows(rows->stored.front().second, rows->runs);
      ASSERT_EQ(from_rows.shape(), want.shape()) << name;
      EXPECT_EQ(std::memcmp(from_rows.data(), want.contiguous().data(), want.nbytes()), 0) << name;
    }
    handed.push_back(got->front());
  }
  expect_same_tensors(handed, *diff);
  const h3::H3Config c = config();
  EXPECT_EQ(gathered, 4 * (c.num_layers + c.num_refiner_layers)) << "q, k, v and FC1 of every block";
  auto none = weights->weight("transformer_blocks.0.attn.to_qkv.weight");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // A diffusers model's tensors are handed out as they are.
  const h3::HostWeights as_stored(*diff);
  for (const auto& [name, want] : *diff) {
    auto got = as_stored.weight(name);
    ASSERT_TRUE(got.ok() && got->size() == 1u) << name;
    EXPECT_EQ(got->front().second.data(), want.data()) << name;
  }
}

TEST_P(GoldenConversion, AFusedLayerOfTheWrongRowsIsRefusedByName) {
  auto orig = read_checkpoint(original());
  ASSERT_TRUE(orig.ok()) << orig.status().to_string();
  for (auto& [name, tensor] : *orig) {
    if (name == "blocks.0.mlp.fc1.weight") tensor = *tensor.slice(0, 0, tensor.size(0) - 1);
  }
  const auto weights = h3::HostWeights::original(*orig, config());
  ASSERT_FALSE(weights.ok());
  EXPECT_NE(weights.status().message().find("tensor 'blocks.0.mlp.fc1.weight': shape"), std::string::npos)
      << weights.status().message();
}

TEST_P(GoldenConversion, DiffusersToOriginalToDiffusersIsBitExact) {
  auto diff = read_checkpoint(diffusers());
  ASSERT_TRUE(diff.ok()) << diff.status().to_string();
  auto to_original = h3::diffusers_to_original(*diff, config());
  ASSERT_TRUE(to_original.ok()) << to_original.status().to_string();
  auto back = h3::original_to_diffusers(*to_original, config());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_tensors(*back, *diff);
}

// The streaming path (per-group conversion, several shards) gives the same bytes as the goldens.
TEST_P(GoldenConversion, StreamingConvertEqualsTheOtherGoldenLayout) {
  TempDir tmp;
  h3::CheckpointWriteOptions options;
  options.max_shard_bytes = 40'000;
  options.layout = h3::CheckpointLayout::kDiffusers;
  const std::string to_diffusers = tmp.file("diffusers");
  ASSERT_OK(h3::convert_checkpoint(original(), to_diffusers, options));
  options.layout = h3::CheckpointLayout::kOriginal;
  const std::string to_original = tmp.file("original");
  ASSERT_OK(h3::convert_checkpoint(diffusers(), to_original, options));

  auto written = ShardedCheckpoint::open(to_diffusers);
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  EXPECT_GT(written->shards().size(), 2u);
  auto got_diffusers = h3::read_all(*written);
  auto want_diffusers = read_checkpoint(diffusers());
  ASSERT_TRUE(got_diffusers.ok() && want_diffusers.ok());
  expect_same_tensors(*got_diffusers, *want_diffusers);
  auto got_original = read_checkpoint(to_original);
  auto want_original = read_checkpoint(original());
  ASSERT_TRUE(got_original.ok() && want_original.ok());
  expect_same_tensors(*got_original, *want_original);

  // Converting the conversion back is the identity too.
  options.layout = h3::CheckpointLayout::kOriginal;
  ASSERT_OK(h3::convert_checkpoint(to_diffusers, tmp.file("original_again"), options));
  auto again = read_checkpoint(tmp.file("original_again"));
  ASSERT_TRUE(again.ok());
  expect_same_tensors(*again, *want_original);
}

TEST_P(GoldenConversion, ConvertThenLoadGivesIdenticalWeights) {
  TempDir tmp;
  h3::CheckpointWriteOptions options;
  options.layout = h3::CheckpointLayout::kDiffusers;
  ASSERT_OK(h3::convert_checkpoint(original(), tmp.file("out"), options));
  auto converted = h3::load_model(tmp.file("out"), DType::kF32);
  ASSERT_TRUE(converted.ok()) << converted.status().to_string();
  auto reference = h3::load_model(original(), DType::kF32);
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  EXPECT_EQ(converted->layout, h3::CheckpointLayout::kDiffusers);
  EXPECT_EQ(converted->config, reference->config);
  expect_same_tensors(flatten(converted->weights), flatten(reference->weights));
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenConversion, testing::Values("h3_tiny", "h3_small"));

TEST(CheckpointValidation, NamesTheTensorThatDoesNotFit) {
  const h3::H3Config config = *h3::config_preset("test");
  auto orig = read_checkpoint(golden_path("h3_tiny/original.safetensors"));
  ASSERT_TRUE(orig.ok());
  EXPECT_TRUE(h3::validate_checkpoint_tensors(*orig, h3::CheckpointLayout::kOriginal, config).ok());

  NamedTensors missing = *orig;
  std::erase_if(missing, [](const auto& e) { return e.first == "blocks.1.attn.qkv_proj.weight"; });
  const Status m = h3::validate_checkpoint_tensors(missing, h3::CheckpointLayout::kOriginal, config);
  EXPECT_NE(m.message().find("missing tensor 'transformer_blocks.1.attn.to_q.weight'"), std::string::npos) << m.message();

  NamedTensors bad_qkv = *orig;
  for (auto& [name, t] : bad_qkv) {
    if (name == "blocks.0.attn.qkv_proj.weight") t = *t.slice(0, 0, 90);
  }
  const Status q = h3::validate_checkpoint_tensors(bad_qkv, h3::CheckpointLayout::kOriginal, config);
  EXPECT_NE(q.message().find("'blocks.0.attn.qkv_proj.weight': shape [90, 24]"), std::string::npos) << q.message();

  h3::H3Config wider = config;
  wider.rope_freq_dim = 3;
  const Status r = h3::validate_checkpoint_tensors(*orig, h3::CheckpointLayout::kOriginal, wider);
  EXPECT_NE(r.message().find("rope.inv_freq"), std::string::npos) << r.message();
}

// ---- synthetic weights --------------------------------------------------------------------------

TEST(SyntheticWeights, SameSeedSameBytesOtherSeedOtherBytes) {
  const h3::H3Config config = *h3::config_preset("small");
  auto a = h3::synthetic_weights(config, DType::kBF16, 7);
  auto b = h3::synthetic_weights(config, DType::kBF16, 7);
  auto c = h3::synthetic_weights(config, DType::kBF16, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  expect_same_tensors(*a, *b);
  for (size_t i = 0; i < a->size(); ++i) {
    const auto& [name, ta] = (*a)[i];
    const Tensor& tc = (*c)[i].second;
    const bool random = ta.rank() == 2;
    EXPECT_EQ(std::memcmp(ta.data(), tc.data(), ta.nbytes()) != 0, random) << name;
  }
}

// The fast parallel filler equals the plain definition: one fill_normal over the whole tensor,
// the rule's scale in fp32, and Tensor::to's RNE rounding, whatever the chunking.
TEST(SyntheticWeights, EqualsThePlainDefinition) {
  const std::vector<h3::TensorSpec> specs = {
      {"transformer_blocks.0.attn.to_q.weight", Shape{97, 401}, false},    // several fill chunks, ragged end
      {"transformer_blocks.3.adaln_proj.linear.weight", Shape{30, 7}, false},
      {"proj_out.weight", Shape{33, 65}, true},                             // fp32 island
  };
  for (const auto& spec : specs) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      auto got = h3::synthetic_tensor(spec, dtype, 1234);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      const h3::SyntheticInit init = h3::synthetic_init(spec);
      std::vector<float> z(spec.shape.numel());
      fill_normal(z.data(), spec.shape.numel(), 1234, h3::fnv1a64(spec.name));
      for (float& v : z) v *= init.scale;
      auto want = Tensor::from_f32(z, spec.shape).to(spec.fp32_island ? DType::kF32 : dtype);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(got->dtype(), want->dtype()) << spec.name;
      EXPECT_EQ(std::memcmp(got->data(), want->data(), want->nbytes()), 0) << spec.name;
    }
  }
}

TEST(SyntheticWeights, ScalesFollowTheFanInRule) {
  const h3::H3Config config = *h3::config_preset("small");
  auto weights = h3::synthetic_weights(config, DType::kBF16, 0);
  ASSERT_TRUE(weights.ok());
  const std::vector<h3::TensorSpec> schema = h3::diffusers_schema(config);
  ASSERT_EQ(weights->size(), schema.size());
  double pooled = 0;  // sum of (x / expected std)^2 over every random tensor
  int64_t pooled_n = 0;
  for (size_t i = 0; i < schema.size(); ++i) {
    const h3::TensorSpec& spec = schema[i];
    const Tensor& t = (*weights)[i].second;
    ASSERT_EQ(t.dtype(), spec.fp32_island ? DType::kF32 : DType::kBF16) << spec.name;
    ASSERT_EQ(t.shape(), spec.shape) << spec.name;
    const int64_t n = t.numel();
    if (spec.shape.rank() == 1) {
      const double want = spec.name.ends_with(".bias") ? 0.0 : 1.0;
      for (int64_t k = 0; k < n; ++k) ASSERT_EQ(element_as_double(t, k), want) << spec.name;
      continue;
    }
    const bool modulation = spec.name.ends_with("adaln_proj.linear.weight") || spec.name == "norm_out.linear.weight";
    const double want_std = (modulation ? 0.1 : 1.0) / std::sqrt(static_cast<double>(spec.shape[1]));
    double sum = 0, sum_sq = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double v = element_as_double(t, k);
      sum += v;
      sum_sq += v * v;
    }
    const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
    // The sample std of n normals is off by about 1/sqrt(2n); allow 4 of those, and at least 3%.
    const double tolerance = std::max(0.03, 4.0 / std::sqrt(2.0 * n));
    EXPECT_NEAR(std / want_std, 1.0, tolerance) << spec.name << " (n = " << n << ")";
    EXPECT_LT(std::abs(mean), 4.0 * want_std / std::sqrt(static_cast<double>(n))) << spec.name;
    pooled += sum_sq / (want_std * want_std);
    pooled_n += n;
  }
  EXPECT_NEAR(pooled / pooled_n, 1.0, 0.01);  // about a million draws: 1% is many sigmas
}

TEST(SyntheticWeights, RejectsUnsupportedDtypes) {
  const h3::H3Config config = *h3::config_preset("test");
  const auto result = h3::synthetic_weights(config, DType::kF8E4M3, 0);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
}

// ---- streaming writer ---------------------------------------------------------------------------

TEST(CheckpointWriter, TinyShardsMakeSeveralShardsAndAnIndexTheLoadersAccept) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("test");
  h3::CheckpointWriteOptions options;
  options.max_shard_bytes = 8'000;
  std::vector<std::string> progress;
  options.progress = [&](const std::string& line) { progress.push_back(line); };
  const std::string dir = tmp.file("ckpt");
  ASSERT_OK(h3::write_synthetic_checkpoint(dir, config, DType::kBF16, 5, options));

  int shard_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors")) {
      ++shard_files;
      EXPECT_TRUE(name.starts_with("model-") && name.find("-of-") != std::string::npos) << name;
    } else {
      EXPECT_TRUE(name == "model.safetensors.index.json" || name == "config.json") << "stray file " << name;
    }
  }
  EXPECT_GT(shard_files, 3);
  EXPECT_EQ(progress.size(), static_cast<size_t>(shard_files));
  EXPECT_FALSE(fs::exists(dir + ".tmp-" + std::to_string(::getpid())));

  auto checkpoint = ShardedCheckpoint::open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->shards().size(), static_cast<size_t>(shard_files));
  const nlohmann::json index = nlohmann::json::parse(test_util::read_bytes(dir + "/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& name : checkpoint->names()) total += checkpoint->info(name)->nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), checkpoint->names().size());
  for (const auto& shard : checkpoint->shards()) {
    EXPECT_EQ(shard.metadata().at("layout"), "diffusers");
    EXPECT_EQ(*h3::config_from_json_string(shard.metadata().at("config")), config);
  }
  const nlohmann::json config_json = nlohmann::json::parse(test_util::read_bytes(dir + "/config.json"));
  EXPECT_EQ(config_json["_class_name"], "MiniMaxH3Transformer3DModel");
  EXPECT_EQ(*h3::config_from_json(config_json), config);

  auto in_memory = h3::synthetic_weights(config, DType::kBF16, 5);
  ASSERT_TRUE(in_memory.ok());
  expect_same_tensors(*h3::read_all(*checkpoint), *in_memory);
  auto loaded = h3::load_model(dir, DType::kBF16);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->config, config);
}

TEST(CheckpointWriter, BothLayoutsLoadToTheSameWeights) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("small");
  h3::CheckpointWriteOptions options;
  options.max_shard_bytes = 50'000;
  ASSERT_OK(h3::write_synthetic_checkpoint(tmp.file("d"), config, DType::kBF16, 9, options));
  options.layout = h3::CheckpointLayout::kOriginal;
  ASSERT_OK(h3::write_synthetic_checkpoint(tmp.file("o"), config, DType::kBF16, 9, options));
  auto original = read_checkpoint(tmp.file("o"));
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(std::count_if(original->begin(), original->end(), [](const auto& e) { return e.first == "rope.inv_freq"; }),
            1);
  auto d = h3::load_model(tmp.file("d"), DType::kBF16);
  auto o = h3::load_model(tmp.file("o"), DType::kBF16);
  ASSERT_TRUE(d.ok() && o.ok());
  EXPECT_EQ(o->layout, h3::CheckpointLayout::kOriginal);
  expect_same_tensors(flatten(o->weights), flatten(d->weights));
}

TEST(CheckpointWriter, RefusesANonEmptyFolderUnlessReplacing) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("test");
  const std::string dir = tmp.file("busy");
  fs::create_directory(dir);
  test_util::write_bytes(dir + "/notes.txt", "keep me");
  h3::CheckpointWriteOptions options;
  const Status refused = h3::write_synthetic_checkpoint(dir, config, DType::kBF16, 0, options);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("not empty"), std::string::npos) << refused.message();
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));

  options.replace_existing = true;
  ASSERT_OK(h3::write_synthetic_checkpoint(dir, config, DType::kBF16, 0, options));
  EXPECT_FALSE(fs::exists(dir + "/notes.txt"));
  EXPECT_TRUE(h3::load_model(dir, DType::kBF16).ok());
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(entry.path().filename(), "busy") << "left behind: " << entry.path();
  }
}

TEST(CheckpointWriter, AFailingSourceLeavesNothingBehind) {
  TempDir tmp;
  const h3::H3Config config = *h3::config_preset("test");
  h3::CheckpointWriteOptions options;
  options.max_shard_bytes = 2'000;  // shards are already on disk when the source fails
  int asked = 0;
  const h3::GroupSource failing = [&](const h3::WeightGroup& group) -> Result<NamedTensors> {
    if (++asked == 4) return io_error("disk on fire");
    NamedTensors out;
    for (const auto& spec : group.specs) out.emplace_back(spec.name, *h3::synthetic_tensor(spec, DType::kBF16, 0));
    return out;
  };
  const Status status = h3::write_checkpoint(tmp.file("out"), config, failing, options);
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_TRUE(fs::is_empty(tmp.path())) << "a failed write left files behind";

  const h3::GroupSource wrong_shape = [&](const h3::WeightGroup& group) -> Result<NamedTensors> {
    NamedTensors out;
    for (const auto& spec : group.specs) {
      Shape shape = spec.shape;
      if (spec.name == "norm_out.linear.weight") shape[0] += 1;
      out.emplace_back(spec.name, Tensor::zeros(shape, DType::kF32));
    }
    return out;
  };
  const Status shape_status = h3::write_checkpoint(tmp.file("out"), config, wrong_shape, options);
  EXPECT_NE(shape_status.message().find("'norm_out.linear.weight': shape [49, 16]"), std::string::npos)
      << shape_status.message();
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(CheckpointWriter, GroupsKeepEachBlockTogether) {
  const h3::H3Config config = *h3::config_preset("small");
  const auto groups = h3::schema_groups(config);
  ASSERT_EQ(groups.size(), 1u + config.num_refiner_layers + 1u + config.num_layers + 1u);
  EXPECT_EQ(groups.front().name, "inputs");
  EXPECT_EQ(groups[1].name, "token_refiner.refiner_blocks.0");
  EXPECT_EQ(groups.back().name, "outputs");
  size_t specs = 0;
  for (const auto& g : groups) specs += g.specs.size();
  EXPECT_EQ(specs, h3::diffusers_schema(config).size());
}

TEST(H3Config, IntegerFieldsAreTypeAndRangeChecked) {
  const nlohmann::json good = h3::config_preset("test")->to_json();
  const auto refused = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
    nlohmann::json j = good;
    j[key] = value;
    auto c = h3::config_from_json(j);
    ASSERT_FALSE(c.ok()) << key << " = " << value.dump();
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  refused("num_layers", "2", "config field 'num_layers' must be an integer");
  // Out of int's range: refused, not wrapped (4294967298 would become 2).
  refused("num_layers", 4294967298ull, "config field 'num_layers' must be an integer (32-bit)");
  refused("patch_size", {1, 2, -4294967294ll}, "config field 'patch_size' must hold integers (32-bit)");
  EXPECT_TRUE(h3::config_from_json(good).ok());
}

}  // namespace
}  // namespace vortex
