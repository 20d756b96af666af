// vortex encode-keyframe as a user runs it: a PNG to conditioning latents, and its one-line errors.
#include <gtest/gtest.h>

#include "cli_test_util.h"
#include "formats/safetensors.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#endif

namespace vortex {
namespace {

using test_util::expect_one_line_error;
using test_util::q;
using test_util::run_cli;
using test_util::TempDir;

#if defined(VORTEX_HAVE_MEDIA)

std::string write_keyframe(const TempDir& dir, const std::string& name, int64_t height, int64_t width) {
  Tensor rgb = Tensor::empty({height, width, 3}, DType::kU8);
  for (int64_t i = 0; i < rgb.numel(); ++i) rgb.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 29) % 251);
  EXPECT_TRUE(media::write_png(dir.file(name), rgb).ok());
  return dir.file(name);
}

TEST(CliKeyframe, EncodesAPngToConditioningLatents) {
  TempDir dir;
  const std::string image = write_keyframe(dir, "k.png", 50, 70);  // stretched onto the 64 x 96 canvas
  const std::string out = dir.file("k.safetensors");
  const std::string args = "encode-keyframe --image " + q(image) +
                           " --height 64 --width 96 --synthetic-video-vae test --out " + q(out);
  const auto run = run_cli(args);
  ASSERT_EQ(run.code, 0) << run.err;
  auto file = SafetensorsFile::open(out);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto latents = file->get("keyframe_latents");
  ASSERT_TRUE(latents.ok());
  EXPECT_EQ(latents->shape(), (Shape{24, 1, 16, 24}));  // the test preset's spatial ratio is 4
  EXPECT_EQ(file->metadata().at("seed"), "42");
  // The same command gives the same bytes; another posterior seed does not.
  const std::string again = dir.file("again.safetensors");
  ASSERT_EQ(run_cli(args.substr(0, args.find(" --out")) + " --out " + q(again)).code, 0);
  EXPECT_EQ(test_util::read_bytes(out), test_util::read_bytes(again));
  // A following keyframe is cover-cropped instead: other pixels, other latents.
  const std::string follower = dir.file("follower.safetensors");
  ASSERT_EQ(run_cli(args.substr(0, args.find(" --out")) + " --follows --out " + q(follower)).code, 0);
  EXPECT_NE(test_util::read_bytes(out), test_util::read_bytes(follower));
  const std::string other = dir.file("other.safetensors");
  ASSERT_EQ(run_cli(args.substr(0, args.find(" --out")) + " --seed 7 --out " + q(other)).code, 0);
  EXPECT_NE(test_util::read_bytes(out), test_util::read_bytes(other));
}

TEST(CliKeyframe, BadInputIsOneLineAndWritesNothing) {
  TempDir dir;
  const std::string good = write_keyframe(dir, "good.png", 64, 64);
  const std::string out = dir.file("k.safetensors");
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) +
                                " --height 64 --width 80 --synthetic-video-vae test --out " + q(out)),
                        "multiples of 32");
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) + " --follows --synthetic-video-vae test --out " +
                                q(out)),
                        "--follows");
  const std::string strip = write_keyframe(dir, "strip.png", 10, 64);
  expect_one_line_error(run_cli("encode-keyframe --image " + q(strip) + " --synthetic-video-vae test --out " + q(out)),
                        "aspect ratio");
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) + " --height 64 --width 64 --out " + q(out)),
                        "--synthetic-video-vae");
  expect_one_line_error(
      run_cli("encode-keyframe --image " + q(dir.file("none.png")) + " --synthetic-video-vae test --out " + q(out)),
      "none.png");
  test_util::write_bytes(dir.file("text.png"), "not an image");
  expect_one_line_error(
      run_cli("encode-keyframe --image " + q(dir.file("text.png")) + " --synthetic-video-vae test --out " + q(out)),
      "PNG signature");
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) + " --height 64 --width 64 " +
                                "--synthetic-video-vae test --out " + q(dir.file("k.npy"))),
                        ".safetensors");
  // tf32 convolutions are the GPU encoder's; the CPU runs the reference program only.
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) + " --synthetic-video-vae test " +
                                "--vae-encode-precision tf32 --out " + q(out)),
                        "--vae-encode-precision tf32 runs on --device cuda only");
  expect_one_line_error(run_cli("encode-keyframe --image " + q(good) + " --synthetic-video-vae test " +
                                "--vae-encode-precision fp16 --out " + q(out)),
                        "--vae-encode-precision");
  EXPECT_FALSE(std::filesystem::exists(out));
}

// --device cuda: the GPU's encoder where this host has a Hopper GPU (the file written), otherwise
// one line naming what is missing, and nothing written.
TEST(CliKeyframe, DeviceCudaEncodesOrSaysWhyNot) {
  TempDir dir;
  const std::string image = write_keyframe(dir, "k.png", 64, 64);
  const std::string out = dir.file("k.safetensors");
  const auto run = run_cli("encode-keyframe --image " + q(image) + " --synthetic-video-vae test --device cuda --out " +
                           q(out));
  if (run.code == 0) {
    EXPECT_TRUE(std::filesystem::exists(out));
    return;
  }
  expect_one_line_error(run, "--device cuda", /*code=*/1);
  EXPECT_FALSE(std::filesystem::exists(out));
}

#else

TEST(CliKeyframe, NeedsLibpng) { GTEST_SKIP() << "built without libpng (VORTEX_HAVE_MEDIA off)"; }

#endif

}  // namespace
}  // namespace vortex
