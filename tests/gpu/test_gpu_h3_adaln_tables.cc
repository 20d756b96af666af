// The exactness gate of AdaLN tables per request (AdaLnTables::kPerRequest, cuda_adaln_tables.cc):
// tables planned up front from streamed AdaLN weights give BITWISE the block output and the 2-step
// trajectory of the per-step GEMMs from resident weights, under both linear recipes, and the model
// holds no AdaLN weight. With those tables the FFN residual may be folded into the next block's
// first norm, again bit for bit. Steps that were not planned are refused, and so is a model too
// large for the device, naming its sizes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "cuda/runtime.h"
#include "cuda/synthetic_fill.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "h3_test_models.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#include "models/h3/weights.h"

namespace vortex {
namespace {

constexpr int64_t kTextRows = 12;

h3::H3Config config() { return test::released_heads_config(4, 512, 1024, 3); }

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::unique_ptr<h3::CudaH3Transformer> make_model(const h3::H3Config& c, int64_t rows, h3::LinearRecipe recipe,
                                                  h3::AdaLnTables tables) {
  h3::CudaModelOptions options;
  options.recipe = recipe;
  options.adaln_tables = tables;
  auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(17, nullptr), rows, nullptr, options);
  if (!model.ok()) throw std::runtime_error(model.status().to_string());
  return std::move(*model);
}

class GpuH3AdaLnTables : public ::testing::TestWithParam<h3::LinearRecipe> {};

TEST_P(GpuH3AdaLnTables, BlockOutputAndTwoStepTrajectoryAreBitwiseThoseOfThePerStepPath) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = config();
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;  // grid points including the final 0: two forwards
  options.seed = 6;
  auto geometry = h3::resolve_geometry(options.video, c);
  ASSERT_TRUE(geometry.ok());
  auto layout = h3::build_t2va_layout(kTextRows, *geometry, c);
  ASSERT_TRUE(layout.ok());
  const Tensor text = h3::seeded_normal({kTextRows, c.text_dim}, 2, h3::kSyntheticTextStream);

  auto per_step = make_model(c, layout->num_rows, GetParam(), h3::AdaLnTables::kPerStep);
  auto per_request = make_model(c, layout->num_rows, GetParam(), h3::AdaLnTables::kPerRequest);
  // The per-request model holds no AdaLN weight: 18C x TE + 18C bf16 per block less.
  const size_t adaln_bytes = static_cast<size_t>(c.num_layers) * (18 * c.hidden_size * c.time_embed_dim + 18 * c.hidden_size) * 2;
  EXPECT_LE(per_request->weight_bytes() + adaln_bytes, per_step->weight_bytes());

  // Block level: every block once from the same seeded residual stream.
  const h3::RowTimesteps timesteps = h3::assign_row_timesteps(*layout, 0.4f, 0.9f);
  Tensor outputs[2];
  int slot = 0;
  for (h3::CudaH3Transformer* model : {per_step.get(), per_request.get()}) {
    ASSERT_TRUE(model->prepare(*layout, text).ok());
    ASSERT_TRUE(model->plan_steps({timesteps.timesteps}).ok());
    ASSERT_TRUE(model->upload_step_tables(timesteps).ok());
    auto x = model->residual().slice(0, 0, layout->num_rows);
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(cuda::fill_scaled_normal(*x, 31, 100, 1.0f, nullptr).ok());
    for (int block = 0; block < c.num_layers; ++block) ASSERT_TRUE(model->run_block(block).ok());
    auto out = cuda::download(*x, nullptr);
    ASSERT_TRUE(out.ok());
    outputs[slot++] = std::move(*out);
  }
  EXPECT_TRUE(bitwise_equal(outputs[0], outputs[1]))
      << "block stack, planned vs per-step tables: rel-L2 " << test::rel_l2(outputs[1], outputs[0]);

  // Trajectory level: generate plans the schedule itself (denoise calls plan_steps).
  const test::TrajectoryChecksums per_step_run = test::trajectory_checksums(*per_step, text, options);
  test::expect_same_trajectory(test::trajectory_checksums(*per_request, text, options), per_step_run,
                               "planned vs per-step tables");
}

// CudaModelOptions::fold_ffn_residual: each block's FFN residual applied by the next block's first
// norm (and the last block's after the stack) gives the 2-step trajectory of the separate pass bit
// for bit, with the stack replayed from a CUDA graph and with direct launches.
TEST_P(GpuH3AdaLnTables, FoldedFfnResidualGivesTheSeparatePassTrajectory) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = config();
  const test::H3TestRequest request = test::make_h3_request(c, kTextRows, 4, 0.5f, 0.7f);  // layout and text
  h3::GenerateOptions options;
  options.video = {128, 192, 22};  // make_h3_request's clip
  options.steps = 3;               // grid points including the final 0: two forwards
  options.seed = 8;
  auto model = make_model(c, request.layout.num_rows, GetParam(), h3::AdaLnTables::kPerRequest);
  const auto run = [&](bool fold, bool graphs) {
    model->set_fold_ffn_residual(fold);
    model->set_cuda_graphs(graphs);
    return test::trajectory_checksums(*model, request.text, options);
  };
  const test::TrajectoryChecksums separate = run(false, true);
  test::expect_same_trajectory(run(true, true), separate, "folded, CUDA graph");
  test::expect_same_trajectory(run(true, false), separate, "folded, direct launches");
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuH3AdaLnTables, ::testing::Values(h3::LinearRecipe::kBf16, h3::LinearRecipe::kFp8),
                         [](const ::testing::TestParamInfo<h3::LinearRecipe>& info) {
                           return info.param == h3::LinearRecipe::kFp8 ? std::string("fp8") : std::string("bf16");
                         });

TEST(GpuH3AdaLnTablesErrors, UnplannedTimestepsAndBadPlansAreRefused) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = config();
  const test::H3TestRequest r = test::make_h3_request(c, kTextRows, 3, 0.5f, 0.7f);
  auto model = make_model(c, r.layout.num_rows, h3::LinearRecipe::kBf16, h3::AdaLnTables::kPerRequest);
  ASSERT_TRUE(model->prepare(r.layout, r.text).ok());

  const Status empty_step = model->plan_steps({{}});
  EXPECT_FALSE(empty_step.ok());
  EXPECT_NE(empty_step.message().find("step 0 has 0 distinct timesteps"), std::string::npos) << empty_step.message();

  ASSERT_TRUE(model->plan_steps({{0.25f, 0.5f}}).ok());
  auto unplanned = model->forward(r.in);  // 0.5 / 0.7
  ASSERT_FALSE(unplanned.ok());
  EXPECT_NE(unplanned.status().message().find("were not planned"), std::string::npos) << unplanned.status().message();

  ASSERT_TRUE(model->plan_steps({r.in.timesteps.timesteps}).ok());
  auto planned = model->forward(r.in);
  ASSERT_TRUE(planned.ok()) << planned.status().to_string();

  EXPECT_FALSE(model->download_block_weights(0).ok()) << "no AdaLN weights to download";
}

TEST(GpuH3ModelMemory, AModelThatCannotFitIsRefusedNamingItsSizes) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  // A billion rows of activations is terabytes: refused before anything is allocated, with the
  // sizes and what would make it smaller.
  auto model = h3::CudaH3Transformer::create(config(), h3::synthetic_weight_filler(1, nullptr), 1000000000);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kOutOfMemory) << model.status().to_string();
  const std::string& m = model.status().message();
  EXPECT_NE(m.find("of activations for 1000000000 rows"), std::string::npos) << m;
  EXPECT_NE(m.find("the fp8 recipe"), std::string::npos) << m;
  EXPECT_NE(m.find("AdaLN tables per request"), std::string::npos) << m;
  EXPECT_FALSE(h3::CudaH3Transformer::create(config(), h3::synthetic_weight_filler(1, nullptr), 0).ok());
}

}  // namespace
}  // namespace vortex
