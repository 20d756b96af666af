// MP4 writer: H.264 + AAC through libavformat (see mp4.h for the contract).
//
// Flow: check every input (shapes, finiteness, lengths, options) before touching libav; make the
// soundtrack exactly video-long at the AAC rate; open the encoders and the muxer on
// `<path>.tmp-<pid>`; feed video frames and audio frames in presentation order (whichever
// stream is behind goes next), flush both encoders, write the trailer (faststart rewrites the
// file with the index in front), close, fsync and rename.
#include "media/mp4.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/error.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "media/libav_util.h"
#include "media/media_common.h"

namespace vortex::media {

namespace {

constexpr int kMaxFps = 1000;
constexpr int kMaxSampleRate = 768000;
// libx264's preset names (x264_preset_names); checked here so a typo is invalid_argument, not a
// failed avcodec_open2.
constexpr const char* kX264Presets[] = {"ultrafast", "superfast", "veryfast", "faster", "fast",
                                        "medium",    "slow",      "slower",   "veryslow", "placebo"};

// The soundtrack, planar, at the rate the AAC encoder runs at, exactly video-long.
struct Soundtrack {
  int rate = 0;
  int channels = 0;
  std::vector<std::vector<float>> planes;  // [C][samples]
  int64_t samples() const { return planes.empty() ? 0 : static_cast<int64_t>(planes[0].size()); }
};

// round(frames * rate / fps) without overflow for any valid input.
int64_t samples_for_frames(int64_t frames, int rate, int fps) {
  return (frames * rate * 2 + fps) / (2 * static_cast<int64_t>(fps));
}

// AAC's rate for `rate`: itself when the encoder lists it, else the next higher listed rate, else
// the highest listed one.
int aac_rate_for(const AVCodec* aac, int rate) {
  if (aac->supported_samplerates == nullptr) return rate;
  int above = 0, highest = 0;
  for (const int* r = aac->supported_samplerates; *r != 0; ++r) {
    if (*r == rate) return rate;
    if (*r > rate && (above == 0 || *r < above)) above = *r;
    highest = std::max(highest, *r);
  }
  return above != 0 ? above : highest;
}

// Clips `audio` [C, S] to [-1, 1], cuts or pads it to the video's length, and resamples it to
// `out_rate` when that differs from `rate` (then cuts or pads again: the resampler's length is
// only within a sample or two of the exact ratio).
Result<Soundtrack> make_soundtrack(const std::string& path, const Tensor& audio, int rate, int out_rate,
                                   int64_t frames, int fps) {
  Soundtrack track;
  track.rate = out_rate;
  track.channels = static_cast<int>(audio.size(0));
  const int64_t have = audio.size(1), want = samples_for_frames(frames, rate, fps);
  const float* p = audio.data_as<const float>();
  std::vector<std::vector<float>> in(track.channels, std::vector<float>(static_cast<size_t>(want), 0.0f));
  for (int c = 0; c < track.channels; ++c) {
    for (int64_t s = 0; s < std::min(have, want); ++s) in[c][s] = std::clamp(p[c * have + s], -1.0f, 1.0f);
  }
  if (out_rate == rate) {
    track.planes = std::move(in);
    return track;
  }
  AVChannelLayout layout;
  av_channel_layout_default(&layout, track.channels);
  SwrContext* raw = nullptr;
  int err = swr_alloc_set_opts2(&raw, &layout, AV_SAMPLE_FMT_FLTP, out_rate, &layout, AV_SAMPLE_FMT_FLTP, rate, 0,
                                nullptr);
  std::unique_ptr<SwrContext, SwrFree> swr(raw);
  av_channel_layout_uninit(&layout);
  if (err < 0) return av_failure(path, "swr_alloc_set_opts2", err);
  if ((err = swr_init(swr.get())) < 0) return av_failure(path, "swr_init", err);
  // Room for the converted samples plus what the filter holds back until the flush.
  const int64_t capacity = av_rescale_rnd(want, out_rate, rate, AV_ROUND_UP) + 1024;
  track.planes.assign(track.channels, std::vector<float>(static_cast<size_t>(capacity), 0.0f));
  std::vector<const uint8_t*> src(track.channels);
  std::vector<uint8_t*> dst(track.channels);
  for (int c = 0; c < track.channels; ++c) src[c] = reinterpret_cast<const uint8_t*>(in[c].data());
  int64_t got = 0;
  for (bool flushing = false;; flushing = true) {
    for (int c = 0; c < track.channels; ++c) dst[c] = reinterpret_cast<uint8_t*>(track.planes[c].data() + got);
    const int n = swr_convert(swr.get(), dst.data(), static_cast<int>(capacity - got),
                              flushing ? nullptr : src.data(), flushing ? 0 : static_cast<int>(want));
    if (n < 0) return av_failure(path, "swr_convert", n);
    got += n;
    if (flushing && (n == 0 || got == capacity)) break;
  }
  for (auto& plane : track.planes) plane.resize(static_cast<size_t>(samples_for_frames(frames, out_rate, fps)), 0.0f);
  return track;
}

// One encoder feeding one stream.
struct Track {
  CodecContextPtr codec;
  AVStream* stream = nullptr;
  FramePtr frame;
  int64_t next_pts = 0;  // in codec->time_base: frames for video, samples for audio
  int64_t end_pts = 0;   // where the track's last packet must end: frames, or samples
  bool done = false;
};

bool encoder_takes_yuv420p(const AVCodec* codec) {
  if (codec->pix_fmts == nullptr) return true;
  for (const AVPixelFormat* f = codec->pix_fmts; *f != AV_PIX_FMT_NONE; ++f) {
    if (*f == AV_PIX_FMT_YUV420P) return true;
  }
  return false;
}

// The H.264 encoders to try, best first.
Result<std::vector<const AVCodec*>> h264_candidates(const Mp4Options& options) {
  if (!options.video_encoder.empty()) {
    const AVCodec* named = avcodec_find_encoder_by_name(options.video_encoder.c_str());
    if (named == nullptr) {
      return invalid_argument("options.video_encoder \"" + options.video_encoder +
                              "\": this libavcodec has no encoder of that name");
    }
    if (named->id != AV_CODEC_ID_H264 || !encoder_takes_yuv420p(named)) {
      return invalid_argument("options.video_encoder \"" + options.video_encoder +
                              "\" is not an H.264 encoder taking yuv420p frames");
    }
    return std::vector<const AVCodec*>{named};
  }
  std::vector<const AVCodec*> out;
  if (const AVCodec* x264 = avcodec_find_encoder_by_name("libx264")) out.push_back(x264);
  void* it = nullptr;
  while (const AVCodec* codec = av_codec_iterate(&it)) {
    if (av_codec_is_encoder(codec) && codec->id == AV_CODEC_ID_H264 && encoder_takes_yuv420p(codec) &&
        std::find(out.begin(), out.end(), codec) == out.end()) {
      out.push_back(codec);
    }
  }
  return out;
}

// Configures and opens `codec` for W x H yuv420p at `fps`; the error text when it will not open.
Result<CodecContextPtr> open_video_codec(const AVCodec* codec, int width, int height, int fps,
                                         const Mp4Options& options, bool global_header) {
  CodecContextPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) return out_of_memory("avcodec_alloc_context3 failed");
  ctx->width = width;
  ctx->height = height;
  ctx->pix_fmt = AV_PIX_FMT_YUV420P;
  ctx->time_base = AVRational{1, fps};
  ctx->framerate = AVRational{fps, 1};
  ctx->sample_aspect_ratio = AVRational{1, 1};
  ctx->color_range = AVCOL_RANGE_MPEG;
  ctx->colorspace = AVCOL_SPC_BT709;
  ctx->color_primaries = AVCOL_PRI_BT709;
  ctx->color_trc = AVCOL_TRC_BT709;
  if (global_header) ctx->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* raw = nullptr;
  const std::string quality = std::to_string(options.crf);
  if (av_opt_find(ctx->priv_data, "crf", nullptr, 0, 0) != nullptr) {
    av_dict_set(&raw, "crf", quality.c_str(), 0);
    if (std::strcmp(codec->name, "libx264") == 0) av_dict_set(&raw, "preset", options.preset.c_str(), 0);
  } else if (av_opt_find(ctx->priv_data, "cq", nullptr, 0, 0) != nullptr) {
    av_dict_set(&raw, "cq", quality.c_str(), 0);
  } else {
    ctx->bit_rate = static_cast<int64_t>(0.1 * width * height * fps);
  }
  std::unique_ptr<AVDictionary, DictFree> dict(raw);
  AVDictionary* opts = dict.release();
  const int err = avcodec_open2(ctx.get(), codec, &opts);
  dict.reset(opts);
  if (err < 0) return io_error(std::string(codec->name) + ": avcodec_open2 failed: " + av_error_text(err));
  return ctx;
}

Status add_stream(const std::string& path, AVFormatContext* oc, Track* track) {
  track->stream = avformat_new_stream(oc, nullptr);
  if (track->stream == nullptr) return out_of_memory(path + ": avformat_new_stream failed");
  track->stream->time_base = track->codec->time_base;
  const int err = avcodec_parameters_from_context(track->stream->codecpar, track->codec.get());
  if (err < 0) return av_failure(path, "avcodec_parameters_from_context", err);
  track->frame.reset(av_frame_alloc());
  if (!track->frame) return out_of_memory(path + ": av_frame_alloc failed");
  return ok_status();
}

// Sends `frame` (null: flush) to the track's encoder and writes every packet it has ready.
Status encode(const std::string& path, AVFormatContext* oc, Track* track, AVPacket* packet, const AVFrame* frame) {
  int err = avcodec_send_frame(track->codec.get(), frame);
  if (err < 0) return av_failure(path, std::string("avcodec_send_frame(") + track->codec->codec->name + ")", err);
  for (;;) {
    err = avcodec_receive_packet(track->codec.get(), packet);
    if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return ok_status();
    if (err < 0) return av_failure(path, std::string("avcodec_receive_packet(") + track->codec->codec->name + ")", err);
    // Every video packet is one frame; not every encoder says so, and the muxer needs it for the
    // last frame's duration (the video then lasts frames / fps, not one frame less).
    if (packet->duration == 0 && track->codec->codec_type == AVMEDIA_TYPE_VIDEO) packet->duration = 1;
    // The aac encoder pads a short last frame to a multiple of 32 samples and says so in the
    // packet's duration, which the muxer's edit list would then play as up to 31 samples of
    // extra silence: end the track exactly where its input ended.
    if (packet->pts != AV_NOPTS_VALUE && packet->pts + packet->duration > track->end_pts) {
      packet->duration = std::max<int64_t>(0, track->end_pts - packet->pts);
    }
    av_packet_rescale_ts(packet, track->codec->time_base, track->stream->time_base);
    packet->stream_index = track->stream->index;
    err = av_interleaved_write_frame(oc, packet);  // takes the packet's reference
    if (err < 0) return av_failure(path, "av_interleaved_write_frame", err);
  }
}

// Everything libav does for one file: the encoders, the muxer on `url`, the frame loop.
Status encode_file(const std::string& path, const std::string& url, const Tensor& video, int fps,
                   const Soundtrack* sound, const Mp4Options& options) {
  const int frames = static_cast<int>(video.size(1));
  const int height = static_cast<int>(video.size(2)), width = static_cast<int>(video.size(3));
  AVFormatContext* raw_oc = nullptr;
  int err = avformat_alloc_output_context2(&raw_oc, nullptr, "mp4", url.c_str());
  if (err < 0) return av_failure(path, "avformat_alloc_output_context2", err);
  std::unique_ptr<AVFormatContext, OutputFree> oc(raw_oc);
  const bool global_header = (oc->oformat->flags & AVFMT_GLOBALHEADER) != 0;

  // Video encoder: the first candidate that opens.
  Track vid;
  VORTEX_ASSIGN_OR_RETURN(const std::vector<const AVCodec*> candidates, h264_candidates(options));
  std::string tried;
  for (const AVCodec* codec : candidates) {
    Result<CodecContextPtr> opened = open_video_codec(codec, width, height, fps, options, global_header);
    if (opened.ok()) {
      vid.codec = std::move(opened).value();
      break;
    }
    tried += (tried.empty() ? "" : "; ") + opened.status().message();
  }
  if (!vid.codec) {
    return unimplemented(path + ": no H.264 encoder could be opened" + (tried.empty() ? "" : " (" + tried + ")"));
  }
  VORTEX_RETURN_IF_ERROR(add_stream(path, oc.get(), &vid));
  vid.end_pts = frames;
  vid.stream->avg_frame_rate = AVRational{fps, 1};
  vid.frame->format = AV_PIX_FMT_YUV420P;
  vid.frame->width = width;
  vid.frame->height = height;
  if ((err = av_frame_get_buffer(vid.frame.get(), 0)) < 0) return av_failure(path, "av_frame_get_buffer", err);
  std::unique_ptr<SwsContext, SwsFree> sws(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height,
                                                          AV_PIX_FMT_YUV420P, SWS_BICUBIC | SWS_ACCURATE_RND,
                                                          nullptr, nullptr, nullptr));
  if (!sws) return io_error(path + ": sws_getContext(rgb24 -> yuv420p) failed");
  // Full-range RGB in, BT.709 limited-range YUV out, as the stream is tagged.
  const int* bt709 = sws_getCoefficients(SWS_CS_ITU709);
  if (sws_setColorspaceDetails(sws.get(), bt709, 1, bt709, 0, 0, 1 << 16, 1 << 16) < 0) {
    return io_error(path + ": sws_setColorspaceDetails(BT.709) failed");
  }

  Track aud;
  if (sound != nullptr) {
    const AVCodec* aac = avcodec_find_encoder_by_name("aac");
    if (aac == nullptr) return unimplemented(path + ": this libavcodec has no native aac encoder");
    aud.codec.reset(avcodec_alloc_context3(aac));
    if (!aud.codec) return out_of_memory(path + ": avcodec_alloc_context3(aac) failed");
    aud.codec->sample_fmt = AV_SAMPLE_FMT_FLTP;
    aud.codec->sample_rate = sound->rate;
    av_channel_layout_default(&aud.codec->ch_layout, sound->channels);
    aud.codec->bit_rate = options.audio_bitrate;
    aud.codec->time_base = AVRational{1, sound->rate};
    if (global_header) aud.codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if ((err = avcodec_open2(aud.codec.get(), aac, nullptr)) < 0) return av_failure(path, "avcodec_open2(aac)", err);
    VORTEX_RETURN_IF_ERROR(add_stream(path, oc.get(), &aud));
    aud.end_pts = sound->samples();
  } else {
    aud.done = true;
  }

  if ((err = avio_open(&oc->pb, url.c_str(), AVIO_FLAG_WRITE)) < 0) return av_failure(path, "avio_open", err);
  AVDictionary* raw_mux = nullptr;
  av_dict_set(&raw_mux, "movflags", "+faststart", 0);
  // The edit lists, which say how long each track plays, count in the movie time scale, 1/1000 s
  // by default and rounded up: 22 frames at 24 fps would last 0.917 s. A scale that both the
  // frame rate and the sample rate divide (and 1000, the usual one) makes every duration exact;
  // with fps <= 1000 and AAC's rates <= 96 kHz it stays below 2^31.
  const int64_t timescale = std::lcm(std::lcm<int64_t>(1000, fps), sound != nullptr ? sound->rate : 1);
  av_dict_set_int(&raw_mux, "movie_timescale", timescale, 0);
  err = avformat_write_header(oc.get(), &raw_mux);
  av_dict_free(&raw_mux);
  if (err < 0) return av_failure(path, "avformat_write_header", err);

  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  if (!packet) return out_of_memory(path + ": av_packet_alloc failed");
  const int64_t plane = static_cast<int64_t>(width) * height;
  const float* rgb_planes = video.data_as<const float>();  // [3, F, H, W]
  std::vector<uint8_t> rgb(static_cast<size_t>(plane) * 3);
  const int frame_size = aud.codec ? aud.codec->frame_size : 0;
  while (!vid.done || !aud.done) {
    const bool video_next = !vid.done && (aud.done || av_compare_ts(vid.next_pts, vid.codec->time_base, aud.next_pts,
                                                                    aud.codec->time_base) <= 0);
    Track& t = video_next ? vid : aud;
    const bool flush = video_next ? vid.next_pts == frames : aud.next_pts == sound->samples();
    if (flush) {
      VORTEX_RETURN_IF_ERROR(encode(path, oc.get(), &t, packet.get(), nullptr));
      t.done = true;
      continue;
    }
    // The encoder may still hold the previous frame's buffers.
    if (t.frame->buf[0] != nullptr && (err = av_frame_make_writable(t.frame.get())) < 0) {
      return av_failure(path, "av_frame_make_writable", err);
    }
    if (video_next) {
      const float* r = rgb_planes + vid.next_pts * plane;
      const int64_t channel_stride = static_cast<int64_t>(frames) * plane;
      planes_to_rgb(r, r + channel_stride, r + 2 * channel_stride, plane, rgb.data());
      const uint8_t* src[1] = {rgb.data()};
      const int src_stride[1] = {3 * width};
      sws_scale(sws.get(), src, src_stride, 0, height, vid.frame->data, vid.frame->linesize);
      vid.frame->pts = vid.next_pts++;
    } else {
      // AAC takes frame_size samples per frame; only the last may be shorter.
      const int n = static_cast<int>(std::min<int64_t>(frame_size, sound->samples() - aud.next_pts));
      if (aud.frame->nb_samples != n) {
        av_frame_unref(aud.frame.get());
        aud.frame->format = AV_SAMPLE_FMT_FLTP;
        aud.frame->sample_rate = sound->rate;
        aud.frame->nb_samples = n;
        if ((err = av_channel_layout_copy(&aud.frame->ch_layout, &aud.codec->ch_layout)) < 0) {
          return av_failure(path, "av_channel_layout_copy", err);
        }
        if ((err = av_frame_get_buffer(aud.frame.get(), 0)) < 0) return av_failure(path, "av_frame_get_buffer", err);
      }
      for (int c = 0; c < sound->channels; ++c) {
        std::memcpy(aud.frame->data[c], sound->planes[c].data() + aud.next_pts, sizeof(float) * n);
      }
      aud.frame->pts = aud.next_pts;
      aud.next_pts += n;
    }
    VORTEX_RETURN_IF_ERROR(encode(path, oc.get(), &t, packet.get(), t.frame.get()));
  }
  if ((err = av_write_trailer(oc.get())) < 0) return av_failure(path, "av_write_trailer", err);
  if ((err = avio_closep(&oc->pb)) < 0) return av_failure(path, "avio_closep", err);
  return ok_status();
}

Status check_options(const std::string& path, const Mp4Options& options) {
  if (options.crf < 0 || options.crf > 51) {
    return invalid_argument(path + ": options.crf " + std::to_string(options.crf) + " is outside 0..51");
  }
  if (std::find_if(std::begin(kX264Presets), std::end(kX264Presets),
                   [&](const char* p) { return options.preset == p; }) == std::end(kX264Presets)) {
    return invalid_argument(path + ": options.preset \"" + options.preset +
                            "\" is not a libx264 preset (ultrafast .. veryslow, placebo)");
  }
  if (options.audio_bitrate < 16000 || options.audio_bitrate > 512000) {
    return invalid_argument(path + ": options.audio_bitrate " + std::to_string(options.audio_bitrate) +
                            " is outside 16000..512000");
  }
  return ok_status();
}

}  // namespace

Status write_mp4(const std::string& path, const Tensor& video, int fps, const Tensor* audio, int sample_rate,
                 const Mp4Options& options) {
  VORTEX_ASSIGN_OR_RETURN(const Tensor v, checked_video(video, path + ": video"));
  const int64_t frames = v.size(1), height = v.size(2), width = v.size(3);
  if (height % 2 != 0 || width % 2 != 0) {
    return invalid_argument(path + ": video: shape " + v.shape().to_string() + ": height H and width W must be even " +
                            "for 4:2:0 H.264");
  }
  if (height > 16384 || width > 16384 || frames > (1 << 30)) {
    return invalid_argument(path + ": video: shape " + v.shape().to_string() + " is larger than H.264 allows");
  }
  if (fps <= 0 || fps > kMaxFps) {
    return invalid_argument(path + ": fps " + std::to_string(fps) + " is outside 1.." + std::to_string(kMaxFps));
  }
  VORTEX_RETURN_IF_ERROR(check_options(path, options));

  capture_libav_log();  // and libx264's per-encode statistics stay off stderr
  std::unique_ptr<Soundtrack> sound;
  if (audio != nullptr) {
    VORTEX_ASSIGN_OR_RETURN(const Tensor a, checked_audio(*audio, path + ": audio", 2));
    if (sample_rate <= 0 || sample_rate > kMaxSampleRate) {
      return invalid_argument(path + ": sample_rate " + std::to_string(sample_rate) + " is outside 1.." +
                              std::to_string(kMaxSampleRate));
    }
    // |S / rate - F / fps| <= 1 / fps, in integers.
    const int64_t samples = a.size(1);
    if (std::llabs(samples * fps - frames * sample_rate) > sample_rate) {
      return invalid_argument(path + ": audio: " + std::to_string(samples) + " samples at " +
                              std::to_string(sample_rate) + " Hz do not match the video's " + std::to_string(frames) +
                              " frames at " + std::to_string(fps) + " fps (expected " +
                              std::to_string(samples_for_frames(frames, sample_rate, fps)) +
                              " samples, give or take one frame)");
    }
    const AVCodec* aac = avcodec_find_encoder_by_name("aac");
    if (aac == nullptr) return unimplemented(path + ": this libavcodec has no native aac encoder");
    VORTEX_ASSIGN_OR_RETURN(Soundtrack track, make_soundtrack(path, a, sample_rate, aac_rate_for(aac, sample_rate),
                                                              frames, fps));
    sound = std::make_unique<Soundtrack>(std::move(track));
  }

  TempFile tmp(path);
  const ZeroFilledHeap reproducible_encoder;  // see libav_util.h: libx264 reads bytes it never wrote
  // "file:" keeps a ':' in the path from being read as a protocol name.
  VORTEX_RETURN_IF_ERROR(encode_file(path, "file:" + tmp.path(), v, fps, sound.get(), options));
  return tmp.commit();
}

}  // namespace vortex::media
