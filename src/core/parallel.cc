#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace vortex {
namespace {

// True on pool workers always, and on a caller while it runs its share of a job: a parallel_for
// issued from such a thread runs inline instead of waiting on a pool that is busy with its parent.
thread_local bool t_inside_parallel_for = false;

int configured_thread_count() {
  if (const char* env = std::getenv("VORTEX_NUM_THREADS")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value >= 1 && value <= 4096) return static_cast<int>(value);
  }
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

// One parallel_for call. Workers hold it by shared_ptr, so a worker that wakes only after the job
// has finished finds its chunk counter exhausted and touches neither fn nor the next job.
struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t begin = 0;
  int64_t size = 0;
  int64_t num_chunks = 0;
  std::atomic<int64_t> next_chunk{0};
  std::atomic<int64_t> chunks_done{0};
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(int64_t begin, int64_t end, int64_t num_chunks,
           const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> submit(submit_mutex_);
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->begin = begin;
    job->size = end - begin;
    job->num_chunks = num_chunks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      ++generation_;
    }
    work_cv_.notify_all();

    t_inside_parallel_for = true;
    run_chunks(*job);
    t_inside_parallel_for = false;

    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return job->chunks_done.load() == job->num_chunks; });
    job_.reset();
  }

 private:
  void worker_loop() {
    t_inside_parallel_for = true;
    uint64_t seen_generation = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_cv_.wait(lock, [&] { return stop_ || generation_ != seen_generation; });
        if (stop_) return;
        seen_generation = generation_;
        job = job_;
      }
      if (job) run_chunks(*job);
    }
  }

  void run_chunks(Job& job) {
    for (;;) {
      const int64_t c = job.next_chunk.fetch_add(1);
      if (c >= job.num_chunks) return;
      // Chunk c covers [size*c/num_chunks, size*(c+1)/num_chunks): sizes differ by at most one.
      const int64_t lo = job.begin + job.size * c / job.num_chunks;
      const int64_t hi = job.begin + job.size * (c + 1) / job.num_chunks;
      (*job.fn)(lo, hi);
      if (job.chunks_done.fetch_add(1) + 1 == job.num_chunks) {
        // Taking the lock orders this notify after the caller's predicate check.
        std::lock_guard<std::mutex> lock(mutex_);
        done_cv_.notify_all();
      }
    }
  }

  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;         // guards job_, generation_, stop_
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

ThreadPool& pool() {
  static ThreadPool instance(num_threads());
  return instance;
}

}  // namespace

int num_threads() {
  static const int count = configured_thread_count();
  return count;
}

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t grain) {
  if (end <= begin) return;
  const int64_t size = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int64_t num_chunks = std::min<int64_t>(num_threads(), size / grain);
  if (num_chunks <= 1 || t_inside_parallel_for) {
    fn(begin, end);
    return;
  }
  pool().run(begin, end, num_chunks, fn);
}

}  // namespace vortex
