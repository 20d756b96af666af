// The CUDA model's device-memory plan (models/h3/device_memory_plan.h) at the canonical request,
// against what the H200 measured with the same plan (bench/results/h200/2026-11-30-b0fed2f and
// 2026-11-30-c1ef48a: the arenas' used bytes). An arena's size is an upper bound of what the model
// allocates from it (every allocation padded to 256 bytes, plus 1 MB of slack), so each planned
// size must lie at or above its measurement and within a few MB of it; and the activations must
// stay inside the budget of 6 GB beyond the weights.
#include <gtest/gtest.h>

#include "models/h3/config.h"
#include "models/h3/device_memory_plan.h"
#include "models/h3/layout.h"

namespace vortex {
namespace {

constexpr size_t kMB = size_t{1} << 20;

int64_t canonical_rows(const h3::H3Config& c) {
  auto layout = h3::canonical_t2va_layout(c);
  EXPECT_TRUE(layout.ok());
  return layout->num_rows;
}

void expect_covers(size_t planned, size_t measured, size_t slack, const char* what) {
  EXPECT_GE(planned, measured) << what << ": the plan is smaller than what the device measured";
  EXPECT_LE(planned, measured + slack) << what << ": the plan is " << (planned - measured) << " bytes above it";
}

TEST(DeviceMemoryPlan, WeightsAtTheReleasedSize) {
  const h3::H3Config c = *h3::config_preset("h3");
  // Measured weight arenas (used bytes) on the H200.
  expect_covers(h3::device_weight_bytes(c, h3::LinearRecipe::kBf16, true), 66280430208, kMB, "bf16, AdaLN resident");
  expect_covers(h3::device_weight_bytes(c, h3::LinearRecipe::kBf16, false), 40259515008, kMB, "bf16, AdaLN per request");
  // AdaLN resident under fp8: measured with one scale per output channel for every linear, plus
  // what the out projection's block scales add exactly: [56, 5376] instead of [5376] F32 per block
  // (both multiples of the 256-byte allocation unit), 50 × 5376 × 55 × 4 bytes. Per request: measured
  // with the block scales (2026-11-30-a85dbeb, the sum above to the byte).
  constexpr size_t kOutBlockScales = size_t{50} * 5376 * 55 * 4;
  expect_covers(h3::device_weight_bytes(c, h3::LinearRecipe::kFp8, true), 47025031808 + kOutBlockScales, kMB,
                "fp8, AdaLN resident");
  expect_covers(h3::device_weight_bytes(c, h3::LinearRecipe::kFp8, false), 21063252608, kMB, "fp8, AdaLN per request");
}

TEST(DeviceMemoryPlan, ActivationsOfTheCanonicalRequest) {
  const h3::H3Config c = *h3::config_preset("h3");
  const int64_t rows = canonical_rows(c);
  ASSERT_EQ(rows, 37810);
  const h3::ActivationPlan bf16_step = h3::plan_activations(c, rows, h3::LinearRecipe::kBf16, false, false);
  const h3::ActivationPlan bf16_request = h3::plan_activations(c, rows, h3::LinearRecipe::kBf16, false, true);
  const h3::ActivationPlan fp8_request = h3::plan_activations(c, rows, h3::LinearRecipe::kFp8, false, true);
  // Measured activation-arena peaks (the GEMM workspaces are allocated from it too).
  expect_covers(bf16_step.total, 4608821248, 2 * kMB, "bf16, AdaLN per step");
  expect_covers(bf16_request.total, 4647528448, 2 * kMB, "bf16, AdaLN per request");
  expect_covers(fp8_request.total, 4714854912, 2 * kMB, "fp8, AdaLN per request");  // a85dbeb
  // Every sharing decision holds at the released shapes.
  for (const h3::ActivationPlan* p : {&bf16_step, &bf16_request, &fp8_request}) {
    EXPECT_TRUE(p->embeds_alias);
    EXPECT_EQ(p->embed_rows, rows);  // one chunk: the projections' program of every earlier run
    EXPECT_TRUE(p->codes_alias);
  }
  // [qkv | attn] is exactly FC1's width: the shared region is no larger than either.
  EXPECT_EQ(bf16_step.shared_bytes, bf16_step.attention_bytes);
  // The budget: weights + at most 6 GB, of which the CUDA context and cuBLASLt take about
  // 0.6 GB (measured: 5.44 GB in use beyond the weights for bf16, 5.50 GB for fp8).
  EXPECT_LE(fp8_request.total, size_t{5000} * kMB);
  // q/k/v kept apart for diagnostics costs the FC1 output's size on top.
  const h3::ActivationPlan kept = h3::plan_activations(c, rows, h3::LinearRecipe::kBf16, true, false);
  EXPECT_EQ(kept.total - bf16_step.total, static_cast<size_t>(rows * 2 * c.ffn_dim * 2) + 256);
}

// A sequence-parallel rank of the canonical request: the blocks' working buffers hold its share of
// the rows (18,944 of 37,810 on two GPUs, 9,472 on four); the residual stream, RoPE tables, inputs
// and outputs stay whole. The fp32 embeddings stay in FC1's memory: all rows on two GPUs, on four
// the 25,258 rows that fit (the projections then run in two chunks).
TEST(DeviceMemoryPlan, ASequenceParallelRankPlansItsShareOfTheRows) {
  const h3::H3Config c = *h3::config_preset("h3");
  const int64_t rows = canonical_rows(c), C = c.hidden_size, F = c.ffn_dim, inner = c.inner_dim();
  const h3::ActivationPlan one = h3::plan_activations(c, rows, h3::LinearRecipe::kFp8, false, true);
  EXPECT_EQ(h3::plan_activations(c, rows, h3::LinearRecipe::kFp8, false, true, rows).total, one.total);
  const auto block_bytes = [&](int64_t n) {  // h, branch, the [qkv | attn] / FC1 region, SwiGLU (bf16)
    return static_cast<size_t>(n * (2 * C + std::max(4 * inner, 2 * F) + F)) * 2;
  };
  int64_t previous_share = rows;
  for (const int64_t share : {int64_t{18944}, int64_t{9472}}) {
    SCOPED_TRACE(share);
    const h3::ActivationPlan rank = h3::plan_activations(c, rows, h3::LinearRecipe::kFp8, false, true, share);
    EXPECT_TRUE(rank.embeds_alias);
    EXPECT_EQ(rank.embed_rows, std::min(rows, share * F / C));
    EXPECT_TRUE(rank.codes_alias);
    // The blocks' buffers shrink with the share (the fp8 codes' scales too, a few hundred KB).
    const size_t saved = block_bytes(rows) - block_bytes(share);
    EXPECT_GE(one.total - rank.total, saved);
    EXPECT_LE(one.total - rank.total, saved + 2 * kMB);
    EXPECT_LT(rank.total, h3::plan_activations(c, rows, h3::LinearRecipe::kFp8, false, true, previous_share).total);
    previous_share = share;
  }
}

TEST(DeviceMemoryPlan, SmallModelsGetTheirOwnBuffersWhereTheyDoNotFit) {
  h3::H3Config c = *h3::config_preset("h3");
  c.num_layers = 1;
  c.hidden_size = 256;
  c.num_attention_heads = 2;
  c.ffn_dim = 64;
  const h3::ActivationPlan p = h3::plan_activations(c, 100, h3::LinearRecipe::kBf16, false, false);
  EXPECT_FALSE(p.embeds_alias);  // an fp32 embedding of 256 does not fit FC1's 2 x 64 bf16
  EXPECT_EQ(p.embed_rows, 100);  // in one chunk on one GPU
  EXPECT_FALSE(p.codes_alias);   // widest input 256 > 2 x 64
  // A rank's share of them: FC1's memory holds a quarter of its rows' embeddings, in chunks.
  const h3::ActivationPlan rank = h3::plan_activations(c, 100, h3::LinearRecipe::kBf16, false, false, 50);
  EXPECT_TRUE(rank.embeds_alias);
  EXPECT_EQ(rank.embed_rows, 12);
}

TEST(DeviceMemoryPlan, WeightPredicates) {
  EXPECT_TRUE(h3::is_block_linear_weight("transformer_blocks.3.attn.to_q.weight"));
  EXPECT_TRUE(h3::is_block_linear_weight("transformer_blocks.49.ff.net.2.weight"));
  EXPECT_FALSE(h3::is_block_linear_weight("transformer_blocks.3.adaln_proj.linear.weight"));
  EXPECT_FALSE(h3::is_block_linear_weight("token_refiner.refiner_blocks.0.attn.to_q.weight"));
  EXPECT_TRUE(h3::is_block_adaln_weight("transformer_blocks.0.adaln_proj.linear.bias"));
  EXPECT_FALSE(h3::is_block_adaln_weight("norm_out.linear.weight"));
}

}  // namespace
}  // namespace vortex
