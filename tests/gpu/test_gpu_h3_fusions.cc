// The exactness gate of the CUDA model's fusions and CUDA graphs (DESIGN section 3): with each on,
// the block output and a 2-step trajectory checksum are BITWISE equal to the unfused path. Two widths: the
// small golden config (the norms' group kernel) and a 2048-wide config with the released head
// shape (the block kernel the canonical 5376-wide model runs); int8fp8 attention on the latter.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <utility>

#include "cuda/runtime.h"
#include "cuda/synthetic_fill.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "h3_test_models.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/generate.h"
#include "models/h3/synthetic.h"

namespace vortex {
namespace {

h3::H3Config wide_config() { return test::released_heads_config(16, 2048, 4096, 2); }

h3::H3Config small_config() {
  auto c = h3::config_from_file(test::golden_path("h3_small/config.json"));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// The residual stream after every block, run from a seeded start with fused or separate norms and
// the given attention mode. Undefined (with the failure reported) if a block fails.
Tensor block_stack_output(h3::CudaH3Transformer& model, int blocks, const Tensor& x, bool fused, h3::AttentionMode mode,
                          uint64_t seed) {
  model.set_fused_norms(fused);
  if (!cuda::fill_scaled_normal(x, seed, 100, 1.0f, nullptr).ok()) {
    ADD_FAILURE() << "could not fill the residual stream";
    return Tensor();
  }
  for (int block = 0; block < blocks; ++block) {
    const Status status = model.run_block(block, mode);
    if (!status.ok()) {
      ADD_FAILURE() << "block " << block << ": " << status.to_string();
      return Tensor();
    }
  }
  auto out = cuda::download(x, nullptr);
  if (!out.ok()) {
    ADD_FAILURE() << out.status().to_string();
    return Tensor();
  }
  return std::move(*out);
}

// The fused and unfused block stacks' outputs: finite, and equal bit for bit.
void expect_same_finite_outputs(const Tensor& fused, const Tensor& unfused, const std::string& what) {
  ASSERT_TRUE(fused.defined() && unfused.defined()) << what;
  for (int64_t i = 0; i < fused.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(element_as_double(fused, i))) << what << ": non-finite block output at element " << i;
  }
  EXPECT_TRUE(bitwise_equal(fused, unfused)) << what << ": fused vs unfused rel-L2 " << test::rel_l2(fused, unfused);
}

// The text tokens the block-stack gate prepares its model with.
Tensor gate_text(const h3::H3Config& c) { return h3::seeded_normal({16, c.text_dim}, 4, h3::kSyntheticTextStream); }

// The block-stack gate: a model of `c` on the {128, 192, 22} clip with 16 text tokens, prepared at
// timesteps 0.3..0.8; its block stack, run from the same start with fused and with separate
// norms, must give the same finite output bit for bit. Returns the model for further gates (null,
// with the failure reported, when it cannot be built).
std::unique_ptr<h3::CudaH3Transformer> expect_block_stack_gate(const h3::H3Config& c, uint64_t weight_seed,
                                                               const h3::CudaModelOptions& options,
                                                               h3::AttentionMode mode, uint64_t start_seed,
                                                               const std::string& what) {
  auto geometry = h3::resolve_geometry({128, 192, 22}, c);
  if (!geometry.ok()) {
    ADD_FAILURE() << what << ": " << geometry.status().to_string();
    return nullptr;
  }
  auto layout = h3::build_t2va_layout(16, *geometry, c);
  if (!layout.ok()) {
    ADD_FAILURE() << what << ": " << layout.status().to_string();
    return nullptr;
  }
  auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(weight_seed, nullptr), layout->num_rows,
                                             nullptr, options);
  if (!model.ok()) {
    ADD_FAILURE() << what << ": " << model.status().to_string();
    return nullptr;
  }
  Status status = (*model)->prepare(*layout, gate_text(c));
  if (status.ok()) status = (*model)->upload_step_tables(h3::assign_row_timesteps(*layout, 0.3f, 0.8f));
  auto x = (*model)->residual().slice(0, 0, layout->num_rows);
  if (!status.ok() || !x.ok()) {
    ADD_FAILURE() << what << ": " << (status.ok() ? x.status() : status).to_string();
    return nullptr;
  }
  const Tensor fused = block_stack_output(**model, c.num_layers, *x, true, mode, start_seed);
  const Tensor unfused = block_stack_output(**model, c.num_layers, *x, false, mode, start_seed);
  expect_same_finite_outputs(fused, unfused, what);
  return std::move(*model);
}

class GpuH3Fusions : public ::testing::TestWithParam<int> {
 protected:
  h3::H3Config config() const { return GetParam() == 0 ? small_config() : wide_config(); }
};

TEST_P(GpuH3Fusions, BlockOutputIsBitwiseEqualToTheUnfusedBlock) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  expect_block_stack_gate(config(), 11, {}, h3::AttentionMode::kExact, 21, "block stack");
}

TEST_P(GpuH3Fusions, TwoStepTrajectoryChecksumIsBitwiseEqual) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = config();
  const Tensor text = h3::seeded_normal({12, c.text_dim}, 3, h3::kSyntheticTextStream);
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;  // grid points including the final 0: two forwards
  options.seed = 5;
  auto geometry = h3::resolve_geometry(options.video, c);
  ASSERT_TRUE(geometry.ok());
  auto layout = h3::build_t2va_layout(12, *geometry, c);
  ASSERT_TRUE(layout.ok());
  auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(12, nullptr), layout->num_rows);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  // The default (fused norms, the forward's device work replayed from a CUDA graph), fused with direct launches,
  // and the reference path: separate launches, no graph. All three must agree bit for bit.
  struct Path {
    bool fused, graphs;
  };
  const Path paths[] = {{true, true}, {true, false}, {false, false}};
  test::TrajectoryChecksums runs[3];
  for (int p = 0; p < 3; ++p) {
    (*model)->set_fused_norms(paths[p].fused);  // also covers the refiner, which prepare() runs
    (*model)->set_cuda_graphs(paths[p].graphs);
    runs[p] = test::trajectory_checksums(**model, text, options);
  }
  for (int p = 0; p < 2; ++p) test::expect_same_trajectory(runs[p], runs[2], "path " + std::to_string(p));
  std::printf("2-step trajectory, fused + graph / fused / unfused: video %s, audio %s\n",
              runs[0].video.sha256.substr(0, 16).c_str(), runs[0].audio.sha256.substr(0, 16).c_str());
}

// One model serving requests of other shapes in turn: the forward's graph is keyed by each stream's
// rows and captured again when they change (the text stream's buffer grows with a longer prompt),
// so every request's trajectory must equal its direct launches', also when an earlier shape returns.
TEST(GpuH3Graphs, RequestsOfOtherShapesRecaptureAndMatchDirectLaunches) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const h3::H3Config c = small_config();
  struct Request {
    int64_t text_rows;
    h3::VideoGeometry video;
  };
  const Request requests[] = {{12, {128, 192, 22}}, {20, {96, 128, 5}}, {12, {128, 192, 22}}};
  int64_t max_rows = 0;
  for (const Request& r : requests) {
    auto geometry = h3::resolve_geometry(r.video, c);
    ASSERT_TRUE(geometry.ok()) << geometry.status().to_string();
    auto layout = h3::build_t2va_layout(r.text_rows, *geometry, c);
    ASSERT_TRUE(layout.ok()) << layout.status().to_string();
    max_rows = std::max(max_rows, layout->num_rows);
  }
  auto model = h3::CudaH3Transformer::create(c, h3::synthetic_weight_filler(12, nullptr), max_rows);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (size_t i = 0; i < std::size(requests); ++i) {
    const Tensor text = h3::seeded_normal({requests[i].text_rows, c.text_dim}, 3 + i, h3::kSyntheticTextStream);
    h3::GenerateOptions options;
    options.video = requests[i].video;
    options.steps = 3;  // two forwards
    options.seed = 5;
    test::TrajectoryChecksums runs[2];
    for (bool graphs : {true, false}) {
      (*model)->set_cuda_graphs(graphs);
      runs[graphs ? 0 : 1] = test::trajectory_checksums(**model, text, options);
    }
    test::expect_same_trajectory(runs[0], runs[1], "request " + std::to_string(i) + ", graph vs direct launches");
  }
}

// The same gate with int8fp8 attention (head dim 128: the wide config), where the fused path also
// runs Q's norm and RoPE inside its quantization (cuda::norm_rope_quantize_q_int8fp8) and the
// unfused path normalises Q in bf16 and quantizes it in a separate pass.
TEST(GpuH3FusionsInt8Fp8, BlockOutputAndTwoStepTrajectoryAreBitwiseEqualToTheUnfusedPath) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  h3::CudaModelOptions model_options;
  model_options.int8fp8_attention = true;
  const std::unique_ptr<h3::CudaH3Transformer> model =
      expect_block_stack_gate(wide_config(), 13, model_options, h3::AttentionMode::kInt8Fp8, 23, "int8fp8 block stack");
  ASSERT_NE(model, nullptr);

  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;  // two forwards
  options.seed = 5;
  options.attention.mode = h3::AttentionMode::kInt8Fp8;
  const Tensor text = gate_text(wide_config());
  test::TrajectoryChecksums runs[2];
  for (bool fused : {true, false}) {
    model->set_fused_norms(fused);
    model->set_cuda_graphs(fused);
    runs[fused ? 0 : 1] = test::trajectory_checksums(*model, text, options);
  }
  test::expect_same_trajectory(runs[0], runs[1], "int8fp8, fused + graph vs unfused");
}

INSTANTIATE_TEST_SUITE_P(Widths, GpuH3Fusions, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("small") : std::string("wide2048");
                         });

}  // namespace
}  // namespace vortex
