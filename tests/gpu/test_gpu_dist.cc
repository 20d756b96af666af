// Sequence-parallel attention over the GPUs of this machine (dist/ulysses.h):
//   - on a group of one, on two and four ranks sharing GPU 0 (exchanges by device copies: the
//     multi-GPU bookkeeping on a one-GPU machine) and, where the machine has them, on two GPUs
//     through NCCL: each rank's rows of a fused q | k | v buffer in,
//     its rows of the output out; the assembled output must be the bits of cuda::attention on one
//     device over the whole sequence (the kernel sees the same keys and queries of each head),
//     at odd lengths, uneven row splits and head dims 64 and 128; the output's padding columns
//     survive.
//   - the exchange alone: full_qkv after gather_heads holds every row of the rank's heads.
//   - the H3 transformer sequence-parallel (dist/sequence_parallel_h3.h) against one GPU on a
//     2048-wide model with the released head shape: a forward's velocities and a 2-step trajectory
//     (AdaLN tables per request, so the folded FFN residual runs on each rank's rows), with and
//     without the CUDA graph (ranks sharing a GPU run without it). A group of one is the single-GPU
//     program bit for bit; on several ranks the linears run on fewer rows each (cuBLASLt may pick another algorithm), so the velocities
//     must be within 1e-2 rel-L2 of one GPU's, the bits reported.
//   - the canonical request (37,810 rows, 50 blocks) on two ranks sharing GPU 0 against one GPU.
//   - the CLI: `generate --device cuda --devices 0` is the bits of no --devices; on a machine with
//     two GPUs `--devices 0,1` runs sequence-parallel (its summary says so) within 1e-2 of one GPU;
//     a device that does not exist is one line naming it.
//   - the fp8 recipe, int8fp8 attention and both, each against the one-GPU forward of the same
//     configuration, within 1e-2 (the bits reported).
//   - a rank's activations: its blocks' buffers hold its share of the rows (smaller than one
//     GPU's arena); more text rows than that share are refined in buffers of their own.
//   - refusals: a head count the group does not divide, a rank's rows of the wrong count, a device
//     that does not exist or is named twice, a device list that does not parse; a failing rank is
//     named and the group refuses later work.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cli_test_util.h"
#include "dist/local_gpu_group.h"
#include "dist/sequence_parallel_h3.h"
#include "dist/ulysses.h"
#include "gpu/gpu_test_util.h"
#include "h3_golden_util.h"
#include "h3_test_models.h"
#include "formats/safetensors.h"
#include "models/h3/device_memory_plan.h"
#include "models/h3/generate.h"
#include "models/h3/layout.h"
#include "models/h3/synthetic.h"

namespace vortex {
namespace {

using test::must;

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::vector<int> all_devices() {
  std::vector<int> d(device_count());
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<int>(i);
  return d;
}

// The groups every test runs on: one GPU (a group of one); two and four ranks on GPU 0, exchanging
// by device copies (the multi-GPU program's bookkeeping on any machine); and, on a machine with two
// or more GPUs, two GPUs through NCCL.
struct GroupCase {
  std::string name;
  std::function<Result<std::unique_ptr<dist::LocalGpuGroup>>()> make;
};

std::vector<GroupCase> group_cases() {
  std::vector<GroupCase> cases = {
      {"1 GPU", [] { return dist::LocalGpuGroup::create({0}); }},
      {"2 ranks on GPU 0", [] { return dist::LocalGpuGroup::create_on_one_device(0, 2); }},
      {"4 ranks on GPU 0", [] { return dist::LocalGpuGroup::create_on_one_device(0, 4); }},
  };
  if (device_count() > 1) cases.push_back({"2 GPUs", [] { return dist::LocalGpuGroup::create({0, 1}); }});
  return cases;
}

// Rows [begin, end) of a host [N, C] tensor, contiguous.
Tensor host_rows(const Tensor& t, int64_t begin, int64_t end) { return must(t.slice(0, begin, end)).contiguous(); }

// The whole-sequence output of one device (device 0): the reference every split must match.
Tensor single_device_attention(const Tensor& fused, int64_t heads, int64_t d, float scale) {
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  const int64_t n = fused.size(0), hd = heads * d;
  cuda::DeviceArena arena = must(cuda::DeviceArena::create(static_cast<size_t>(n * 4 * hd * 2) + (1 << 20)));
  const Tensor fd = must(cuda::upload(fused, arena, nullptr));
  const Tensor out = must(arena.alloc({n, hd}, DType::kBF16));
  VORTEX_EXPECT_OK(cuda::attention(test::head_view(fd, 0, heads, d), test::head_view(fd, hd, heads, d),
                                   test::head_view(fd, 2 * hd, heads, d), test::head_view(out, 0, heads, d), scale,
                                   nullptr));
  return must(cuda::download(out, nullptr));
}

// Runs sequence-parallel attention on `group` and returns the assembled [N, H·D] output. Each
// rank's output rows sit inside rows 8 columns wider (4 on each side) prefilled with a sentinel;
// `clobbered` counts sentinel bytes that changed.
Tensor sequence_parallel_attention(dist::LocalGpuGroup& group, const Tensor& fused, int64_t heads, int64_t d,
                                   float scale, int64_t& clobbered) {
  const int64_t n = fused.size(0), hd = heads * d;
  const std::vector<dist::RowRange> split = dist::partition_rows(n, group.size());
  Tensor assembled = Tensor::empty({n, hd}, DType::kBF16);
  std::vector<int64_t> clobbered_per_rank(group.size(), 0);
  VORTEX_EXPECT_OK(group.run_ranks([&](int rank) -> Status {
    const dist::RowRange rows = split[rank];
    cudaStream_t stream = nullptr;
    VORTEX_CUDA_CHECK(cudaStreamCreate(&stream));
    Status status = [&]() -> Status {
      VORTEX_ASSIGN_OR_RETURN(auto ulysses, dist::UlyssesAttention::create(group, rank, n + 5, heads, d));
      VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena,
                              cuda::DeviceArena::create(static_cast<size_t>(rows.size() * (4 * hd + 8)) * 2 + (1 << 20)));
      VORTEX_ASSIGN_OR_RETURN(Tensor qkv, cuda::upload(host_rows(fused, rows.begin, rows.end), arena, stream));
      VORTEX_ASSIGN_OR_RETURN(Tensor padded, arena.alloc({rows.size(), hd + 8}, DType::kBF16));
      VORTEX_CUDA_CHECK(cudaMemsetAsync(padded.data(), 0x5A, padded.nbytes(), stream));
      VORTEX_ASSIGN_OR_RETURN(Tensor out, padded.slice(1, 4, 4 + hd));
      VORTEX_RETURN_IF_ERROR(ulysses->attention(n, qkv.view(), out.view(), scale, nullptr, stream));
      VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(padded, stream));
      const auto* bytes = static_cast<const unsigned char*>(host.data());
      for (int64_t r = 0; r < rows.size(); ++r) {
        for (int64_t c = 0; c < hd + 8; ++c) {
          if (c >= 4 && c < 4 + hd) continue;
          for (int b = 0; b < 2; ++b) clobbered_per_rank[rank] += bytes[(r * (hd + 8) + c) * 2 + b] != 0x5A;
        }
        std::memcpy(static_cast<uint16_t*>(assembled.data()) + (rows.begin + r) * hd,
                    reinterpret_cast<const uint16_t*>(bytes) + r * (hd + 8) + 4, static_cast<size_t>(hd) * 2);
      }
      return ok_status();
    }();
    cudaStreamDestroy(stream);
    return status;
  }));
  clobbered = 0;
  for (const int64_t c : clobbered_per_rank) clobbered += c;
  return assembled;
}

TEST(GpuSequenceParallel, AttentionIsTheBitsOfOneDevice) {
  VORTEX_REQUIRE_GPU();
  struct Case {
    int64_t n, heads, d;
  };
  uint64_t seed = 9100;
  for (const GroupCase& g : group_cases()) {
    auto group = must(g.make());
    for (const Case c : {Case{1, 8, 128}, Case{3, 8, 128}, Case{37, 8, 128}, Case{1001, 8, 64}, Case{4097, 16, 128}}) {
      if (c.n < group->size()) continue;  // refused: a row per rank at least (RefusesWhatItCannotSplit)
      const std::string label = g.name + ", N=" + std::to_string(c.n) +
                                " H=" + std::to_string(c.heads) + " D=" + std::to_string(c.d);
      const Tensor fused = test::random_tensor({c.n, 3 * c.heads * c.d}, DType::kBF16, ++seed);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      const Tensor want = single_device_attention(fused, c.heads, c.d, scale);
      int64_t clobbered = -1;
      const Tensor got = sequence_parallel_attention(*group, fused, c.heads, c.d, scale, clobbered);
      EXPECT_EQ(clobbered, 0) << label << ": bytes written outside a rank's output";
      test::expect_bitwise(test::compare(got, want), label);
      std::printf("sequence-parallel attention, %s: the bits of one device\n", label.c_str());
    }
  }
}

TEST(GpuSequenceParallel, GatherHeadsHoldsEveryRowOfTheRanksHeads) {
  VORTEX_REQUIRE_GPU();
  auto group = must(device_count() > 1 ? dist::LocalGpuGroup::create(all_devices())
                                       : dist::LocalGpuGroup::create_on_one_device(0, 3));
  const int64_t n = 301, heads = 2 * group->size(), d = 64, hd = heads * d, w = hd / group->size();
  const Tensor fused = test::random_tensor({n, 3 * hd}, DType::kBF16, 9200);
  const std::vector<dist::RowRange> split = dist::partition_rows(n, group->size());
  VORTEX_EXPECT_OK(group->run_ranks([&](int rank) -> Status {
    VORTEX_ASSIGN_OR_RETURN(auto ulysses, dist::UlyssesAttention::create(*group, rank, n, heads, d));
    VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create(fused.nbytes() + (1 << 20)));
    VORTEX_ASSIGN_OR_RETURN(Tensor qkv, cuda::upload(host_rows(fused, split[rank].begin, split[rank].end), arena, nullptr));
    VORTEX_RETURN_IF_ERROR(ulysses->gather_heads(n, qkv.view(), nullptr));
    VORTEX_ASSIGN_OR_RETURN(Tensor full, ulysses->full_qkv().slice(0, 0, n));
    VORTEX_ASSIGN_OR_RETURN(Tensor host, cuda::download(full, nullptr));
    for (int64_t row = 0; row < n; ++row) {
      for (int part = 0; part < 3; ++part) {
        const void* expected = static_cast<const uint16_t*>(fused.data()) + row * 3 * hd + part * hd + rank * w;
        const void* actual = static_cast<const uint16_t*>(host.data()) + row * 3 * w + part * w;
        if (std::memcmp(expected, actual, static_cast<size_t>(w) * 2) != 0) {
          return internal_error("row " + std::to_string(row) + " part " + std::to_string(part) + " differs");
        }
      }
    }
    return ok_status();
  }));
}

// The model the H3 tests run: 2048 wide with the released head shape (16 heads of 128), 2 blocks,
// its seeded weights made on each rank's device.
h3::H3Config h3_test_config() { return test::released_heads_config(16, 2048, 4096, 2); }
h3::WeightFiller filler_for(cudaStream_t stream) { return h3::synthetic_weight_filler(12, stream); }

TEST(GpuSequenceParallel, H3MatchesOneGpu) {
  VORTEX_REQUIRE_GPU();
  const h3::H3Config c = h3_test_config();
  const test::H3TestRequest r = test::make_h3_request(c, 12, 31, 0.4f, 0.7f);
  const int64_t rows = r.layout.num_rows;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto one = must(h3::CudaH3Transformer::create(c, filler_for(nullptr), rows));
  VORTEX_EXPECT_OK(one->prepare(r.layout, r.text));
  const h3::StepOutputs want = must(one->forward(r.in));
  h3::GenerateOptions options;
  options.video = {128, 192, 22};
  options.steps = 3;  // two forwards
  options.seed = 5;
  h3::CudaModelOptions per_request;
  per_request.adaln_tables = h3::AdaLnTables::kPerRequest;
  auto one_planned = must(h3::CudaH3Transformer::create(c, filler_for(nullptr), rows, nullptr, per_request));
  const test::TrajectoryChecksums want_trajectory = test::trajectory_checksums(*one_planned, r.text, options);
  one.reset();
  one_planned.reset();

  for (const GroupCase& g : group_cases()) {
    const std::string label = g.name;
    const bool one_rank = g.name == "1 GPU";
    auto sp = must(dist::SequenceParallelH3::create(c, filler_for, rows, must(g.make()), {}));
    VORTEX_EXPECT_OK(sp->prepare(r.layout, r.text));
    for (const bool graphs : {true, false}) {
      sp->set_cuda_graphs(graphs);
      const h3::StepOutputs got = must(sp->step(r.in));
      const std::string what = label + (graphs ? ", graph" : ", direct launches");
      const double video = test::rel_l2(got.video_velocity, want.video_velocity);
      const double audio = test::rel_l2(got.audio_velocity, want.audio_velocity);
      const bool same_bits = test::compare(got.video_velocity, want.video_velocity).differing == 0 &&
                             test::compare(got.audio_velocity, want.audio_velocity).differing == 0;
      if (one_rank) {
        EXPECT_TRUE(same_bits) << what << ": rel-L2 video " << video << ", audio " << audio;
      } else {
        EXPECT_LE(video, 1e-2) << what;
        EXPECT_LE(audio, 1e-2) << what;
      }
      std::printf("sequence-parallel H3 forward, %s: rel-L2 vs one GPU video %.3e audio %.3e (%s)\n", what.c_str(),
                  video, audio, same_bits ? "the same bits" : "not the same bits");
    }
    h3::CudaModelOptions planned;
    planned.adaln_tables = h3::AdaLnTables::kPerRequest;
    auto sp_planned = must(dist::SequenceParallelH3::create(c, filler_for, rows, must(g.make()), planned));
    const test::TrajectoryChecksums got = test::trajectory_checksums(*sp_planned, r.text, options);
    if (one_rank) test::expect_same_trajectory(got, want_trajectory, label + " 2-step trajectory");
    std::printf("sequence-parallel H3 2-step trajectory, %s: video %s (one GPU %s)\n", label.c_str(),
                got.video.sha256.substr(0, 16).c_str(), want_trajectory.video.sha256.substr(0, 16).c_str());
  }
}

// The fp8 recipe and int8fp8 attention across ranks, each against the one-GPU forward of the same
// configuration. fp8: each rank quantizes its rows' bf16 attention output in the one-GPU tiles'
// layout (ranks start at multiples of 128 rows when every rank gets 128). int8fp8: the
// quantization is per head over every row of the head, as on one GPU; q and k are normed and
// rotated in bf16 before the exchange (on one GPU Q's norm runs inside its quantization, bit for
// bit the separate passes).
TEST(GpuSequenceParallel, H3Fp8AndInt8Fp8MatchOneGpu) {
  VORTEX_REQUIRE_GPU();
  const h3::H3Config c = h3_test_config();
  test::H3TestRequest r = test::make_h3_request(c, 12, 33, 0.4f, 0.7f);
  const int64_t rows = r.layout.num_rows;
  struct Configuration {
    const char* name;
    h3::LinearRecipe recipe;
    h3::AttentionMode attention;
  };
  for (const Configuration conf : {Configuration{"fp8", h3::LinearRecipe::kFp8, h3::AttentionMode::kExact},
                                   Configuration{"int8fp8", h3::LinearRecipe::kBf16, h3::AttentionMode::kInt8Fp8},
                                   Configuration{"fp8 + int8fp8", h3::LinearRecipe::kFp8, h3::AttentionMode::kInt8Fp8}}) {
    h3::CudaModelOptions options;
    options.recipe = conf.recipe;
    options.int8fp8_attention = conf.attention == h3::AttentionMode::kInt8Fp8;
    r.in.attention.mode = conf.attention;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    h3::StepOutputs want;
    {
      auto one = must(h3::CudaH3Transformer::create(c, filler_for(nullptr), rows, nullptr, options));
      VORTEX_EXPECT_OK(one->prepare(r.layout, r.text));
      want = must(one->forward(r.in));
    }
    for (const GroupCase& g : group_cases()) {
      const std::string what = std::string(conf.name) + ", " + g.name;
      auto sp = must(dist::SequenceParallelH3::create(c, filler_for, rows, must(g.make()), options));
      VORTEX_EXPECT_OK(sp->prepare(r.layout, r.text));
      const h3::StepOutputs got = must(sp->step(r.in));
      const double video = test::rel_l2(got.video_velocity, want.video_velocity);
      const double audio = test::rel_l2(got.audio_velocity, want.audio_velocity);
      const bool same_bits = test::compare(got.video_velocity, want.video_velocity).differing == 0 &&
                             test::compare(got.audio_velocity, want.audio_velocity).differing == 0;
      EXPECT_LE(video, 1e-2) << what;
      EXPECT_LE(audio, 1e-2) << what;
      std::printf("sequence-parallel H3 forward, %s (%lld rows): rel-L2 vs one GPU video %.3e audio %.3e (%s)\n",
                  what.c_str(), static_cast<long long>(rows), video, audio,
                  same_bits ? "the same bits" : "not the same bits");
    }
  }
}

// A rank's blocks work in buffers sized for its share of the rows: its activation arena is smaller
// than one GPU's, as device_memory_plan plans it. A request with more text rows than a rank's share
// (200 text rows of 442, 111 a rank on four) runs the refiner in buffers prepare() makes for it;
// the velocities stay within the tolerance of one GPU's, and a later request with few text rows
// runs in the rank's own buffers again.
TEST(GpuSequenceParallel, RanksHoldTheirShareAndRefineLongTextApart) {
  VORTEX_REQUIRE_GPU();
  const h3::H3Config c = h3_test_config();
  const test::H3TestRequest wide = test::make_h3_request(c, 200, 35, 0.4f, 0.7f);
  const test::H3TestRequest narrow = test::make_h3_request(c, 12, 36, 0.4f, 0.7f);
  const int64_t rows = wide.layout.num_rows;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  h3::StepOutputs want_wide, want_narrow;
  size_t one_gpu_bytes = 0;
  {
    auto one = must(h3::CudaH3Transformer::create(c, filler_for(nullptr), rows));
    one_gpu_bytes = one->activation_peak_bytes();
    VORTEX_EXPECT_OK(one->prepare(wide.layout, wide.text));
    want_wide = must(one->forward(wide.in));
    VORTEX_EXPECT_OK(one->prepare(narrow.layout, narrow.text));
    want_narrow = must(one->forward(narrow.in));
  }
  constexpr int kRanks = 4;
  ASSERT_GT(wide.layout.num_text, dist::max_rows_per_rank(rows, kRanks));
  auto sp = must(dist::SequenceParallelH3::create(c, filler_for, rows,
                                                  must(dist::LocalGpuGroup::create_on_one_device(0, kRanks)), {}));
  const size_t planned =
      h3::plan_activations(c, rows, h3::LinearRecipe::kBf16, false, false, dist::max_rows_per_rank(rows, kRanks)).total;
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_LE(sp->activation_peak_bytes(rank), planned) << "rank " << rank;
    EXPECT_LT(sp->activation_peak_bytes(rank), one_gpu_bytes) << "rank " << rank;
  }
  std::printf("activations, %lld rows: one GPU %zu bytes, a rank of %d %zu bytes\n", static_cast<long long>(rows),
              one_gpu_bytes, kRanks, sp->activation_peak_bytes(0));
  for (const auto& [label, request, want] : {std::tuple{"200 text rows", &wide, &want_wide},
                                             std::tuple{"12 text rows, after", &narrow, &want_narrow}}) {
    VORTEX_EXPECT_OK(sp->prepare(request->layout, request->text));
    const h3::StepOutputs got = must(sp->step(request->in));
    const double video = test::rel_l2(got.video_velocity, want->video_velocity);
    const double audio = test::rel_l2(got.audio_velocity, want->audio_velocity);
    EXPECT_LE(video, 1e-2) << label;
    EXPECT_LE(audio, 1e-2) << label;
    std::printf("sequence-parallel H3 forward, %d ranks on GPU 0, %s: rel-L2 vs one GPU video %.3e audio %.3e\n",
                kRanks, label, video, audio);
  }
}

// The canonical request (37,810 rows, the released widths, 50 blocks of synthetic weights, AdaLN
// tables per request) on two ranks sharing GPU 0 against one GPU, one forward each: the row split
// at 128-row boundaries, the per-rank RoPE / AdaLN offsets and the exchanges at full size. Needs
// ~90 GB free (two ranks of ~36 GB weights and ~7 GB activations and exchange buffers each).
TEST(GpuSequenceParallel, CanonicalForwardOnTwoRanksMatchesOneGpu) {
  VORTEX_REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (size_t{95} << 30)) GTEST_SKIP() << "needs ~95 GB free on GPU 0, has " << (free_bytes >> 30) << " GB";
  const h3::H3Config c = must(h3::config_preset("h3"));
  const h3::PackedLayout layout = must(h3::canonical_t2va_layout(c));
  const Tensor text = h3::seeded_normal({h3::kCanonicalTextTokens, c.text_dim}, 3, h3::kSyntheticTextStream);
  h3::StepInputs in;
  in.video_rows = h3::seeded_normal({layout.num_video, c.video_patch_dim()}, 3, h3::kVideoNoiseStream);
  in.audio_rows = h3::seeded_normal({layout.num_audio, c.audio_in_channels}, 3, h3::kAudioNoiseStream);
  in.timesteps = h3::assign_row_timesteps(layout, 0.55f, 0.7f);
  h3::CudaModelOptions options;
  options.adaln_tables = h3::AdaLnTables::kPerRequest;
  const auto fill = [](cudaStream_t stream) { return h3::synthetic_weight_filler(0, stream); };
  h3::StepOutputs want;
  {
    auto one = must(h3::CudaH3Transformer::create(c, fill(nullptr), layout.num_rows, nullptr, options));
    VORTEX_EXPECT_OK(one->prepare(layout, text));
    VORTEX_EXPECT_OK(one->plan_steps({in.timesteps.timesteps}));
    want = must(one->forward(in));
  }
  auto sp = must(dist::SequenceParallelH3::create(c, fill, layout.num_rows,
                                                  must(dist::LocalGpuGroup::create_on_one_device(0, 2)), options));
  VORTEX_EXPECT_OK(sp->prepare(layout, text));
  VORTEX_EXPECT_OK(sp->plan_steps({in.timesteps.timesteps}));
  const h3::StepOutputs got = must(sp->step(in));
  const double video = test::rel_l2(got.video_velocity, want.video_velocity);
  const double audio = test::rel_l2(got.audio_velocity, want.audio_velocity);
  const bool same_bits = test::compare(got.video_velocity, want.video_velocity).differing == 0 &&
                         test::compare(got.audio_velocity, want.audio_velocity).differing == 0;
  EXPECT_LE(video, 1e-2);
  EXPECT_LE(audio, 1e-2);
  std::printf("canonical forward, 2 ranks on GPU 0 (rows split at %lld): rel-L2 vs one GPU video %.3e audio %.3e (%s)\n",
              static_cast<long long>(dist::partition_rows(layout.num_rows, 2)[1].begin), video, audio,
              same_bits ? "the same bits" : "not the same bits");
}

TEST(GpuSequenceParallelCli, GenerateAcrossGpus) {
  VORTEX_REQUIRE_GPU();
  using test_util::q;
  using test_util::run_cli;
  test_util::TempDir tmp;
  const std::string generate = "generate --synthetic mid --device cuda --height 64 --width 64 --frames 22 --steps 3 ";
  const auto summary = [&](const std::string& name) {
    return nlohmann::json::parse(test_util::read_bytes(tmp.file(name + ".json")));
  };
  ASSERT_EQ(run_cli(generate + "--out " + q(tmp.file("one"))).code, 0);
  const auto pinned = run_cli(generate + "--devices 0 --out " + q(tmp.file("pinned")));
  ASSERT_EQ(pinned.code, 0) << pinned.err;
  EXPECT_EQ(summary("pinned")["checksums"], summary("one")["checksums"]);
  const auto missing = run_cli(generate + "--devices 0," + std::to_string(device_count()) + " --out " + q(tmp.file("x")));
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("device " + std::to_string(device_count()) + " does not exist"), std::string::npos)
      << missing.err;
  if (device_count() < 2) return;
  const auto split = run_cli(generate + "--devices 0,1 --out " + q(tmp.file("split")));
  ASSERT_EQ(split.code, 0) << split.err;
  EXPECT_NE(summary("split")["model"].get<std::string>().find("sequence-parallel on GPUs 0,1"), std::string::npos);
  const SafetensorsFile a = must(SafetensorsFile::open(tmp.file("split.safetensors")));
  const SafetensorsFile b = must(SafetensorsFile::open(tmp.file("one.safetensors")));
  for (const char* name : {"video_latents", "audio_latents"}) {
    const double err = test::rel_l2(must(a.get(name)), must(b.get(name)));
    EXPECT_LE(err, 1e-2) << name;
    std::printf("generate --devices 0,1 vs one GPU, %s: rel-L2 %.3e\n", name, err);
  }
}

TEST(GpuSequenceParallel, RefusesWhatItCannotSplit) {
  VORTEX_REQUIRE_GPU();
  const auto refused = [](const Status& s, const std::string& needle) {
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  refused(dist::LocalGpuGroup::create({device_count()}).status(), "does not exist");
  refused(dist::LocalGpuGroup::create({0, 0}).status(), "named twice");
  refused(dist::LocalGpuGroup::create({}).status(), "no devices");
  refused(dist::parse_device_list("0,x").status(), "entry 2");
  refused(dist::parse_device_list("").status(), "entry 1");
  EXPECT_EQ(must(dist::parse_device_list("0,1,3")), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(must(dist::parse_device_list("all")).size(), static_cast<size_t>(device_count()));

  auto group = must(dist::LocalGpuGroup::create({0}));
  if (device_count() > 1) {
    auto pair = must(dist::LocalGpuGroup::create({0, 1}));
    refused(dist::UlyssesAttention::create(*pair, 0, 100, 7, 64).status(), "the GPU count must divide");
  }
  auto ulysses = must(dist::UlyssesAttention::create(*group, 0, 100, 4, 64));
  cuda::DeviceArena arena = must(cuda::DeviceArena::create(1 << 22));
  const Tensor qkv = must(arena.alloc({50, 3 * 4 * 64}, DType::kBF16));
  refused(ulysses->gather_heads(51, qkv.view(), nullptr), "needs BF16 [51, 768]");
  refused(ulysses->gather_heads(101, qkv.view(), nullptr), "sized for 1..100");
  {
    auto four = must(dist::LocalGpuGroup::create_on_one_device(0, 4));
    auto rank0 = must(dist::UlyssesAttention::create(*four, 0, 100, 4, 64));
    refused(rank0->gather_heads(3, qkv.view(), nullptr), "3 rows; sized for 4..100 (a row per GPU at least)");
  }

  const h3::H3Config c = h3_test_config();

  // A failing rank is named; the group of one has no communicator to abort and stays usable.
  const Status failed = group->run_ranks([](int) { return invalid_argument("bad request"); });
  refused(failed, "rank 0 (device 0)");
  VORTEX_EXPECT_OK(group->run_ranks([](int) { return ok_status(); }));
  if (device_count() > 1) {
    auto pair = must(dist::LocalGpuGroup::create({0, 1}));
    refused(pair->run_ranks([](int rank) { return rank == 1 ? invalid_argument("bad request") : ok_status(); }),
            "rank 1 (device 1)");
    refused(pair->run_ranks([](int) { return ok_status(); }), "aborted");
  }
  // Ranks on one device: rank 0 waits in an exchange for rank 1, which fails first; rank 0 is
  // released, the failure named is rank 1's, and the group takes the next run.
  auto shared = must(dist::LocalGpuGroup::create_on_one_device(0, 2));
  refused(shared->run_ranks([&](int rank) -> Status {
            if (rank == 1) return invalid_argument("bad request");
            return shared->exchange(0, {}, nullptr);
          }),
          "rank 1 (device 0): bad request");
  VORTEX_EXPECT_OK(shared->run_ranks([&](int rank) { return shared->exchange(rank, {}, nullptr); }));
}

}  // namespace
}  // namespace vortex
