#include "service/job_queue.h"

#include <algorithm>
#include <chrono>

#include "core/quote.h"

namespace vortex::service {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool finished(JobState s) { return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled; }

}  // namespace

const char* job_state_name(JobState state) {
  switch (state) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "unknown";
}

nlohmann::json JobSnapshot::to_json() const {
  nlohmann::json j = {{"id", id}, {"state", job_state_name(state)}, {"request", request},
                      {"submitted_at", submitted_at}};
  if (state == JobState::kQueued) j["queue_position"] = queue_position;
  if (total_steps > 0) {
    j["progress"] = {{"step", step}, {"total", total_steps}, {"elapsed_seconds", elapsed_seconds}};
    if (state == JobState::kRunning && step > 0) {
      j["progress"]["eta_seconds"] = elapsed_seconds / step * (total_steps - step);
    }
  }
  if (state == JobState::kRunning && !phase.empty()) j["phase"] = phase;
  if (started_at > 0) j["started_at"] = started_at;
  if (finished_at > 0) j["finished_at"] = finished_at;
  if (state == JobState::kSucceeded) j["result"] = result;
  if (!error.empty()) j["error"] = error;
  return j;
}

Result<JobSnapshot> JobSnapshot::from_json(const nlohmann::json& j) {
  JobSnapshot s;
  const auto field = [&](const char* key) -> Result<const nlohmann::json*> {
    if (!j.is_object() || !j.contains(key)) return corrupt_data(std::string("job record: no field '") + key + "'");
    return &j.at(key);
  };
  VORTEX_ASSIGN_OR_RETURN(const nlohmann::json* id, field("id"));
  VORTEX_ASSIGN_OR_RETURN(const nlohmann::json* state, field("state"));
  VORTEX_ASSIGN_OR_RETURN(const nlohmann::json* request, field("request"));
  VORTEX_ASSIGN_OR_RETURN(const nlohmann::json* submitted, field("submitted_at"));
  if (!id->is_string() || !state->is_string() || !request->is_object() || !submitted->is_number()) {
    return corrupt_data("job record: id, state, request or submitted_at has the wrong type");
  }
  s.id = *id;
  const std::string name = *state;
  bool known = false;
  for (JobState candidate : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                             JobState::kCancelled}) {
    if (name == job_state_name(candidate)) {
      s.state = candidate;
      known = true;
    }
  }
  if (!known) return corrupt_data("job record " + s.id + ": unknown state '" + name + "'");
  s.request = *request;
  s.submitted_at = *submitted;
  s.started_at = j.value("started_at", 0.0);
  s.finished_at = j.value("finished_at", 0.0);
  s.result = j.value("result", nlohmann::json());
  s.error = j.value("error", "");
  if (j.contains("progress") && j["progress"].is_object()) {
    s.step = j["progress"].value("step", 0);
    s.total_steps = j["progress"].value("total", 0);
    s.elapsed_seconds = j["progress"].value("elapsed_seconds", 0.0);
  }
  return s;
}

void JobContext::report(int step, int total, double elapsed_seconds) { queue_->report(id_, step, total, elapsed_seconds); }

void JobContext::set_phase(const std::string& phase) { queue_->set_phase(id_, phase); }

JobQueue::JobQueue(JobRunner runner, int max_queued, int max_finished, JobObserver observer)
    : runner_(std::move(runner)), max_queued_(max_queued), max_finished_(max_finished), observer_(std::move(observer)) {
  // Ids stay unique across restarts of a server writing into the same folder: the start time
  // in milliseconds, then a counter (submit() also skips any id a restore brought back).
  id_prefix_ = std::to_string(static_cast<int64_t>(unix_seconds() * 1000)) + "-";
  worker_ = std::thread([this] { worker_loop(); });
}

JobQueue::~JobQueue() { shutdown(); }

std::optional<JobSnapshot> JobQueue::submit(nlohmann::json request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ || static_cast<int>(queued_.size()) >= max_queued_) {
    ++totals_.rejected_full;
    return std::nullopt;
  }
  auto job = std::make_unique<Job>();
  do {
    job->snapshot.id = id_prefix_ + std::to_string(next_id_++);
  } while (jobs_.count(job->snapshot.id) != 0);
  job->snapshot.request = std::move(request);
  job->snapshot.submitted_at = unix_seconds();
  const std::string id = job->snapshot.id;
  order_.push_back(id);
  queued_.push_back(id);
  jobs_.emplace(id, std::move(job));
  ++totals_.submitted;
  observe(*jobs_.at(id));
  wake_.notify_all();
  return snapshot_of(*jobs_.at(id));
}

int JobQueue::restore(std::vector<JobSnapshot> records) {
  std::sort(records.begin(), records.end(),
            [](const JobSnapshot& a, const JobSnapshot& b) { return a.submitted_at < b.submitted_at; });
  std::lock_guard<std::mutex> lock(mutex_);
  int queued = 0;
  for (JobSnapshot& record : records) {
    if (jobs_.count(record.id) != 0) continue;
    auto job = std::make_unique<Job>();
    if (!finished(record.state)) {
      record.state = JobState::kQueued;
      record.started_at = 0;
      record.step = record.total_steps = 0;
      record.elapsed_seconds = 0;
      record.phase.clear();
      queued_.push_back(record.id);
      ++queued;
    }
    job->snapshot = std::move(record);
    const std::string id = job->snapshot.id;
    order_.push_back(id);
    jobs_.emplace(id, std::move(job));
  }
  // Restored jobs were submitted before any of this server's, so they go first in the listing.
  std::stable_sort(order_.begin(), order_.end(), [this](const std::string& a, const std::string& b) {
    return jobs_.at(a)->snapshot.submitted_at < jobs_.at(b)->snapshot.submitted_at;
  });
  forget_old_finished();
  wake_.notify_all();
  return queued;
}

void JobQueue::observe(const Job& job) const {
  if (observer_) observer_(job.snapshot);
}

JobSnapshot JobQueue::snapshot_of(const Job& job) const {
  JobSnapshot s = job.snapshot;
  if (s.state == JobState::kQueued) {
    const auto it = std::find(queued_.begin(), queued_.end(), s.id);
    s.queue_position = static_cast<int>(it - queued_.begin()) + 1;
  }
  return s;
}

std::optional<JobSnapshot> JobQueue::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return snapshot_of(*it->second);
}

std::vector<JobSnapshot> JobQueue::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<JobSnapshot> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) out.push_back(snapshot_of(*jobs_.at(id)));
  return out;
}

Result<JobSnapshot> JobQueue::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found("no job " + quote(id));
  Job& job = *it->second;
  if (finished(job.snapshot.state)) {
    return invalid_argument("job " + id + " already " + job_state_name(job.snapshot.state));
  }
  job.cancel->store(true);
  job.cancelled_by_request = true;
  if (job.snapshot.state == JobState::kQueued) {
    queued_.erase(std::find(queued_.begin(), queued_.end(), id));
    job.snapshot.state = JobState::kCancelled;
    job.snapshot.finished_at = unix_seconds();
    job.snapshot.error = "cancelled while queued";
    observe(job);
    forget_old_finished();
    return job.snapshot;
  }
  return snapshot_of(job);  // running: the worker records the outcome when the runner returns
}

QueueMetrics JobQueue::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  QueueMetrics m = totals_;
  for (JobState s : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                     JobState::kCancelled}) {
    m.jobs[s] = 0;
  }
  for (const auto& [id, job] : jobs_) ++m.jobs[job->snapshot.state];
  return m;
}

void JobQueue::report(const std::string& id, int step, int total, double elapsed_seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  JobSnapshot& s = it->second->snapshot;
  totals_.last_step_seconds = elapsed_seconds - s.elapsed_seconds;
  totals_.steps += step - s.step;
  s.step = step;
  s.total_steps = total;
  s.elapsed_seconds = elapsed_seconds;
}

void JobQueue::set_phase(const std::string& id, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(id);
  if (it != jobs_.end()) it->second->snapshot.phase = phase;
}

void JobQueue::forget_old_finished() {
  int finished_count = 0;
  for (const auto& [id, job] : jobs_) finished_count += finished(job->snapshot.state);
  for (auto it = order_.begin(); finished_count > max_finished_ && it != order_.end();) {
    if (finished(jobs_.at(*it)->snapshot.state)) {
      jobs_.erase(*it);
      it = order_.erase(it);
      --finished_count;
    } else {
      ++it;
    }
  }
}

void JobQueue::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
    if (queued_.empty()) return;  // stopping, nothing left
    const std::string id = queued_.front();
    queued_.pop_front();
    Job& job = *jobs_.at(id);
    job.snapshot.state = JobState::kRunning;
    job.snapshot.started_at = unix_seconds();
    observe(job);
    const nlohmann::json request = job.snapshot.request;
    JobContext context(this, id, job.cancel);
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    Result<nlohmann::json> outcome = runner_(id, request, context);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    Job& done = *jobs_.at(id);  // running jobs are never forgotten
    done.snapshot.finished_at = unix_seconds();
    totals_.run_seconds += seconds;
    if (outcome.ok()) {
      done.snapshot.state = JobState::kSucceeded;
      done.snapshot.result = std::move(*outcome);
    } else {
      done.snapshot.state =
          outcome.status().code() == StatusCode::kCancelled ? JobState::kCancelled : JobState::kFailed;
      done.snapshot.error = outcome.status().to_string();
    }
    // A job the shutdown interrupted keeps its record "running", so that a restore runs it again.
    if (!(stopping_ && done.snapshot.state == JobState::kCancelled && !done.cancelled_by_request)) observe(done);
    forget_old_finished();
  }
}

void JobQueue::shutdown() {
  std::lock_guard<std::mutex> once(shutdown_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (const std::string& id : queued_) {
      Job& job = *jobs_.at(id);
      job.cancel->store(true);
      job.snapshot.state = JobState::kCancelled;
      job.snapshot.finished_at = unix_seconds();
      job.snapshot.error = "cancelled: the server shut down";
    }
    queued_.clear();
    for (auto& [id, job] : jobs_) {
      if (job->snapshot.state == JobState::kRunning) job->cancel->store(true);
    }
    wake_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace vortex::service
