// The Qwen3-VL text encoder on the GPU (text/cuda_qwen3_text_encoder.h) and its two new ops,
// each against the CPU program:
//   - cuda::causal_attention against cpu::causal_attention on fresh random q / k / v that are the
//     column slices of one fused buffer, odd lengths, grouped and ungrouped heads, head dims 48,
//     64 and 128, the output a strided view whose padding must survive; the tensor-core path (v0
//     with the causal mask: D 64 / 128 on aligned views) and the fallback on every case, and a
//     fused buffer whose rows are not 16-byte aligned through the dispatch. Bound as the bidirectional
//     fallback's (test_gpu_attention.cu): rel-L2 <= 1e-2, max-abs <= 2e-2 · max|v|; query 0 sees
//     one key, so its output is v[0] bit for bit.
//   - cuda::rms_norm with kBeforeWeight against cpu::rms_norm on [N, C] and in place on [N, H, D]
//     heads of a fused buffer: no element more than 2 bf16 ulps away and at most 1e-3 of them off
//     at all (the two roundings move only where the sum of squares, summed in another order, puts
//     a value next to a tie; a flip of the first rounding can move the second by up to 2 ulps).
//   - the encoder against transformers' hidden states (tests/golden/qwen3_text_small, the CPU
//     test's goldens; bound 1e-2 rel-L2 per layer as there) and against the CPU program, and at
//     the released encoder's widths (hidden 5120, 64 / 8 heads of 128, FFN 25600; two layers of
//     seeded weights) against the CPU program on a 100-token prompt, with the time per layer.
//   - a keyframe presentation (tests/golden/qwen3_vl_small) against transformers and the CPU.
//   - the CLI: `encode-text --device cuda` against `--device cpu`, and `generate --device cuda
//     --prompt` giving the bits of `generate --text` on the CUDA encoder's states (a build with the
//     tokenizer only; the GPU machine's own image has no ICU, a build carried there has).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "cpu/attention.h"
#include "cpu/norm.h"
#include "cuda/attention.h"
#include "cuda/attention_fallback.h"
#include "cuda/elementwise.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "text/bpe_tokenizer.h"
#include "text/cuda_qwen3_text_encoder.h"
#include "text/qwen3_text_encoder.h"
#include "text/qwen3_vision_encoder.h"
#include "text/synthetic_qwen3.h"

namespace vortex {
namespace {

using test::must;

constexpr double kAttentionRelL2 = 1e-2, kAttentionMaxAbsOverMaxV = 2e-2;
constexpr double kEncoderRelL2 = 1e-2;
constexpr unsigned char kSentinel = 0x5A;

class GpuTextEncoderOps : public test::GpuTest {};

TEST_F(GpuTextEncoderOps, CausalAttentionMatchesCpuOnFusedQkvSlices) {
  struct Case {
    int64_t n, heads, kv_heads, d;
  };
  using Op = Status (*)(const TensorView&, const TensorView&, const TensorView&, const TensorView&, float,
                        cudaStream_t);
  struct Path {
    const char* name;
    Op op;
    int64_t pad;  // columns after q | k | v in the fused rows: 8 keeps them 16-byte aligned
  };
  uint64_t seed = 7100;
  for (const Case c : {Case{1, 4, 2, 48}, Case{45, 4, 2, 48}, Case{130, 4, 1, 64}, Case{129, 3, 3, 128},
                       Case{64, 2, 1, 128}, Case{257, 64, 8, 128}, Case{700, 16, 2, 128}, Case{383, 6, 2, 64},
                       Case{200, 4, 2, 72}})
  for (const Path path : {Path{"dispatch", &cuda::causal_attention, 8}, Path{"fallback", &cuda::causal_attention_fallback, 8},
                          Path{"dispatch, unaligned rows", &cuda::causal_attention, 4}}) {
    ArenaScope scope(arena_);
    const std::string label = std::string(path.name) + " N=" + std::to_string(c.n) + " H=" + std::to_string(c.heads) +
                              " Hkv=" + std::to_string(c.kv_heads) + " D=" + std::to_string(c.d);
    const int64_t q_width = c.heads * c.d, kv_width = c.kv_heads * c.d, pad = path.pad;
    const Tensor fused = test::random_tensor({c.n, q_width + 2 * kv_width + pad}, DType::kBF16, ++seed);
    const TensorView q = test::head_view(fused, 0, c.heads, c.d), k = test::head_view(fused, q_width, c.kv_heads, c.d),
                     v = test::head_view(fused, q_width + kv_width, c.kv_heads, c.d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    Tensor ref = Tensor::empty({c.n, c.heads, c.d}, DType::kF32);
    must(cpu::causal_attention(q, k, v, ref.view(), scale));

    const Tensor fd = to_device(fused);
    // The output: [N, H, D] inside [N, H, D + 16] rows, 8 columns in.
    const Tensor out_full = must(arena_.alloc({c.n, c.heads, c.d + 16}, DType::kBF16));
    ASSERT_EQ(cudaMemsetAsync(out_full.data(), kSentinel, out_full.nbytes(), stream_), cudaSuccess);
    const Tensor out = must(out_full.slice(2, 8, 8 + c.d));
    VORTEX_EXPECT_OK(path.op(test::head_view(fd, 0, c.heads, c.d), test::head_view(fd, q_width, c.kv_heads, c.d),
                             test::head_view(fd, q_width + kv_width, c.kv_heads, c.d), out.view(), scale, stream_));
    const Tensor host_full = to_host(out_full);
    const auto* bytes = static_cast<const unsigned char*>(host_full.data());
    int64_t clobbered = 0;
    for (int64_t row = 0; row < c.n * c.heads; ++row) {
      for (int64_t ch = 0; ch < c.d + 16; ++ch) {
        if (ch >= 8 && ch < 8 + c.d) continue;
        for (int b = 0; b < 2; ++b) clobbered += bytes[(row * (c.d + 16) + ch) * 2 + b] != kSentinel;
      }
    }
    EXPECT_EQ(clobbered, 0) << label << ": bytes written outside out";
    const Tensor got = must(must(host_full.slice(2, 8, 8 + c.d)).contiguous().to(DType::kF32));
    const test::Comparison cmp = test::compare(got, ref);
    EXPECT_EQ(cmp.nonfinite, 0) << label << ": " << cmp.summary();
    EXPECT_LE(cmp.rel_l2, kAttentionRelL2) << label << ": " << cmp.summary();
    EXPECT_LE(cmp.max_abs, kAttentionMaxAbsOverMaxV * test::max_abs_of(v)) << label << ": " << cmp.summary();
    // Query 0 sees key 0 alone: its weight is exactly 1 and its output v[0] (of its k/v head).
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t ch = 0; ch < c.d; ++ch) {
        const float want = test::view_element(v, (h / (c.heads / c.kv_heads)) * c.d + ch);
        ASSERT_EQ(got.data_as<float>()[h * c.d + ch], want) << label << ": query 0, head " << h << ", channel " << ch;
      }
    }
    std::printf("causal attention %-50s rel-L2 %.3e  max-abs %.3e\n", label.c_str(), cmp.rel_l2, cmp.max_abs);
  }
}

TEST_F(GpuTextEncoderOps, CausalAttentionRejectsBadOperands) {
  ArenaScope scope(arena_);
  const Tensor q = must(arena_.alloc({5, 6, 32}, DType::kBF16)), kv = must(arena_.alloc({5, 4, 32}, DType::kBF16));
  const Tensor short_kv = must(arena_.alloc({4, 2, 32}, DType::kBF16)), f32 = must(arena_.alloc({5, 6, 32}, DType::kF32));
  const Tensor out = must(arena_.alloc({5, 6, 32}, DType::kBF16));
  const auto expect_refused = [](const Status& s, const std::string& needle) {
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_refused(cuda::causal_attention(q.view(), kv.view(), kv.view(), out.view(), 0.1f, stream_),
                 "H must be a positive multiple of Hkv");
  expect_refused(cuda::causal_attention(q.view(), short_kv.view(), short_kv.view(), out.view(), 0.1f, stream_),
                 "shapes must be");
  expect_refused(cuda::causal_attention(f32.view(), kv.view(), kv.view(), out.view(), 0.1f, stream_), "BF16");
  expect_refused(cuda::causal_attention(q.view(), q.view(), q.view(), out.view(), -1.0f, stream_), "scale");
}

TEST_F(GpuTextEncoderOps, RmsNormRoundedBeforeWeightMatchesCpu) {
  uint64_t seed = 7200;
  const auto expect_close = [](const test::Comparison& cmp, const std::string& what) {
    EXPECT_EQ(cmp.nonfinite, 0) << what << ": " << cmp.summary();
    EXPECT_LE(cmp.max_ulp, 2) << what << ": " << cmp.summary();
    EXPECT_LE(static_cast<double>(cmp.differing), 1.0 + 1e-3 * static_cast<double>(cmp.count)) << what << ": "
                                                                                              << cmp.summary();
    std::printf("%-40s %s\n", what.c_str(), cmp.summary().c_str());
  };
  for (const int64_t c : {128, 5120}) {
    for (const int64_t n : {1, 45, 300}) {
      ArenaScope scope(arena_);
      const std::string what = "rms_norm before weight N=" + std::to_string(n) + " C=" + std::to_string(c);
      Tensor x = test::random_tensor({n, c}, DType::kBF16, ++seed, 2.0f, 0.3f);
      Tensor w = test::random_tensor({c}, DType::kBF16, ++seed, 0.2f, 1.0f);
      Tensor y = Tensor::zeros({n, c}, DType::kBF16);
      const Tensor xd = to_device(x), wd = to_device(w), yd = to_device(y);
      const TensorView wdv = wd.view(), wv = w.view();
      VORTEX_EXPECT_OK(cuda::rms_norm(xd.view(), &wdv, 1e-6f, yd.view(), stream_, cpu::RmsNormRounding::kBeforeWeight));
      must(cpu::rms_norm(x.view(), &wv, 1e-6f, y.view(), cpu::RmsNormRounding::kBeforeWeight));
      expect_close(test::compare(to_host(yd), y), what);
    }
  }
  // In place on the q heads of a fused [N, (64 + 2·8)·128] buffer, as the encoder runs it.
  for (const int64_t n : {7, 100}) {
    ArenaScope scope(arena_);
    const std::string what = "rms_norm before weight heads N=" + std::to_string(n);
    Tensor fused = test::random_tensor({n, 80 * 128}, DType::kBF16, ++seed, 1.0f, 0.1f);
    Tensor w = test::random_tensor({128}, DType::kBF16, ++seed, 0.2f, 1.0f);
    const Tensor fd = to_device(fused), wd = to_device(w);
    const TensorView wdv = wd.view(), wv = w.view();
    VORTEX_EXPECT_OK(cuda::rms_norm(test::head_view(fd, 0, 64, 128), &wdv, 1e-6f, test::head_view(fd, 0, 64, 128), stream_,
                                    cpu::RmsNormRounding::kBeforeWeight));
    must(cpu::rms_norm(test::head_view(fused, 0, 64, 128), &wv, 1e-6f, test::head_view(fused, 0, 64, 128),
                       cpu::RmsNormRounding::kBeforeWeight));
    const Tensor got = to_host(fd);
    expect_close(test::compare(got, fused), what);
  }
}

TEST(GpuTextEncoder, EveryLayerMatchesTransformersAndTheCpu) {
  VORTEX_REQUIRE_GPU();
  const std::string dir = test::golden_path("qwen3_text_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const std::vector<int32_t> ids = test::golden_token_ids(io);
  for (int layer = 1; layer <= 4; ++layer) {
    const text::Qwen3TextEncoder host = must(text::Qwen3TextEncoder::load(dir, layer));
    auto device = must(text::CudaQwen3TextEncoder::create(host));
    const Tensor got = must(device->encode(ids));
    ASSERT_EQ(got.shape(), Shape({static_cast<int64_t>(ids.size()), host.config().hidden}));
    EXPECT_EQ(got.dtype(), DType::kBF16);
    const double vs_reference = test::rel_l2(got, must(io.get("hidden_states." + std::to_string(layer))));
    const double vs_cpu = test::rel_l2(got, must(host.encode(ids)));
    EXPECT_LE(vs_reference, kEncoderRelL2) << "layer " << layer;
    EXPECT_LE(vs_cpu, kEncoderRelL2) << "layer " << layer;
    std::printf("layer %d: rel-L2 %.3e against transformers, %.3e against the CPU program\n", layer, vs_reference,
                vs_cpu);
    // A second encode of another length reuses the device buffers; an empty one gives [0, hidden].
    const Tensor shorter = must(device->encode({ids.begin(), ids.begin() + 9}));
    EXPECT_LE(test::rel_l2(shorter, must(host.encode({ids.begin(), ids.begin() + 9}))), kEncoderRelL2);
    EXPECT_EQ(must(device->encode({})).size(0), 0);
    // An encoder whose RoPE tables were built for the 9 tokens grows them for the whole prompt: the
    // bits of the encoder that built them for it at once.
    auto grown = must(text::CudaQwen3TextEncoder::create(host));
    must(grown->encode({ids.begin(), ids.begin() + 9}));
    test::expect_bitwise(test::compare(must(grown->encode(ids)), got), "layer " + std::to_string(layer) + " after growth");
    const auto bad = device->encode({1, 2, 100000});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("token 2"), std::string::npos) << bad.status().message();
  }
}

// A keyframe presentation (tests/golden/qwen3_vl_small): the CPU vision tower's features in the
// image-pad rows, the multimodal RoPE tables and the DeepStack adds on the device. Bound as the
// CPU test's (test_qwen3_vl_presentation.cc): 1.5e-2 against transformers; against the CPU
// program kEncoderRelL2. A text-only encode after it still gives the text path's bits.
TEST(GpuTextEncoder, KeyframePresentationMatchesTransformersAndTheCpu) {
  VORTEX_REQUIRE_GPU();
  const std::string dir = test::golden_path("qwen3_vl_small");
  const SafetensorsFile io = must(SafetensorsFile::open(dir + "/io.safetensors"));
  const std::vector<int32_t> ids = test::golden_token_ids(io);
  const text::Qwen3VisionEncoder vision = must(text::Qwen3VisionEncoder::load(dir, dir));
  std::vector<text::VisionFeatures> images;
  for (int i = 0; i < 2; ++i) images.push_back(must(vision.encode_image(must(io.get("image." + std::to_string(i))))));
  for (int layer = 1; layer <= 4; ++layer) {
    const text::Qwen3TextEncoder host = must(text::Qwen3TextEncoder::load(dir, layer));
    auto device = must(text::CudaQwen3TextEncoder::create(host));
    const Tensor plain = must(device->encode(ids));
    const Tensor got = must(device->encode(ids, images));
    const double vs_reference = test::rel_l2(got, must(io.get("hidden_states." + std::to_string(layer))));
    const double vs_cpu = test::rel_l2(got, must(host.encode(ids, images)));
    EXPECT_LE(vs_reference, 1.5e-2) << "layer " << layer;
    EXPECT_LE(vs_cpu, kEncoderRelL2) << "layer " << layer;
    std::printf("keyframes, layer %d: rel-L2 %.3e against transformers, %.3e against the CPU program\n", layer,
                vs_reference, vs_cpu);
    test::expect_bitwise(test::compare(must(device->encode(ids)), plain), "text-only after images");
    EXPECT_FALSE(device->encode(ids, {images[1]}).ok());
  }
}

// The released encoder's widths: two layers, a 100-token prompt (the canonical request's text rows).
TEST(GpuTextEncoder, ReleasedWidthsMatchTheCpuAndTime) {
  VORTEX_REQUIRE_GPU();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "qwen3_released_widths";
  text::SyntheticQwen3Shape shape = text::released_qwen3_shape(2);
  shape.vocab = 4096;  // the embedding's size does not enter the layers' work
  must(text::write_synthetic_qwen3(dir.string(), shape));
  const text::Qwen3TextEncoder host = must(text::Qwen3TextEncoder::load(dir.string(), 2));
  auto device = must(text::CudaQwen3TextEncoder::create(host));
  // Every linear of both layers in bf16 (~0.98 GB a layer), the norms, and no more.
  const int64_t C = shape.hidden, q_rows = shape.heads * shape.head_dim, kv_rows = shape.kv_heads * shape.head_dim;
  const size_t linears = static_cast<size_t>(shape.layers * 2 *
                                             ((q_rows + 2 * kv_rows) * C + C * q_rows + 3 * shape.intermediate * C));
  EXPECT_GE(device->weight_bytes(), linears);
  EXPECT_LE(device->weight_bytes(), linears + (size_t{1} << 20));
  std::vector<int32_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % 4096);
  const Tensor got = must(device->encode(ids));
  const double vs_cpu = test::rel_l2(got, must(host.encode(ids)));
  EXPECT_LE(vs_cpu, kEncoderRelL2);
  for (const int64_t n : {100, 512}) {
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) prompt[i] = static_cast<int32_t>((i * 40503) % 4096);
    std::vector<double> ms;
    for (int rep = 0; rep < 10; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      must(device->encode(prompt));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("released widths, %lld tokens: rel-L2 against the CPU %.3e; encode of 2 layers median %.2f ms "
                "(min %.2f) over 10, host gather and copies included\n",
                static_cast<long long>(n), vs_cpu, ms[5], ms[0]);
  }
  std::filesystem::remove_all(dir);
}

TEST(GpuTextEncoderCli, APromptOnCudaIsTheBitsOfItsStates) {
  VORTEX_REQUIRE_GPU();
  const std::string tokenizer = test::golden_path("qwen_tokenizer_trimmed.json");
  if (!text::BpeTokenizer::load(tokenizer).ok()) GTEST_SKIP() << "this build has no tokenizer (no ICU)";
  using test_util::q;
  using test_util::run_cli;
  test_util::TempDir tmp;
  // The mid preset's text_dim (256); every Qwen id inside the vocabulary.
  text::SyntheticQwen3Shape shape;
  shape.vocab = 151936;
  shape.hidden = 256;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 64;
  shape.intermediate = 512;
  const std::string encoder = (tmp.path() / "qwen3").string();
  must(text::write_synthetic_qwen3(encoder, shape));
  const std::string flags = "--text-encoder " + q(encoder) + " --tokenizer " + q(tokenizer) +
                            " --text-encoder-layer 2 --prompt 'A red fox runs through fresh snow at dawn.'";
  for (const char* device : {"cuda", "cpu"}) {
    const auto run = run_cli("encode-text --device " + std::string(device) + " " + flags + " --out " +
                             q(tmp.file(std::string(device) + ".safetensors")));
    ASSERT_EQ(run.code, 0) << run.err;
  }
  const SafetensorsFile on_cuda = must(SafetensorsFile::open(tmp.file("cuda.safetensors")));
  const SafetensorsFile on_cpu = must(SafetensorsFile::open(tmp.file("cpu.safetensors")));
  const double err = test::rel_l2(must(on_cuda.get("prompt_embeds")), must(on_cpu.get("prompt_embeds")));
  EXPECT_LE(err, kEncoderRelL2);
  std::printf("encode-text --device cuda vs cpu: rel-L2 %.3e\n", err);

  const std::string generate = "generate --synthetic mid --device cuda --height 64 --width 64 --frames 22 --steps 3 ";
  const auto from_prompt = run_cli(generate + flags + " --out " + q(tmp.file("a")));
  ASSERT_EQ(from_prompt.code, 0) << from_prompt.err;
  const auto from_states = run_cli(generate + "--text " + q(tmp.file("cuda.safetensors")) + " --out " + q(tmp.file("b")));
  ASSERT_EQ(from_states.code, 0) << from_states.err;
  const auto a = nlohmann::json::parse(test_util::read_bytes(tmp.file("a.json")));
  const auto b = nlohmann::json::parse(test_util::read_bytes(tmp.file("b.json")));
  EXPECT_EQ(a["checksums"], b["checksums"]);
  EXPECT_NE(a["text_encoder"].get<std::string>().find("on cuda"), std::string::npos) << a["text_encoder"];
}

}  // namespace
}  // namespace vortex
