// Attention modes per request and per block (DESIGN section 3): int8fp8 only runs when asked for,
// stays close to exact, and a block kept exact computes exactly what the exact plan does.
#include <gtest/gtest.h>

#include <cstring>

#include "h3_golden_util.h"
#include "models/h3/transformer.h"

namespace vortex {
namespace {

struct Fixture {
  std::unique_ptr<h3::H3Transformer> model;
  test::GoldenCase golden;
};

Fixture small_model() {
  Fixture f;
  auto loaded = h3::load_model(test::golden_path("h3_small/diffusers.safetensors"), DType::kBF16);
  EXPECT_TRUE(loaded.ok());
  auto model = h3::H3Transformer::create(std::move(loaded->weights));
  EXPECT_TRUE(model.ok());
  f.model = std::move(*model);
  auto io = SafetensorsFile::open(test::golden_path("h3_small/io_bf16.safetensors"));
  EXPECT_TRUE(io.ok());
  auto golden = test::read_golden_case(*io);
  EXPECT_TRUE(golden.ok());
  f.golden = std::move(*golden);
  return f;
}

h3::StepOutputs run(const Fixture& f, const h3::AttentionPlan& plan) {
  auto request = f.model->prepare(f.golden.layout, f.golden.text_states);
  EXPECT_TRUE(request.ok());
  h3::StepInputs in = f.golden.step;
  in.attention = plan;
  auto out = f.model->forward(*request, in);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return *out;
}

TEST(H3AttentionModes, Int8Fp8RunsOnlyWhenAskedAndStaysCloseToExact) {
  const Fixture f = small_model();
  const h3::StepOutputs exact = run(f, {});
  auto int8 = h3::AttentionPlan::parse("int8fp8", {}, f.model->config().num_layers);
  ASSERT_TRUE(int8.ok());
  const h3::StepOutputs quantized = run(f, *int8);
  const double video = test::rel_l2(quantized.video_velocity, exact.video_velocity);
  const double audio = test::rel_l2(quantized.audio_velocity, exact.audio_velocity);
  std::printf("int8fp8 vs exact through 3 blocks (bf16): video rel-L2 %.3e, audio %.3e\n", video, audio);
  EXPECT_GT(video, 0.0);  // the mode did run
  EXPECT_LE(video, 0.1);
  EXPECT_LE(audio, 0.1);
}

TEST(H3AttentionModes, BlocksKeptExactMatchTheExactPlanBitForBit) {
  const Fixture f = small_model();
  const int blocks = f.model->config().num_layers;
  std::vector<int> all(blocks);
  for (int i = 0; i < blocks; ++i) all[i] = i;
  auto plan = h3::AttentionPlan::parse("int8fp8", all, blocks);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->uses(h3::AttentionMode::kInt8Fp8));
  const h3::StepOutputs a = run(f, {}), b = run(f, *plan);
  ASSERT_EQ(a.video_velocity.nbytes(), b.video_velocity.nbytes());
  EXPECT_EQ(std::memcmp(a.video_velocity.data(), b.video_velocity.data(), a.video_velocity.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.audio_velocity.data(), b.audio_velocity.data(), a.audio_velocity.nbytes()), 0);
}

TEST(H3AttentionModes, BadPlansAreErrorsNamingTheProblem) {
  auto mode = h3::AttentionPlan::parse("fp4", {}, 3);
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.status().message().find("fp4"), std::string::npos);
  auto block = h3::AttentionPlan::parse("int8fp8", {3}, 3);
  ASSERT_FALSE(block.ok());
  EXPECT_NE(block.status().message().find("exact block 3"), std::string::npos);
  const Fixture f = small_model();
  h3::AttentionPlan wrong;
  wrong.per_block = {h3::AttentionMode::kExact};
  auto request = f.model->prepare(f.golden.layout, f.golden.text_states);
  ASSERT_TRUE(request.ok());
  h3::StepInputs in = f.golden.step;
  in.attention = wrong;
  auto out = f.model->forward(*request, in);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("attention plan"), std::string::npos);
}

}  // namespace
}  // namespace vortex
