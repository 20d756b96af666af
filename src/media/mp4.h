// MP4 writer (libavformat/libavcodec/libswscale/libswresample): H.264 video with an optional
// AAC soundtrack. Built only when libpng and libav* are found (VORTEX_HAVE_MEDIA).
//
// Video: RGB [0, 1] -> clipped, rounded to 8 bits (as unit_to_u8) -> yuv420p, BT.709 matrix,
// limited range, tagged BT.709 in the stream. Encoder: `Mp4Options::video_encoder` when given,
// else libx264 when this libavcodec has it, else the first other H.264 encoder that accepts
// yuv420p frames and opens (h264_nvenc, h264_qsv, ...). Quality: libx264 gets `crf` and
// `preset`; an encoder with a `cq` option (nvenc) gets cq = crf; any other a bit rate of
// 0.1 bit per pixel per frame.
// Audio: the native `aac` encoder (AAC-LC), at the input sample rate when AAC allows it — every
// MPEG-4 rate, 32000 Hz (the H3 audio VAE's rate) included, so the usual path does not resample —
// else resampled with libswresample to the next higher rate AAC allows. The soundtrack is made
// exactly as long as the video (frames / fps): it may differ from that by at most one video
// frame, and is cut or padded with silence to fit. Samples are clipped to [-1, 1].
// Timing: video pts count frames in a 1/fps time base, audio pts count samples; packets are
// written interleaved in time order and the `faststart` flag moves the index to the front.
// Bits: the same input and options give the same file on every run with the same libav and
// libx264, whatever else the process did before (media::ZeroFilledHeap in libav_util.h says why
// that needs care).
#pragma once

#include <string>

#include "vortex/tensor.h"

namespace vortex::media {

struct Mp4Options {
  int crf = 18;                    // 0 (lossless) .. 51; 18 is visually near-transparent
  std::string preset = "medium";   // libx264 speed/size trade-off: ultrafast .. veryslow
  int audio_bitrate = 192000;      // AAC bits per second, all channels together
  std::string video_encoder;       // an encoder name to insist on ("libx264"); empty: choose
};

// Writes `video` f32 [3, F, H, W] (RGB planes in [0, 1]; bf16/f16 accepted) at `fps` frames per
// second, with `audio` f32 [C, S] (C = 1 or 2, values in [-1, 1]) at `sample_rate` Hz muxed in
// when non-null. H and W must be even (4:2:0 chroma). The file appears atomically
// (`<path>.tmp-<pid>`, fsync, rename); on any failure nothing is left behind and an existing
// file at `path` is untouched. Errors: invalid_argument naming the tensor and field (rank,
// shape, dtype, odd width/height, the first NaN/inf element, fps, sample rate, an audio length
// more than one frame away from the video's, options); unimplemented when no H.264 or AAC
// encoder can be opened; io_error for every failing libav call, naming the call and libav's
// text for the error.
Status write_mp4(const std::string& path, const Tensor& video, int fps, const Tensor* audio, int sample_rate,
                 const Mp4Options& options = {});

}  // namespace vortex::media
