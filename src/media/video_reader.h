// Video file reader (libavformat/libavcodec/libswscale/libswresample) for ref2va's video
// references, decoding as the reference pipeline's MiniMaxH3VideoReference.from_file does with
// PyAV: every frame of the first video stream as RGB24 (libswscale, bilinear, the frame's own
// colour matrix and range), the stream's average frame rate (else libav's guess), the frames
// stood upright as ffmpeg shows them (the display matrix's counterclockwise rotation applied,
// snapped to quarter turns), the sample aspect ratio ignored; and the first audio stream's samples
// as planar float at the rate and channel count the file carries. Built only with
// VORTEX_HAVE_MEDIA.
//
// One deliberate difference from the pipeline: its _decode_video_file turns frames clockwise by
// round(rotation / 90) quarter turns, the opposite of ffmpeg's display for ±90° (a phone's portrait
// clip, rotation -90, comes out upside down), while its comment says it reproduces ffmpeg. We
// follow ffmpeg (tests/test_video_reader.cc checks against the ffmpeg binary); 0° and 180° agree.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::media {

struct DecodedVideo {
  Tensor frames;         // U8 [F, H, W, 3] RGB, upright (undefined when a sink took them)
  int64_t frame_count = 0;
  double fps = 0.0;
  int quarter_turns = 0;  // clockwise quarter turns applied to stand the frames upright
  Tensor audio;          // F32 [C, S]; undefined when the file has no audio stream
  int sample_rate = 0;
};

// What a frame sink knows of the stream before its first frame.
struct VideoStream {
  double fps = 0.0;
  int quarter_turns = 0;
};
// Takes each decoded frame, U8 [H, W, 3] RGB upright, in order; an error stops the read.
using VideoFrameSink = std::function<Status(const VideoStream& stream, const Tensor& rgb)>;

// Decodes the frames that start within the first max_seconds (ceil(max_seconds · fps) + 1 of them;
// all when negative): a reference cut at the generated duration need not hold the rest. The
// soundtrack is decoded whole. Errors name the file and the failing step (io_error for libav's
// failures with its text, invalid_argument for a file without video or frames).
Result<DecodedVideo> read_video(const std::string& path, double max_seconds = -1.0);

// The same read, every frame handed to `sink` as it is decoded instead of kept (a 4K frame is
// 25 MB: a caller that resizes each one holds a clip's worth of its own size, not the file's);
// the result's frames are undefined and frame_count says how many went.
Result<DecodedVideo> read_video(const std::string& path, double max_seconds, const VideoFrameSink& sink);

}  // namespace vortex::media
