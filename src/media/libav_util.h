// What the libav-based readers and writers share: owners for libav's objects, its log kept from
// stderr, and its errors as Status text. Included only where VORTEX_HAVE_MEDIA builds (libavformat, libavcodec,
// libswscale, libswresample).
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

#include <memory>
#include <string>

#include "vortex/status.h"

namespace vortex::media {

struct CodecContextFree {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
struct SwrFree {
  void operator()(SwrContext* s) const { swr_free(&s); }
};
struct OutputFree {
  void operator()(AVFormatContext* oc) const {
    if (oc->pb != nullptr) avio_closep(&oc->pb);
    avformat_free_context(oc);
  }
};
struct DictFree {
  void operator()(AVDictionary* d) const { av_dict_free(&d); }
};
using CodecContextPtr = std::unique_ptr<AVCodecContext, CodecContextFree>;
using FramePtr = std::unique_ptr<AVFrame, FrameFree>;

// av_err2str is a C compound literal, which C++ does not have.
inline std::string av_error_text(int err) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(err, text, sizeof(text));
  return text;
}

// libav's own log lines are kept rather than printed (a failure is reported once, as a Status):
// called as a read or write starts, it installs the capture (once) and forgets any earlier line;
// the last error-level line since is what av_failure adds. An application that set its own log
// level keeps libav's printing.
void capture_libav_log();

// A libav call's failure: corrupt_data for bytes libav cannot read as media, io_error otherwise;
// the text is libav's, with its last logged error line.
Status av_failure(const std::string& path, const std::string& call, int err);

// While one lives, every heap block the process allocates (malloc, not calloc) starts zero-filled
// (glibc's malloc perturb setting; elsewhere it does nothing). libx264 (every preset but
// ultrafast) reads heap bytes it never wrote in its lookahead, so without this the same frames
// could encode to other bits whenever earlier work left other bytes on the heap (another thread
// count, another job in the same server): the MP4 must be as reproducible as the frames. Freed
// blocks are overwritten too, so the cost is a memset per allocation and free while it lives;
// it ends with the setting the process started with (MALLOC_PERTURB_). Nests and may be held
// from several threads at once.
class ZeroFilledHeap {
 public:
  ZeroFilledHeap();
  ~ZeroFilledHeap();
  ZeroFilledHeap(const ZeroFilledHeap&) = delete;
  ZeroFilledHeap& operator=(const ZeroFilledHeap&) = delete;
};

}  // namespace vortex::media
