#include "media/libav_util.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace vortex::media {
namespace {

std::mutex g_log_mutex;
std::string g_last_error;  // the last error-level line libav logged, without its newline

#if defined(__GLIBC__)
std::mutex g_heap_mutex;
int g_zero_filled_holders = 0;  // ZeroFilledHeap objects alive
#endif

// Decoders log from their own threads, so the line is kept under a lock.
void keep_error_lines(void* avcl, int level, const char* format, va_list args) {
  if (level > AV_LOG_ERROR) return;
  char line[512];
  int prefix = 0;  // no "[demuxer @ 0x...]": the error names the file already
  av_log_format_line2(avcl, level, format, args, line, sizeof(line), &prefix);
  std::string text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) return;
  const std::lock_guard<std::mutex> lock(g_log_mutex);
  g_last_error = std::move(text);
}

}  // namespace

void capture_libav_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Only libav's untouched default is replaced.
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_callback(keep_error_lines);
  });
  const std::lock_guard<std::mutex> lock(g_log_mutex);
  g_last_error.clear();
}

Status av_failure(const std::string& path, const std::string& call, int err) {
  std::string text = path + ": " + call + " failed: " + av_error_text(err);
  {
    const std::lock_guard<std::mutex> lock(g_log_mutex);
    if (!g_last_error.empty()) text += " (libav: " + g_last_error + ")";
    g_last_error.clear();
  }
  if (err == AVERROR_INVALIDDATA) return corrupt_data(text);
  return io_error(text);
}

#if defined(__GLIBC__)
// glibc fills a new block with (perturb ^ 0xff) and a freed one with perturb; 0 turns it off.
ZeroFilledHeap::ZeroFilledHeap() {
  const std::lock_guard<std::mutex> lock(g_heap_mutex);
  if (g_zero_filled_holders++ == 0) mallopt(M_PERTURB, 0xff);
}

ZeroFilledHeap::~ZeroFilledHeap() {
  const std::lock_guard<std::mutex> lock(g_heap_mutex);
  if (--g_zero_filled_holders == 0) {
    // glibc read MALLOC_PERTURB_ at start the same way (atoi).
    const char* started = std::getenv("MALLOC_PERTURB_");
    mallopt(M_PERTURB, started != nullptr ? std::atoi(started) : 0);
  }
}
#else
ZeroFilledHeap::ZeroFilledHeap() = default;
ZeroFilledHeap::~ZeroFilledHeap() = default;
#endif

}  // namespace vortex::media
