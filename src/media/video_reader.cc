// Video reader: demux, decode the first video stream to RGB24 (then rotate), then rewind and
// decode the first audio stream to planar float (see video_reader.h for the contract).
#include "media/video_reader.h"

extern "C" {
#include <libavutil/display.h>
#include <libavutil/imgutils.h>
}

#include <cmath>
#include <cstring>
#include <vector>

#include "core/portable_math.h"
#include "media/libav_util.h"

namespace vortex::media {
namespace {

struct InputClose {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
using InputPtr = std::unique_ptr<AVFormatContext, InputClose>;

Result<CodecContextPtr> open_decoder(const std::string& path, const AVStream* stream) {
  const AVCodec* codec = avcodec_find_decoder(stream->codecpar->codec_id);
  if (codec == nullptr) {
    return unimplemented(path + ": no decoder for stream " + std::to_string(stream->index) + "'s codec " +
                         avcodec_get_name(stream->codecpar->codec_id));
  }
  CodecContextPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) return io_error(path + ": avcodec_alloc_context3 failed");
  int err = avcodec_parameters_to_context(ctx.get(), stream->codecpar);
  if (err < 0) return av_failure(path, "avcodec_parameters_to_context", err);
  if ((err = avcodec_open2(ctx.get(), codec, nullptr)) < 0) return av_failure(path, "avcodec_open2", err);
  return ctx;
}

// The counterclockwise rotation the stream's display matrix carries, in degrees (0 without one).
double display_rotation(const AVStream* stream) {
  const uint8_t* matrix = nullptr;
#if LIBAVFORMAT_VERSION_INT >= AV_VERSION_INT(60, 15, 100)
  const AVPacketSideData* sd = av_packet_side_data_get(stream->codecpar->coded_side_data,
                                                       stream->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  if (sd != nullptr && sd->size >= 9 * sizeof(int32_t)) matrix = sd->data;
#else
  size_t size = 0;
  matrix = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (size < 9 * sizeof(int32_t)) matrix = nullptr;
#endif
  if (matrix == nullptr) return 0.0;
  const double degrees = av_display_rotation_get(reinterpret_cast<const int32_t*>(matrix));
  return std::isnan(degrees) ? 0.0 : degrees;
}

// The clockwise quarter turns that show a frame as ffmpeg does: the matrix turns it `degrees`
// counterclockwise, snapped to the nearest quarter turn (Python's round, as the pipeline snaps it).
// The pipeline itself turns the frame the other way (clockwise by round(degrees / 90)); see
// video_reader.h.
int quarter_turns(double degrees) {
  const int64_t counterclockwise = python_round(degrees / 90.0);
  return static_cast<int>(((-counterclockwise % 4) + 4) % 4);
}

// frames [F, H, W, 3] turned `turns` quarter turns clockwise (numpy's rot90(k = -turns) on H, W).
Tensor rotate_clockwise(const Tensor& frames, int turns) {
  const int64_t F = frames.size(0), H = frames.size(1), W = frames.size(2);
  const bool swap = turns % 2 != 0;
  const int64_t OH = swap ? W : H, OW = swap ? H : W;
  Tensor out = Tensor::empty({F, OH, OW, 3}, DType::kU8);
  const uint8_t* src = frames.data_as<const uint8_t>();
  uint8_t* dst = out.data_as<uint8_t>();
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t i = 0; i < OH; ++i) {
      for (int64_t j = 0; j < OW; ++j) {
        int64_t y = i, x = j;  // the source pixel of output (i, j)
        if (turns == 1) y = H - 1 - j, x = i;
        if (turns == 2) y = H - 1 - i, x = W - 1 - j;
        if (turns == 3) y = j, x = W - 1 - i;
        std::memcpy(dst + ((f * OH + i) * OW + j) * 3, src + ((f * H + y) * W + x) * 3, 3);
      }
    }
  }
  return out;
}

// Sends `packet` (nullptr: flush) and hands every frame it yields to `take`.
template <typename Take>
Status decode_packet(const std::string& path, AVCodecContext* ctx, const AVPacket* packet, AVFrame* frame,
                     Take&& take) {
  int err = avcodec_send_packet(ctx, packet);
  if (err < 0 && err != AVERROR_EOF) return av_failure(path, "avcodec_send_packet", err);
  while ((err = avcodec_receive_frame(ctx, frame)) >= 0) {
    Status s = take(frame);
    av_frame_unref(frame);
    if (!s.ok()) return s;
  }
  if (err != AVERROR(EAGAIN) && err != AVERROR_EOF) return av_failure(path, "avcodec_receive_frame", err);
  return ok_status();
}

// Each decoded frame converted to RGB24, turned upright and handed on; only the count is kept.
struct VideoSink {
  std::string path;
  VideoStream stream;
  const VideoFrameSink* deliver = nullptr;
  int64_t max_frames = -1;
  int64_t count = 0;
  std::unique_ptr<SwsContext, SwsFree> sws;
  int width = 0, height = 0;

  bool full() const { return max_frames >= 0 && count >= max_frames; }

  Status take(const AVFrame* f) {
    if (full()) return ok_status();
    if (!sws) {
      width = f->width, height = f->height;
      sws.reset(sws_getContext(width, height, static_cast<AVPixelFormat>(f->format), width, height, AV_PIX_FMT_RGB24,
                               SWS_BILINEAR, nullptr, nullptr, nullptr));
      if (!sws) return io_error(path + ": sws_getContext failed for the stream's pixel format");
      // The frame's own matrix and range, as a player shows it (unspecified: libswscale's BT.601).
      const int space = f->colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : static_cast<int>(f->colorspace);
      const int full_range = f->color_range == AVCOL_RANGE_JPEG ? 1 : 0;
      sws_setColorspaceDetails(sws.get(), sws_getCoefficients(space), full_range, sws_getCoefficients(SWS_CS_DEFAULT),
                               1, 0, 1 << 16, 1 << 16);
    } else if (f->width != width || f->height != height) {
      return invalid_argument(path + ": frame " + std::to_string(count) + " is " + std::to_string(f->width) + " x " +
                              std::to_string(f->height) + ", the stream began at " + std::to_string(width) + " x " +
                              std::to_string(height));
    }
    Tensor rgb = Tensor::empty({1, height, width, 3}, DType::kU8);
    uint8_t* planes[1] = {rgb.data_as<uint8_t>()};
    const int strides[1] = {width * 3};
    const int rows = sws_scale(sws.get(), f->data, f->linesize, 0, height, planes, strides);
    if (rows != height) return io_error(path + ": sws_scale converted " + std::to_string(rows) + " rows");
    if (stream.quarter_turns != 0) rgb = rotate_clockwise(rgb, stream.quarter_turns);
    VORTEX_ASSIGN_OR_RETURN(const Tensor frame, rgb.select(0, 0));
    ++count;
    return (*deliver)(stream, frame);
  }
};

struct AudioSink {
  std::string path;
  std::unique_ptr<SwrContext, SwrFree> swr;
  int channels = 0, rate = 0;
  std::vector<std::vector<float>> planes;

  Status convert(const AVFrame* f) {
    const int out_max = swr_get_out_samples(swr.get(), f != nullptr ? f->nb_samples : 0);
    if (out_max <= 0) return ok_status();
    std::vector<std::vector<float>> chunk(static_cast<size_t>(channels), std::vector<float>(out_max));
    std::vector<uint8_t*> out(static_cast<size_t>(channels));
    for (int c = 0; c < channels; ++c) out[c] = reinterpret_cast<uint8_t*>(chunk[c].data());
    const int got = swr_convert(swr.get(), out.data(), out_max, f != nullptr ? const_cast<const uint8_t**>(f->extended_data) : nullptr,
                                f != nullptr ? f->nb_samples : 0);
    if (got < 0) return av_failure(path, "swr_convert", got);
    for (int c = 0; c < channels; ++c) planes[c].insert(planes[c].end(), chunk[c].begin(), chunk[c].begin() + got);
    return ok_status();
  }

  // Planar float at the stream's own rate and layout: a format conversion only.
  Status take(const AVFrame* f) {
    if (!swr) {
      channels = f->ch_layout.nb_channels, rate = f->sample_rate;
      if (channels < 1 || rate < 1) return invalid_argument(path + ": the audio stream has no channels or rate");
      AVChannelLayout layout{};  // a copy: older libswresample takes it non-const
      int err = av_channel_layout_copy(&layout, &f->ch_layout);
      if (err < 0) return av_failure(path, "av_channel_layout_copy", err);
      SwrContext* raw = nullptr;
      err = swr_alloc_set_opts2(&raw, &layout, AV_SAMPLE_FMT_FLTP, rate, &layout,
                                static_cast<AVSampleFormat>(f->format), rate, 0, nullptr);
      av_channel_layout_uninit(&layout);
      if (err < 0) return av_failure(path, "swr_alloc_set_opts2", err);
      swr.reset(raw);
      if ((err = swr_init(swr.get())) < 0) return av_failure(path, "swr_init", err);
      planes.assign(static_cast<size_t>(channels), {});
    }
    return convert(f);
  }
};

// Every packet of stream `index` through `ctx` into `take`, then the flush; `done` stops early.
template <typename Take, typename Done>
Status decode_stream(const std::string& path, AVFormatContext* in, int index, AVCodecContext* ctx, Take&& take,
                     Done&& done) {
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  if (!packet || !frame) return io_error(path + ": out of memory for a packet or frame");
  int err = 0;
  while (!done() && (err = av_read_frame(in, packet.get())) >= 0) {
    Status s = ok_status();
    if (packet->stream_index == index) s = decode_packet(path, ctx, packet.get(), frame.get(), take);
    av_packet_unref(packet.get());
    if (!s.ok()) return s;
  }
  if (err < 0 && err != AVERROR_EOF) return av_failure(path, "av_read_frame", err);
  if (done()) return ok_status();
  return decode_packet(path, ctx, nullptr, frame.get(), take);
}

}  // namespace

Result<DecodedVideo> read_video(const std::string& path, double max_seconds, const VideoFrameSink& sink) {
  capture_libav_log();
  AVFormatContext* raw = nullptr;
  int err = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  if (err < 0) {
    const Status failure = av_failure(path, "avformat_open_input", err);
    // A missing input is the caller's to fix, like any file a request names.
    return err == AVERROR(ENOENT) ? not_found(failure.message()) : failure;
  }
  InputPtr in(raw);
  if ((err = avformat_find_stream_info(in.get(), nullptr)) < 0) return av_failure(path, "avformat_find_stream_info", err);
  int video_index = -1, audio_index = -1;
  for (unsigned i = 0; i < in->nb_streams; ++i) {
    const AVMediaType type = in->streams[i]->codecpar->codec_type;
    if (type == AVMEDIA_TYPE_VIDEO && video_index < 0) video_index = static_cast<int>(i);
    if (type == AVMEDIA_TYPE_AUDIO && audio_index < 0) audio_index = static_cast<int>(i);
  }
  if (video_index < 0) return invalid_argument(path + ": no video stream");
  AVStream* stream = in->streams[video_index];

  DecodedVideo out;
  AVRational rate = stream->avg_frame_rate;
  if (rate.num <= 0 || rate.den <= 0) rate = av_guess_frame_rate(in.get(), stream, nullptr);
  if (rate.num <= 0 || rate.den <= 0) return invalid_argument(path + ": the video stream has no frame rate");
  out.fps = av_q2d(rate);
  out.quarter_turns = quarter_turns(display_rotation(stream));

  VORTEX_ASSIGN_OR_RETURN(CodecContextPtr video_ctx, open_decoder(path, stream));
  VideoSink video;
  video.path = path;
  video.stream = {out.fps, out.quarter_turns};
  video.deliver = &sink;
  if (max_seconds >= 0.0) video.max_frames = static_cast<int64_t>(std::ceil(max_seconds * out.fps)) + 1;
  VORTEX_RETURN_IF_ERROR(decode_stream(
      path, in.get(), video_index, video_ctx.get(), [&](const AVFrame* f) { return video.take(f); },
      [&] { return video.full(); }));
  if (video.count == 0) return invalid_argument(path + ": no video frames to decode");
  out.frame_count = video.count;

  if (audio_index >= 0) {
    // Decoding the video drained the demuxer: the soundtrack is read in a second pass.
    if ((err = av_seek_frame(in.get(), -1, 0, AVSEEK_FLAG_BACKWARD)) < 0) return av_failure(path, "av_seek_frame", err);
    VORTEX_ASSIGN_OR_RETURN(CodecContextPtr audio_ctx, open_decoder(path, in->streams[audio_index]));
    AudioSink audio;
    audio.path = path;
    VORTEX_RETURN_IF_ERROR(decode_stream(
        path, in.get(), audio_index, audio_ctx.get(), [&](const AVFrame* f) { return audio.take(f); },
        [] { return false; }));
    if (audio.swr) VORTEX_RETURN_IF_ERROR(audio.convert(nullptr));  // what the converter still holds
    if (!audio.planes.empty() && !audio.planes[0].empty()) {
      const auto S = static_cast<int64_t>(audio.planes[0].size());
      out.audio = Tensor::empty({audio.channels, S}, DType::kF32);
      for (int c = 0; c < audio.channels; ++c) {
        std::memcpy(out.audio.data_as<float>() + c * S, audio.planes[c].data(), static_cast<size_t>(S) * sizeof(float));
      }
      out.sample_rate = audio.rate;
    }
  }
  return out;
}

Result<DecodedVideo> read_video(const std::string& path, double max_seconds) {
  std::vector<Tensor> frames;
  VORTEX_ASSIGN_OR_RETURN(DecodedVideo out, read_video(path, max_seconds, [&](const VideoStream&, const Tensor& rgb) {
                            frames.push_back(rgb);
                            return ok_status();
                          }));
  const int64_t H = frames[0].size(0), W = frames[0].size(1);
  const size_t frame_bytes = static_cast<size_t>(H * W * 3);
  out.frames = Tensor::empty({static_cast<int64_t>(frames.size()), H, W, 3}, DType::kU8);
  for (size_t f = 0; f < frames.size(); ++f) {
    std::memcpy(out.frames.data_as<uint8_t>() + f * frame_bytes, frames[f].data(), frame_bytes);
    frames[f] = Tensor();  // each decoded frame let go once copied
  }
  return out;
}

}  // namespace vortex::media
