// The jobs a server holds: submitted requests wait in order and one worker thread runs them one at
// a time, since the model a server loads is one device's worth of weights. No model logic here:
// the runner the owner gives does the work and reports progress through its JobContext.
//
// Thread safety: every public method may be called from any thread (the HTTP handlers' pool)
// while the worker runs.
//
// Persistence is the owner's: an observer sees every change of state (submitted, started,
// finished, cancelled) and may record it; restore() takes such records back after a restart. A
// shutdown does not tell the observer about the jobs it interrupts, so their last record stays
// queued or running, and a restore runs them again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "vortex/status.h"

namespace vortex::service {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };
const char* job_state_name(JobState state);

// One job as the API shows it.
struct JobSnapshot {
  std::string id;
  JobState state = JobState::kQueued;
  nlohmann::json request;  // as accepted
  int queue_position = 0;  // 1 = next to run; 0 unless queued
  int step = 0;            // steps finished, of
  int total_steps = 0;     // (0 until the runner reports)
  double submitted_at = 0, started_at = 0, finished_at = 0;  // Unix seconds; 0: not yet
  double elapsed_seconds = 0;  // of the run, at the last report
  std::string phase;           // what a running job does now, as its runner names it ("encode", "denoise", "decode")
  nlohmann::json result;       // the runner's summary, once succeeded
  std::string error;           // failed or cancelled: the one-line reason
  nlohmann::json to_json() const;
  // to_json's inverse, for restore(); a record that is not one is kCorruptData naming the field.
  static Result<JobSnapshot> from_json(const nlohmann::json& j);
};

class JobQueue;

// What a runner sees of its job.
class JobContext {
 public:
  // After each step: `step` of `total` finished, `elapsed_seconds` since the run began.
  void report(int step, int total, double elapsed_seconds);
  // What the job does from now on, shown while it runs.
  void set_phase(const std::string& phase);
  // True once the job was cancelled: the runner should stop at its next step boundary.
  bool cancel_requested() const { return cancel_->load(); }

 private:
  friend class JobQueue;
  JobContext(JobQueue* queue, std::string id, std::shared_ptr<std::atomic<bool>> cancel)
      : queue_(queue), id_(std::move(id)), cancel_(std::move(cancel)) {}
  JobQueue* queue_;
  std::string id_;
  std::shared_ptr<std::atomic<bool>> cancel_;
};

// Runs one job: its summary on success; a kCancelled status when it stopped on request.
using JobRunner = std::function<Result<nlohmann::json>(const std::string& id, const nlohmann::json& request,
                                                       JobContext& context)>;

// Called, with the queue's lock held, after each change of a job's state.
using JobObserver = std::function<void(const JobSnapshot&)>;

struct QueueMetrics {
  std::map<JobState, int> jobs;  // by state, of the jobs still held
  int64_t submitted = 0, rejected_full = 0;
  int64_t steps = 0;            // finished steps, all jobs
  double run_seconds = 0;       // in runners, all finished jobs
  double last_step_seconds = 0; // the newest step's duration
};

class JobQueue {
 public:
  // At most `max_queued` jobs wait (the running one not counted); finished jobs beyond
  // `max_finished` are forgotten oldest first (their files stay wherever the runner wrote them).
  JobQueue(JobRunner runner, int max_queued, int max_finished = 1000, JobObserver observer = nullptr);
  ~JobQueue();  // shutdown()
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // Queues a request under a fresh id; nullopt when max_queued jobs already wait.
  std::optional<JobSnapshot> submit(nlohmann::json request);
  // Jobs recorded by an earlier server: finished ones are held as they were; queued or running
  // ones (interrupted) are queued again, from step 0, in their submission order, beyond
  // max_queued if need be. Ids already held are skipped. Returns how many were queued.
  int restore(std::vector<JobSnapshot> jobs);
  std::optional<JobSnapshot> get(const std::string& id) const;
  std::vector<JobSnapshot> list() const;  // in submission order
  // A queued job is cancelled at once; a running one is asked to stop (its state turns to
  // cancelled when the runner returns). Not found: kNotFound; already finished: kInvalidArgument.
  Result<JobSnapshot> cancel(const std::string& id);
  QueueMetrics metrics() const;
  // Cancels every queued job, asks the running one to stop and waits for it; submit() refuses
  // afterwards. Idempotent.
  void shutdown();

 private:
  friend class JobContext;
  struct Job {
    JobSnapshot snapshot;
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
    bool cancelled_by_request = false;  // cancel(), not shutdown(): the record says cancelled
  };
  void worker_loop();
  void report(const std::string& id, int step, int total, double elapsed_seconds);
  void set_phase(const std::string& id, const std::string& phase);
  void forget_old_finished();  // with mutex_ held
  JobSnapshot snapshot_of(const Job& job) const;  // with mutex_ held: fills queue_position
  void observe(const Job& job) const;             // with mutex_ held

  JobRunner runner_;
  int max_queued_, max_finished_;
  JobObserver observer_;
  std::string id_prefix_;
  int64_t next_id_ = 1;

  std::mutex shutdown_mutex_;  // held through shutdown(), so that two calls join the worker once
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::vector<std::string> order_;  // ids in submission order
  std::deque<std::string> queued_;
  bool stopping_ = false;
  QueueMetrics totals_;  // submitted, rejected, steps, seconds; jobs is filled by metrics()
  std::thread worker_;
};

}  // namespace vortex::service
