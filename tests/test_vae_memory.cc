// Host memory of the CPU VAE decodes: video_vae_cpu_memory / audio_vae_cpu_memory (a replay of the
// decoders' allocations) against the measured peak RSS of decodes of small clips, and the canonical
// clip's figures that README.md states.
//
// Measurement: each measured test runs again in a child process of this binary (a fresh heap, so
// nothing earlier tests freed is reused). The replay tests fix glibc's mmap threshold at 128 KiB
// there first: every buffer of 128 KiB or more is then a mapping of its own, returned to the kernel
// when freed, and the RSS counts exactly the buffers alive. (With the default, dynamic threshold,
// freed buffers under 32 MiB stay in the heap and later ones are carved out of it: on the canonical
// geometry the heap holds another 0.81 GB at the peak, which CanonicalGeometryUnderTheDefaultAllocator
// bounds.) In the child a warm-up decode of the same geometry starts the thread pool and touches
// OpenBLAS's per-thread buffers, which stay resident; then writing "5" to /proc/self/clear_refs
// resets VmHWM to the current RSS (Linux >= 4.0), and VmHWM - VmRSS(before) after the decode is its
// peak growth. What the replay leaves out (allocator headers, page rounding, per-row vectors,
// thread stacks) is small next to the clips' 27-127 MB: the bound is 5% + 4 MB either way, while
// missing one of the buffers alive at the peak (a copy of the frames, a chunk's decoded tiles) moves
// the estimate by 20% or more here.
#include <gtest/gtest.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "audio_vae_test_util.h"
#include "core/parallel.h"
#include "models/vae/audio_vae.h"
#include "models/vae/video_vae.h"

extern char** environ;

namespace vortex {
namespace {

// Bytes of a /proc/self/status field given in kB ("VmRSS", "VmHWM").
std::optional<int64_t> status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream s(line.substr(field.size() + 1));
    int64_t kb = 0;
    if (s >> kb) return kb * 1024;
  }
  return std::nullopt;
}

// Peak RSS growth of the process from construction to peak_growth(), or nothing when this kernel
// cannot reset the high-water mark.
class PeakRss {
 public:
  PeakRss() {
    malloc_trim(0);
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";
    reset.close();
    const auto rss = status_bytes("VmRSS"), hwm = status_bytes("VmHWM");
    // After a reset the high-water mark is the current RSS, give or take pages touched meanwhile.
    usable_ = !reset.fail() && rss && hwm && *hwm <= *rss + (int64_t{1} << 20);
    if (rss) base_ = *rss;
  }
  bool usable() const { return usable_; }
  int64_t peak_growth() const { return status_bytes("VmHWM").value_or(0) - base_; }
  int64_t retained_growth() const {
    malloc_trim(0);
    return status_bytes("VmRSS").value_or(0) - base_;
  }

 private:
  bool usable_ = false;
  int64_t base_ = 0;
};

constexpr char kChildFlag[] = "VORTEX_TEST_VAE_MEMORY_CHILD";

enum class Allocator { kFixedThreshold, kDefault };

// True in the measuring child, with glibc's mmap threshold fixed at 128 KiB for kFixedThreshold.
// In the parent: runs the current test in a child process of this binary, expects it to pass, and
// returns false.
bool in_measuring_child(Allocator allocator) {
  if (std::getenv(kChildFlag) != nullptr) {
    if (allocator == Allocator::kFixedThreshold) {
      EXPECT_EQ(mallopt(M_MMAP_THRESHOLD, 128 << 10), 1) << "mallopt(M_MMAP_THRESHOLD)";
    }
    return true;
  }
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  // This very binary, even if a rebuild has replaced the file since it started.
  std::string exe = "/proc/self/exe";
  std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    // The parent's report settings would make the child overwrite the parent's report file.
    if (var.rfind("GTEST_", 0) != 0 && var.rfind("XML_OUTPUT_FILE=", 0) != 0) env.push_back(var);
  }
  env.push_back(std::string(kChildFlag) + "=1");
  std::vector<char*> argv{exe.data(), filter.data(), nullptr}, envp;
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data());
  EXPECT_EQ(spawned, 0) << "posix_spawn " << exe;
  if (spawned != 0) return false;
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the measuring child failed: its output is above";
  return false;
}

constexpr double kRelativeSlack = 0.05;
constexpr double kAbsoluteSlack = 4.0 * (1 << 20);

void expect_measured(int64_t measured, size_t predicted, const std::string& what) {
  const double bound = kRelativeSlack * static_cast<double>(predicted) + kAbsoluteSlack;
  EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(predicted), bound)
      << what << ": measured " << measured / 1e6 << " MB, predicted " << predicted / 1e6 << " MB";
  std::printf("%s: measured %.1f MB, predicted %.1f MB (%+.1f%%)\n", what.c_str(), measured / 1e6, predicted / 1e6,
              100.0 * (static_cast<double>(measured) / static_cast<double>(predicted) - 1.0));
}

// The release's geometry (patch 16 x 16 x 4, clip 17, token_drop 3) with a small transformer, so
// that frames and tiles are large and the blocks cheap.
vae::VideoVaeConfig small_video_config() {
  vae::VideoVaeConfig c = *vae::video_vae_config_preset("h3");
  c.decoder_num_layers = 1;
  c.decoder_num_attention_heads = 8;
  c.decoder_attention_head_dim = 64;
  c.decoder_ffn_mult = 1;
  return c;
}

struct VideoCase {
  std::string name;
  Shape latents;
  vae::VideoTiling tiling;
  std::string peak;  // where the replay puts the peak
};

void PrintTo(const VideoCase& vc, std::ostream* os) { *os << vc.name; }

class VideoVaeMemory : public testing::TestWithParam<VideoCase> {};

TEST_P(VideoVaeMemory, ReplayMatchesMeasuredPeakRss) {
  if (!PeakRss().usable()) GTEST_SKIP() << "this kernel cannot reset VmHWM through /proc/self/clear_refs";
  if (!in_measuring_child(Allocator::kFixedThreshold)) return;
  const VideoCase& vc = GetParam();
  const vae::VideoVaeConfig c = small_video_config();
  const auto estimate = vae::video_vae_cpu_memory(c, vc.latents, vc.tiling, num_threads());
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_EQ(estimate->peak, vc.peak);

  std::optional<vae::VideoVae> v;
  {
    const PeakRss weights;
    auto assembled = vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 3), c);
    ASSERT_TRUE(assembled.ok()) << assembled.status().to_string();
    v = std::move(*assembled);
    expect_measured(weights.retained_growth(), estimate->weights, vc.name + ", weights");
  }
  std::mt19937 rng(17);
  const Tensor latents = test::random_tensor(rng, vc.latents);
  ASSERT_TRUE(vae::decode_video(*v, latents, vc.tiling).ok());  // the warm-up

  const PeakRss rss;
  ASSERT_TRUE(rss.usable());
  auto frames = vae::decode_video(*v, latents, vc.tiling);
  const int64_t measured = rss.peak_growth();
  ASSERT_TRUE(frames.ok()) << frames.status().to_string();
  expect_measured(measured, estimate->total() - estimate->weights, vc.name + ", decode");
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, VideoVaeMemory,
    testing::Values(
        // Two chunks of 40 small tiles: a chunk's decoded tiles (with their overlaps) and its
        // stitched clip outweigh the finished frames.
        VideoCase{"two chunks, 5 x 8 tiles", {24, 12, 16, 24}, {true, 64, 64, 16, 16}, "stitching a chunk's tiles"},
        // Six chunks of a row of 4 large tiles: the finished frames, twice while they are concatenated.
        VideoCase{"six chunks, 1 x 4 tiles", {24, 32, 8, 24}, {true, 128, 128, 32, 32}, "concatenating the frames"}),
    [](const testing::TestParamInfo<VideoCase>& info) {
      return std::string(info.param.peak == "concatenating the frames" ? "ConcatPeak" : "StitchPeak");
    });

TEST(AudioVaeMemory, ReplayMatchesMeasuredPeakRss) {
  if (!PeakRss().usable()) GTEST_SKIP() << "this kernel cannot reset VmHWM through /proc/self/clear_refs";
  if (!in_measuring_child(Allocator::kFixedThreshold)) return;
  // The release's stages (rates 5, 5, 2 x 5; AMP kernels 3 / 7 / 11 x dilations 1 / 3 / 5) at a
  // quarter of the width, on a long clip: weights and activations both tens of MB.
  vae::AudioVaeConfig c = *vae::audio_vae_config_preset("h3");
  c.latent_dim = 512;
  c.decoder_dim = 256;
  const int64_t A = 300;
  const auto estimate = vae::audio_vae_cpu_memory(c, A, num_threads());
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();

  std::optional<vae::AudioVae> v;
  {
    const PeakRss weights;
    auto assembled = vae::assemble_audio_vae(vae::synthetic_audio_vae_tensors(c, 5, /*with_encoder=*/false), c);
    ASSERT_TRUE(assembled.ok()) << assembled.status().to_string();
    v = std::move(*assembled);
    expect_measured(weights.retained_growth(), estimate->weights, "audio weights");
  }
  std::mt19937 rng(19);
  const Tensor latents = test::random_tensor(rng, {2, A, c.latent_channels});
  ASSERT_TRUE(vae::decode_audio(*v, latents).ok());  // the warm-up

  const PeakRss rss;
  ASSERT_TRUE(rss.usable());
  auto wave = vae::decode_audio(*v, latents);
  const int64_t measured = rss.peak_growth();
  ASSERT_TRUE(wave.ok()) << wave.status().to_string();
  expect_measured(measured, estimate->total() - estimate->weights, "audio decode");
}

// The canonical clip (latents [24, 37, 48, 84] -> 124 frames of 768 x 1344, the release config
// and tiling; audio [2, 207, 32] -> 165,600 samples): the figures README.md states. No decode runs.
TEST(VaeMemory, CanonicalClip) {
  const vae::VideoVaeConfig video = *vae::video_vae_config_preset("h3");
  const Shape latents{24, 37, 48, 84};
  const double frames = 3.0 * 124 * 768 * 1344 * 4;
  for (const int threads : {2, 16, 64, 128}) {
    const auto m = vae::video_vae_cpu_memory(video, latents, vae::VideoTiling{}, threads);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::printf("canonical video decode, %d threads: peak %.3f GB while %s: weights %.3f, latents %.3f, frames %.3f, "
                "clip %.3f, tile %.3f, scratch %.3f GB\n",
                threads, m->total() / 1e9, m->peak.c_str(), m->weights / 1e9, m->latents / 1e9, m->frames / 1e9,
                m->clip / 1e9, m->tile / 1e9, m->scratch / 1e9);
    // The peak is the end of the decode: fp32 weights, and the finished frames twice (the chunk
    // parts and their concatenation), whatever the thread count.
    EXPECT_EQ(m->peak, "concatenating the frames");
    EXPECT_EQ(static_cast<double>(m->frames), 2 * frames);
    EXPECT_EQ(m->tile + m->clip + m->scratch, 0u);
    EXPECT_LE(m->total(), 13e9);
  }
  // The weights: 36 blocks of 4 · 2048² + 3 · 2048 · 8192 matrix entries dominate (2.4 G values).
  const auto m = *vae::video_vae_cpu_memory(video, latents, vae::VideoTiling{}, 2);
  EXPECT_NEAR(static_cast<double>(m.weights), 36.0 * (4 * 2048.0 * 2048 + 3 * 2048.0 * 8192) * 4, 0.01 * m.weights);

  const vae::AudioVaeConfig audio = *vae::audio_vae_config_preset("h3");
  for (const int threads : {2, 128}) {
    const auto a = vae::audio_vae_cpu_memory(audio, 207, threads);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    std::printf("canonical audio decode, %d threads: peak %.3f GB while %s: weights %.3f, latents %.6f, "
                "activations %.3f, scratch %.3f GB\n",
                threads, a->total() / 1e9, a->peak.c_str(), a->weights / 1e9, a->latents / 1e9, a->activations / 1e9,
                a->scratch / 1e9);
    EXPECT_LE(a->total(), 1e9);
  }
}

// The canonical geometry (the chunks, tiles and frames of latents [24, 37, 48, 84] with the release
// tiling) with a one-layer, 64-wide decoder (25 s on two cores), under glibc's default
// allocator: the peak RSS is the live buffers plus what the heap keeps of freed tiles (and, without
// a warm-up, the thread pool's and OpenBLAS's buffers). README.md budgets 1 GB for that excess.
TEST(VaeMemory, CanonicalGeometryUnderTheDefaultAllocator) {
  if (!PeakRss().usable()) GTEST_SKIP() << "this kernel cannot reset VmHWM through /proc/self/clear_refs";
  if (!in_measuring_child(Allocator::kDefault)) return;
  vae::VideoVaeConfig c = *vae::video_vae_config_preset("h3");
  c.decoder_num_layers = 1;
  c.decoder_num_attention_heads = 1;
  c.decoder_attention_head_dim = 64;
  c.decoder_ffn_mult = 1;
  const Shape shape{24, 37, 48, 84};
  const auto estimate = vae::video_vae_cpu_memory(c, shape, vae::VideoTiling{}, num_threads());
  ASSERT_TRUE(estimate.ok()) << estimate.status().to_string();
  EXPECT_EQ(estimate->peak, "concatenating the frames");
  const vae::VideoVae v = *vae::assemble_video_vae(vae::synthetic_video_vae_tensors(c, 3), c);
  std::mt19937 rng(23);
  const Tensor latents = test::random_tensor(rng, shape);

  const PeakRss rss;
  ASSERT_TRUE(rss.usable());
  auto frames = vae::decode_video(v, latents);
  const int64_t measured = rss.peak_growth();
  ASSERT_TRUE(frames.ok()) << frames.status().to_string();
  const double live = static_cast<double>(estimate->total() - estimate->weights);
  std::printf("canonical geometry, one-layer decoder, default allocator: peak RSS growth %.3f GB, live buffers "
              "%.3f GB, excess %.3f GB\n",
              measured / 1e9, live / 1e9, (measured - live) / 1e9);
  EXPECT_GE(static_cast<double>(measured), 0.99 * live);
  EXPECT_LE(static_cast<double>(measured), live + 1e9);
}

TEST(VaeMemory, BadInputIsInvalidArgumentNamingTheField) {
  const vae::VideoVaeConfig video = *vae::video_vae_config_preset("h3");
  const auto bad_frames = vae::video_vae_cpu_memory(video, {24, 36, 48, 84}, vae::VideoTiling{}, 2);
  ASSERT_FALSE(bad_frames.ok());
  EXPECT_EQ(bad_frames.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_frames.status().message().find("frames 36"), std::string::npos) << bad_frames.status().message();
  const auto bad_tiling = vae::video_vae_cpu_memory(video, {24, 37, 48, 84}, {true, 250, 256, 64, 64}, 2);
  ASSERT_FALSE(bad_tiling.ok());
  EXPECT_NE(bad_tiling.status().message().find("tiling"), std::string::npos) << bad_tiling.status().message();
  EXPECT_FALSE(vae::video_vae_cpu_memory(video, {24, 37, 48, 84}, vae::VideoTiling{}, 0).ok());

  const vae::AudioVaeConfig audio = *vae::audio_vae_config_preset("h3");
  const auto bad_audio = vae::audio_vae_cpu_memory(audio, 0, 2);
  ASSERT_FALSE(bad_audio.ok());
  EXPECT_EQ(bad_audio.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_audio.status().message().find("frame dim"), std::string::npos) << bad_audio.status().message();
}

}  // namespace
}  // namespace vortex
