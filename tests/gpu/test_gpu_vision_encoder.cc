// The Qwen3-VL vision tower on the GPU (text/cuda_qwen3_vision_encoder.h) and its elementwise ops
// (cuda/vision_ops.h, cuda::layer_norm on bf16 rows) against the CPU program.
//
// Bounds:
//   rope_widened: bitwise (the CPU's widened fp32 RoPE, explicitly rounded, then one bf16 rounding).
//   gelu: at most 1e-3 of the elements differ, by at most 1e-12 absolute. CUDA's double tanh / erf
//     against core/portable_math.h's: 1 ulp next to a bf16 tie, and in erf's far negative tail,
//     where 1 + erf(x/√2) cancels, CUDA's erf gives exactly −1 where the host's is an ulp above
//     (measured on the H200: 36 of 307,200 differ, max-abs 2.8e-14, e.g. −0 against −2.8e-15).
//   layer_norm (bf16 x): as test_gpu_vae_ops.cc's bf16 case, within 1 ulp on at most 1e-3.
//   The tower (tests/golden/qwen3_vl_small): 1e-2 rel-L2 against transformers on every output, as
//     the CPU test's; against the CPU program kTowerRelL2 (GEMM k order and the online softmax
//     differ, as the reference's own CUDA and CPU runs do: 4.8e-3 to 8.7e-3).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu/elementwise.h"
#include "cpu/norm.h"
#include "cuda/vae_layer_norm.h"
#include "cuda/vision_ops.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "text/bpe_tokenizer.h"
#include "text/cuda_qwen3_vision_encoder.h"
#include "text/qwen3_vision_encoder.h"
#include "text/synthetic_qwen3.h"
#include "text/text_conditioner.h"

namespace vortex {
namespace {

using test::compare;
using test::head_view;
using test::must;
using test::random_tensor;

constexpr double kTowerRelL2 = 1e-2;

class GpuVisionOps : public test::GpuTest {};

void expect_gelu_close(const test::Comparison& c, const std::string& what) {
  EXPECT_LE(static_cast<double>(c.differing), 1e-3 * static_cast<double>(c.count)) << what << ": " << c.summary();
  EXPECT_LE(c.max_abs, 1e-12) << what << ": " << c.summary();
  EXPECT_EQ(c.nonfinite, 0) << what;
}

TEST_F(GpuVisionOps, GeluMatchesTheCpu) {
  for (const auto approximation : {cpu::GeluApproximation::kTanh, cpu::GeluApproximation::kErf}) {
    for (const auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {37, 129}, {300, 1024}}) {
      ArenaScope scope(arena_);
      const std::string what = std::string(approximation == cpu::GeluApproximation::kTanh ? "tanh" : "erf") +
                               " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
      // x as columns [2, 2 + cols) of a wider buffer: a strided view.
      const Tensor wide = random_tensor({rows, cols + 3}, DType::kBF16, 31 + rows, 2.0f);
      const Tensor x = must(wide.slice(1, 2, 2 + cols)).contiguous();
      Tensor want = Tensor::empty({rows, cols}, DType::kBF16);
      VORTEX_EXPECT_OK(cpu::gelu(x.view(), want.view(), approximation));
      const Tensor wide_dev = to_device(wide);
      const Tensor y = must(arena_.alloc({rows, cols}, DType::kBF16));
      VORTEX_EXPECT_OK(cuda::gelu(test::columns(wide_dev, 2, cols), y.view(), approximation, stream_));
      expect_gelu_close(compare(to_host(y), want), what);
      // In place.
      const Tensor inplace = to_device(x);
      VORTEX_EXPECT_OK(cuda::gelu(inplace.view(), inplace.view(), approximation, stream_));
      expect_gelu_close(compare(to_host(inplace), want), what + " in place");
    }
  }
  const Tensor f32 = to_device(random_tensor({4, 8}, DType::kF32, 1));
  EXPECT_EQ(cuda::gelu(f32.view(), f32.view(), cpu::GeluApproximation::kTanh, stream_).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(GpuVisionOps, RopeWidenedIsTheCpusBits) {
  struct Case {
    int64_t n, heads, dim;
  };
  for (const Case cs : {Case{1, 1, 2}, Case{29, 3, 72}, Case{130, 4, 16}, Case{513, 16, 72}}) {
    ArenaScope scope(arena_);
    const std::string what =
        "N " + std::to_string(cs.n) + " H " + std::to_string(cs.heads) + " D " + std::to_string(cs.dim);
    const int64_t inner = cs.heads * cs.dim;
    // q inside a fused [N, 3·H·D + 8] buffer.
    const Tensor qkv = random_tensor({cs.n, 3 * inner + 8}, DType::kBF16, 41 + cs.n, 1.5f);
    const Tensor cos = random_tensor({cs.n, cs.dim}, DType::kF32, 42);
    const Tensor sin = random_tensor({cs.n, cs.dim}, DType::kF32, 43);
    // The CPU program's way: widen, rotate in fp32, round back.
    Tensor widened = must(must(qkv.slice(1, 0, inner)).contiguous().to(DType::kF32));
    VORTEX_EXPECT_OK(cpu::apply_rope(head_view(widened, 0, cs.heads, cs.dim), cos, sin));
    const Tensor want = must(widened.to(DType::kBF16));
    const Tensor qkv_dev = to_device(qkv), cos_dev = to_device(cos), sin_dev = to_device(sin);
    VORTEX_EXPECT_OK(
        cuda::rope_widened(head_view(qkv_dev, 0, cs.heads, cs.dim), cos_dev.view(), sin_dev.view(), stream_));
    const Tensor got = must(to_host(qkv_dev).slice(1, 0, inner)).contiguous();
    test::expect_bitwise(compare(got, want), what);
    // The other columns untouched.
    const Tensor rest = must(to_host(qkv_dev).slice(1, inner, 3 * inner + 8)).contiguous();
    test::expect_bitwise(compare(rest, must(qkv.slice(1, inner, 3 * inner + 8)).contiguous()), what + " rest");
  }
  const Tensor x = to_device(random_tensor({4, 2, 3}, DType::kBF16, 1));
  const Tensor t = to_device(random_tensor({4, 3}, DType::kF32, 2));
  EXPECT_EQ(cuda::rope_widened(x.view(), t.view(), t.view(), stream_).code(), StatusCode::kInvalidArgument);
}

TEST_F(GpuVisionOps, LayerNormTakesBf16Rows) {
  for (const auto [rows, channels] : {std::pair<int64_t, int64_t>{1, 1}, {37, 64}, {300, 1152}, {5, 4608}}) {
    ArenaScope scope(arena_);
    const std::string what = "layer_norm bf16 [" + std::to_string(rows) + ", " + std::to_string(channels) + "]";
    const Tensor wide = random_tensor({rows, channels + 5}, DType::kBF16, 51 + rows, 1.5f, 0.3f);
    const Tensor x = must(wide.slice(1, 3, 3 + channels)).contiguous();
    const Tensor w = random_tensor({channels}, DType::kF32, 52, 0.25f, 1.0f);
    const Tensor b = random_tensor({channels}, DType::kF32, 53, 0.5f);
    Tensor want = Tensor::empty({rows, channels}, DType::kBF16);
    VORTEX_EXPECT_OK(cpu::layer_norm(x.view(), w.view(), b.view(), 1e-6f, want.view()));
    const Tensor wide_dev = to_device(wide), w_dev = to_device(w), b_dev = to_device(b);
    const Tensor y = must(arena_.alloc({rows, channels}, DType::kBF16));
    VORTEX_EXPECT_OK(
        cuda::layer_norm(test::columns(wide_dev, 3, channels), w_dev.view(), b_dev.view(), 1e-6f, y.view(), stream_));
    test::expect_within_1ulp(compare(to_host(y), want), 1e-3, what);
  }
}

// Both golden images (patch grids 4 × 6 and 6 × 10), every output of the tower.
TEST(GpuVisionEncoder, GoldenMatchesTransformersAndTheCpu) {
  VORTEX_REQUIRE_GPU();
  const std::string dir = test::golden_path("qwen3_vl_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const text::Qwen3VisionEncoder host = must(text::Qwen3VisionEncoder::load(dir, dir));
  auto device = must(text::CudaQwen3VisionEncoder::create(host));
  EXPECT_GT(device->weight_bytes(), 0u);
  std::vector<Tensor> merged;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "vision." + std::to_string(i) + ".";
    const Tensor image = must(io.get("image." + std::to_string(i)));
    const text::VisionFeatures got = must(device->encode_image(image));
    const text::VisionFeatures cpu = must(host.encode_image(image));
    ASSERT_EQ(got.deepstack.size(), 2u);
    EXPECT_EQ(got.grid.tokens(), cpu.grid.tokens());
    const std::vector<std::pair<std::string, std::pair<const Tensor*, const Tensor*>>> outputs = {
        {"merged", {&got.merged, &cpu.merged}},
        {"deepstack.0", {&got.deepstack[0], &cpu.deepstack[0]}},
        {"deepstack.1", {&got.deepstack[1], &cpu.deepstack[1]}}};
    for (const auto& [name, pair] : outputs) {
      const Tensor ref = must(io.get(p + name));
      ASSERT_EQ(pair.first->shape(), ref.shape()) << p << name;
      const double vs_reference = test::rel_l2(*pair.first, ref);
      const double vs_cpu = test::rel_l2(*pair.first, *pair.second);
      EXPECT_LE(vs_reference, 1e-2) << p << name;
      EXPECT_LE(vs_cpu, kTowerRelL2) << p << name;
      std::printf("%s%s: rel-L2 %.3e against transformers, %.3e against the CPU program\n", p.c_str(), name.c_str(),
                  vs_reference, vs_cpu);
    }
    // Deterministic run to run.
    const text::VisionFeatures again = must(device->encode_image(image));
    test::expect_bitwise(compare(again.merged, got.merged), p + "merged again");
    merged.push_back(got.merged);
  }
  // Back to the first image's grid: its tables are rebuilt, the same bits come out.
  const text::VisionFeatures first_again = must(device->encode_image(must(io.get("image.0"))));
  test::expect_bitwise(compare(first_again.merged, merged[0]), "image 0 after image 1");
  // The host's checks apply.
  EXPECT_FALSE(device->encode(Tensor::zeros({10, host.config().patch_values()}, DType::kF32),
                              text::VisionGrid{4, 6, 2})
                   .ok());
}

// A keyframe presentation through the TextConditioner on cuda (both towers on the device) against
// the same conditioner on the CPU.
TEST(GpuVisionEncoder, ConditionerOnCudaEncodesKeyframesAsTheCpu) {
  VORTEX_REQUIRE_GPU();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "qwen3_vl_conditioner";
  text::SyntheticQwen3Shape shape;
  shape.vocab = 151936;  // every id of the trimmed tokenizer
  shape.hidden = 64;
  shape.heads = 4;
  shape.head_dim = 16;
  shape.intermediate = 96;
  shape.vision_depth = 2;
  must(text::write_synthetic_qwen3(dir.string(), shape));
  const std::string tokenizer = test::golden_path("qwen_tokenizer_trimmed.json");
  // The GPU machine's image has no ICU: scripts/gpu-check builds the tokenizer there when
  // .icu.tar.gz (scripts/pack-icu) is carried in, and this test skips otherwise.
  if (!text::BpeTokenizer::load(tokenizer).ok()) GTEST_SKIP() << "this build has no tokenizer (no ICU)";
  auto cpu = must(text::TextConditioner::load({dir.string(), tokenizer, 2, "cpu", ""}));
  auto gpu = must(text::TextConditioner::load({dir.string(), tokenizer, 2, "cuda", ""}));
  Tensor rgb = Tensor::empty({64, 96, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + i / 7) % 251);
  const text::Presentation p = must(cpu->keyframe_presentation("A cat.", {{64, 96}, {64, 96}}));
  const Tensor want = must(cpu->encode_presentation(p, {rgb, rgb}));
  const Tensor got = must(gpu->encode_presentation(p, {rgb, rgb}));
  const double err = test::rel_l2(got, want);
  EXPECT_LE(err, kTowerRelL2);
  EXPECT_GT(gpu->device_weight_bytes(), 0u);
  std::printf("keyframe presentation through the conditioner on cuda: rel-L2 %.3e against the CPU\n", err);
  std::filesystem::remove_all(dir);
}

// ref2va's video blocks (tests/golden/qwen3_vl_small/video.safetensors: pairs of distinct frames
// in the temporal patch) through the CUDA tower against the CPU program.
TEST(GpuVisionEncoder, VideoBlocksOnCudaAreTheCpus) {
  VORTEX_REQUIRE_GPU();
  const std::string dir = test::golden_path("qwen3_vl_small");
  const text::Qwen3VisionEncoder host = must(text::Qwen3VisionEncoder::load(dir, dir));
  auto device = must(text::CudaQwen3VisionEncoder::create(host));
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/video.safetensors"));
  const Tensor frames = must(io.get("video.0"));
  const text::VisionGrid grid = must(host.video_grid_for(frames.size(0), frames.size(1), frames.size(2)));
  for (int64_t f = 0; f + 1 < frames.size(0); f += 2) {
    const Tensor patches = must(host.video_block_patches({must(frames.select(0, f)), must(frames.select(0, f + 1))}, grid));
    const text::VisionFeatures want = must(host.encode(patches, grid));
    const text::VisionFeatures got = must(device->encode(patches, grid));
    const double err = test::rel_l2(got.merged, want.merged);
    EXPECT_LE(err, kTowerRelL2) << "block " << f / 2;
    for (size_t j = 0; j < want.deepstack.size(); ++j) {
      EXPECT_LE(test::rel_l2(got.deepstack[j], want.deepstack[j]), kTowerRelL2) << "block " << f / 2 << " deepstack " << j;
    }
    std::printf("video block %lld on cuda: merged rel-L2 %.3e against the CPU\n", static_cast<long long>(f / 2), err);
  }
}

// The released tower's widths on the canonical 768 x 1344 canvas (4032 patches, 1008 tokens):
// the encode's time on the GPU, median of 10, and one block's on the CPU for scale.
TEST(GpuVisionEncoder, ReleasedWidthsOnTheCanonicalCanvasTime) {
  VORTEX_REQUIRE_GPU();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "qwen3_vision_released";
  text::SyntheticQwen3Shape shape;
  shape.hidden = 5120;  // the merger's output: the text encoder's width (its one layer stays narrow)
  shape.vocab = 1000;
  shape.layers = 1;
  text::use_released_vision_tower(shape);
  must(text::write_synthetic_qwen3(dir.string(), shape));
  const text::Qwen3VisionEncoder host = must(text::Qwen3VisionEncoder::load(dir.string(), dir.string()));
  auto device = must(text::CudaQwen3VisionEncoder::create(host));
  Tensor rgb = Tensor::empty({768, 1344, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + i / 5) % 251);
  text::VisionGrid grid;
  const Tensor patches = must(host.image_patches(rgb, &grid));
  ASSERT_EQ(grid.patches(), 4032);
  const auto cold_start = std::chrono::steady_clock::now();
  const text::VisionFeatures first = must(device->encode(patches, grid));
  const double cold_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cold_start).count();
  EXPECT_EQ(first.merged.shape(), Shape({1008, 5120}));
  ASSERT_EQ(first.deepstack.size(), 3u);
  std::vector<double> ms;
  for (int rep = 0; rep < 10; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    const text::VisionFeatures f = must(device->encode(patches, grid));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (rep == 0) test::expect_bitwise(compare(f.merged, first.merged), "released widths, run to run");
  }
  std::sort(ms.begin(), ms.end());
  // The CPU program's embed and first block, for scale.
  const auto cpu_start = std::chrono::steady_clock::now();
  Tensor x = must(host.embed(patches, grid));
  must(host.run_blocks(x, grid, 0, 1, nullptr));
  const double cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start).count();
  std::printf("vision tower, released widths, 768 x 1344 keyframe (4032 patches): GPU encode median %.1f ms (min %.1f) "
              "over 10 with this grid's tables resident, the first encode (tables built) %.1f ms, pixels' upload "
              "included, %.2f GB of weights; CPU embed + 1 of 27 blocks %.0f ms\n",
              ms[5], ms[0], cold_ms, static_cast<double>(device->weight_bytes()) / 1e9, cpu_ms);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vortex
