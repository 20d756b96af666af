// vortex encode-keyframe: a keyframe's PNG through the video VAE encoder to the normalised
// conditioning latents an fl2va request reads, as the reference pipeline makes them: the image put
// on the canvas (MiniMaxH3ResizeStep: the canvas from the first keyframe's size unless given, the
// first keyframe stretched, a following one cover-cropped, Pillow's LANCZOS), then
// encode_vae_condition (ImageNet-normalised pixels, the tiled encode, a posterior sample rounded
// through fp16, the checkpoint's latent statistics).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "formats/safetensors.h"
#include "keyframe_request.h"
#include "models/h3/keyframes.h"
#if defined(VORTEX_HAVE_MEDIA)
#include "media/png.h"
#endif

namespace vortex::cli {

namespace {

struct EncodeKeyframeArgs {
  std::string image;
  std::string video_vae;
  std::string synthetic_video_vae;
  uint64_t weights_seed = 0;
  uint64_t seed = kKeyframePosteriorSeed;
  int64_t height = 0, width = 0;  // the canvas; 0: from this image
  bool follows = false;           // a keyframe after the request's first: cover-cropped
  std::string device = "cpu";
  std::string precision = "fp32";  // --vae-encode-precision
  std::string out;
};

Status run_encode_keyframe(const EncodeKeyframeArgs& a) {
#if !defined(VORTEX_HAVE_MEDIA)
  return unimplemented("encode-keyframe: this build has no PNG reader (libpng was not found)");
#else
  if (!a.out.ends_with(".safetensors")) return invalid_argument("--out " + a.out + ": must end in .safetensors");
  VORTEX_RETURN_IF_ERROR(check_vae_encode_precision(a.precision, a.device));
  if ((a.height == 0) != (a.width == 0)) return invalid_argument("--height and --width go together, or neither");
  if (a.follows && a.height == 0) {
    return invalid_argument("--follows: a following keyframe is cropped onto the request's canvas; give --height "
                            "and --width (the first keyframe's canvas)");
  }
  const int64_t multiple = h3::kVaeSpatialRatio * 2;  // latent cells in whole patches
  if (a.height % multiple != 0 || a.width % multiple != 0 || a.height < 0 || a.width < 0) {
    return invalid_argument("--height " + std::to_string(a.height) + " --width " + std::to_string(a.width) +
                            ": the canvas sides must be positive multiples of " + std::to_string(multiple));
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor image, media::read_png_rgb8(a.image));
  h3::Canvas canvas{a.height, a.width};
  if (a.height == 0) {
    auto resolved = h3::keyframe_canvas(image.size(1), image.size(0));
    if (!resolved.ok()) return resolved.status().with_context(a.image);
    canvas = *resolved;
  }
  VORTEX_ASSIGN_OR_RETURN(Tensor rgb, h3::fit_keyframe(image, canvas, a.follows ? 1 : 0));
  const int64_t height = canvas.height, width = canvas.width;
  VORTEX_ASSIGN_OR_RETURN(
      KeyframeEncoder encoder,
      KeyframeEncoder::load(a.video_vae, a.synthetic_video_vae, a.weights_seed, a.device, a.precision));
  std::fprintf(stderr, "vortex: encoding %s (%lldx%lld, on a %lldx%lld canvas) on %s\n", a.image.c_str(),
               static_cast<long long>(image.size(1)), static_cast<long long>(image.size(0)),
               static_cast<long long>(width), static_cast<long long>(height), encoder.where());
  VORTEX_ASSIGN_OR_RETURN(Tensor latents, keyframe_latents(encoder, rgb, a.seed));
  return write_safetensors(a.out, {{"keyframe_latents", latents}},
                           {{"image", a.image},
                            {"height", std::to_string(height)},
                            {"width", std::to_string(width)},
                            {"seed", std::to_string(a.seed)},
                            {"vae_encode_precision", a.precision},
                            {"video_vae", a.video_vae.empty() ? "synthetic:" + a.synthetic_video_vae : a.video_vae}});
#endif
}

}  // namespace

void add_encode_keyframe_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<EncodeKeyframeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "encode-keyframe", "Encode a keyframe PNG to fl2va conditioning latents on the request's canvas");
  cmd->add_option("--image", args->image, "RGB PNG (any size within 1:4 to 4:1)")->required();
  cmd->add_option("--height", args->height, "Canvas height (default: from the image, as the first keyframe sets it)");
  cmd->add_option("--width", args->width, "Canvas width");
  cmd->add_flag("--follows", args->follows,
                "A keyframe after the request's first: cover-cropped onto --height x --width instead of stretched");
  cmd->add_option("--video-vae", args->video_vae, "Video VAE checkpoint (file or folder)");
  cmd->add_option("--synthetic-video-vae", args->synthetic_video_vae,
                  "Deterministic synthetic video VAE of a preset (h3, test, small)");
  cmd->add_option("--weights-seed", args->weights_seed, "Seed of the synthetic VAE")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the posterior sample")->capture_default_str();
  cmd->add_option("--device", args->device, "Where the encoder runs")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--vae-encode-precision", args->precision, kVaeEncodePrecisionHelp)->capture_default_str();
  cmd->add_option("--out", args->out, "Output PATH.safetensors (tensor keyframe_latents [C, 1, H/16, W/16])")
      ->required();
  cmd->callback([args, &action] {
    action = [args] {
      Status st = run_encode_keyframe(*args);
      return st.ok() ? 0 : report_error(st);
    };
  });
}

}  // namespace vortex::cli
