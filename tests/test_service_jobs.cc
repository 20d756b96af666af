// The serve command's job queue (service/job_queue.h) with stand-in runners: order, one job at a
// time, progress, the queue's bound, cancelling queued and running jobs, failures, shutdown and
// forgetting old finished jobs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/job_queue.h"

namespace vortex::service {
namespace {

using namespace std::chrono_literals;

// Polls until `done` holds (the worker is another thread); fails the test after 20 s.
void wait_for(const std::function<bool()>& done, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out waiting for " << what;
    std::this_thread::sleep_for(1ms);
  }
}

JobState state_of(const JobQueue& q, const std::string& id) { return q.get(id).value().state; }

// A runner whose jobs block until released (or cancelled), recording the order they ran in.
struct GatedRunner {
  std::mutex mutex;
  std::vector<int> ran;
  std::atomic<int> running{0}, max_running{0};
  std::atomic<bool> release{false};

  JobRunner runner() {
    return [this](const std::string&, const nlohmann::json& request, JobContext& context) -> Result<nlohmann::json> {
      max_running = std::max(max_running.load(), ++running);
      context.set_phase("work");
      {
        std::lock_guard<std::mutex> lock(mutex);
        ran.push_back(request.at("n"));
      }
      for (int step = 1; !release.load(); ++step) {
        if (context.cancel_requested()) {
          --running;
          return cancelled("stopped at step " + std::to_string(step));
        }
        context.report(step, 1000, 0.001 * step);
        std::this_thread::sleep_for(1ms);
      }
      --running;
      if (request.value("fail", false)) return invalid_argument("job " + std::to_string(request.at("n").get<int>()) + " failed");
      return nlohmann::json{{"n", request.at("n")}};
    };
  }
};

TEST(ServiceJobs, RunInSubmissionOrderOneAtATime) {
  GatedRunner gate;
  gate.release = true;
  JobQueue q(gate.runner(), 16);
  std::vector<std::string> ids;
  for (int n = 0; n < 5; ++n) ids.push_back(q.submit({{"n", n}})->id);
  for (const std::string& id : ids) wait_for([&] { return state_of(q, id) == JobState::kSucceeded; }, id);
  EXPECT_EQ(gate.ran, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(gate.max_running.load(), 1);
  const JobSnapshot last = *q.get(ids[4]);
  EXPECT_EQ(last.result, (nlohmann::json{{"n", 4}}));
  EXPECT_GT(last.finished_at, 0);
  EXPECT_GE(last.finished_at, last.started_at);
  EXPECT_EQ(q.list().size(), 5u);
  EXPECT_EQ(q.metrics().jobs.at(JobState::kSucceeded), 5);
  EXPECT_EQ(q.metrics().submitted, 5);
  // Ids are distinct and the JSON form names the state.
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(last.to_json().at("state"), "succeeded");
}

TEST(ServiceJobs, ProgressQueuePositionsAndTheBound) {
  GatedRunner gate;
  JobQueue q(gate.runner(), 2);
  const JobSnapshot a = *q.submit({{"n", 0}});
  wait_for([&] { return q.get(a.id)->step > 0; }, "the first job's progress");
  const JobSnapshot running = *q.get(a.id);
  EXPECT_EQ(running.state, JobState::kRunning);
  EXPECT_EQ(running.total_steps, 1000);
  EXPECT_TRUE(running.to_json().at("progress").contains("eta_seconds"));
  EXPECT_EQ(running.to_json().value("phase", ""), "work");
  const JobSnapshot b = *q.submit({{"n", 1}});
  const JobSnapshot c = *q.submit({{"n", 2}});
  EXPECT_EQ(b.queue_position, 1);
  EXPECT_EQ(c.queue_position, 2);
  EXPECT_FALSE(q.submit({{"n", 3}}).has_value()) << "two jobs wait already";
  EXPECT_EQ(q.metrics().rejected_full, 1);
  gate.release = true;
  wait_for([&] { return state_of(q, c.id) == JobState::kSucceeded; }, "the last job");
  EXPECT_GT(q.metrics().steps, 0);
}

TEST(ServiceJobs, CancelQueuedAndRunningJobs) {
  GatedRunner gate;
  JobQueue q(gate.runner(), 4);
  const std::string a = q.submit({{"n", 0}})->id;
  const std::string b = q.submit({{"n", 1}})->id;
  wait_for([&] { return state_of(q, a) == JobState::kRunning; }, "the first job to start");

  auto queued = q.cancel(b);
  ASSERT_TRUE(queued.ok()) << queued.status().to_string();
  EXPECT_EQ(queued->state, JobState::kCancelled);
  EXPECT_EQ(queued->error, "cancelled while queued");

  ASSERT_TRUE(q.cancel(a).ok());
  wait_for([&] { return state_of(q, a) == JobState::kCancelled; }, "the running job to stop");
  EXPECT_NE(q.get(a)->error.find("stopped at step"), std::string::npos) << q.get(a)->error;
  EXPECT_EQ(gate.ran, (std::vector<int>{0})) << "the cancelled queued job never ran";

  EXPECT_EQ(q.cancel(a).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.cancel("no-such-job").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(q.get("no-such-job").has_value());
}

TEST(ServiceJobs, AFailureIsRecordedAndTheNextJobRuns) {
  GatedRunner gate;
  gate.release = true;
  JobQueue q(gate.runner(), 4);
  const std::string bad = q.submit({{"n", 0}, {"fail", true}})->id;
  const std::string good = q.submit({{"n", 1}})->id;
  wait_for([&] { return state_of(q, good) == JobState::kSucceeded; }, "the job after the failure");
  const JobSnapshot failed = *q.get(bad);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.error, "invalid argument: job 0 failed");
  EXPECT_EQ(failed.to_json().at("error"), "invalid argument: job 0 failed");
}

TEST(ServiceJobs, ShutdownCancelsWhatWaitsAndStopsTheRunningJob) {
  GatedRunner gate;
  JobQueue q(gate.runner(), 4);
  const std::string a = q.submit({{"n", 0}})->id;
  const std::string b = q.submit({{"n", 1}})->id;
  wait_for([&] { return state_of(q, a) == JobState::kRunning; }, "the first job to start");
  q.shutdown();
  EXPECT_EQ(state_of(q, a), JobState::kCancelled);
  EXPECT_EQ(state_of(q, b), JobState::kCancelled);
  EXPECT_FALSE(q.submit({{"n", 2}}).has_value()) << "a stopped queue takes nothing";
  q.shutdown();  // idempotent
}

TEST(ServiceJobs, OldFinishedJobsAreForgotten) {
  GatedRunner gate;
  gate.release = true;
  JobQueue q(gate.runner(), 16, /*max_finished=*/2);
  std::vector<std::string> ids;
  for (int n = 0; n < 4; ++n) {
    ids.push_back(q.submit({{"n", n}})->id);
    wait_for([&] { return q.get(ids.back()) && state_of(q, ids.back()) == JobState::kSucceeded; }, ids.back());
  }
  EXPECT_FALSE(q.get(ids[0]).has_value());
  EXPECT_FALSE(q.get(ids[1]).has_value());
  EXPECT_TRUE(q.get(ids[3]).has_value());
  EXPECT_EQ(q.list().size(), 2u);
}

TEST(ServiceJobs, RecordsLetARestoredQueueRunWhatAShutdownInterrupted) {
  std::mutex mutex;
  std::map<std::string, JobSnapshot> records;  // the last state the observer saw, per job
  const JobObserver record = [&](const JobSnapshot& job) {
    std::lock_guard<std::mutex> lock(mutex);
    records[job.id] = job;
  };
  std::string done, interrupted, waiting, withdrawn;
  {
    GatedRunner gate;
    gate.release = true;
    JobQueue q(gate.runner(), 8, 1000, record);
    done = q.submit({{"n", 0}})->id;
    wait_for([&] { return state_of(q, done) == JobState::kSucceeded; }, "the first job");
    gate.release = false;
    interrupted = q.submit({{"n", 1}})->id;
    waiting = q.submit({{"n", 2}})->id;
    withdrawn = q.submit({{"n", 3}})->id;
    ASSERT_TRUE(q.cancel(withdrawn).ok());
    wait_for([&] { return state_of(q, interrupted) == JobState::kRunning; }, "the second job to start");
    q.shutdown();
  }
  std::vector<JobSnapshot> saved;
  for (const auto& [id, job] : records) {
    Result<JobSnapshot> back = JobSnapshot::from_json(nlohmann::json::parse(job.to_json().dump()));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    saved.push_back(*back);
  }
  EXPECT_EQ(records.at(done).state, JobState::kSucceeded);
  EXPECT_EQ(records.at(interrupted).state, JobState::kRunning) << "a shutdown leaves the record as it was";
  EXPECT_EQ(records.at(waiting).state, JobState::kQueued);
  EXPECT_EQ(records.at(withdrawn).state, JobState::kCancelled);

  GatedRunner gate;
  gate.release = true;
  JobQueue q(gate.runner(), 8);
  EXPECT_EQ(q.restore(saved), 2);
  wait_for([&] { return state_of(q, waiting) == JobState::kSucceeded; }, "the restored jobs");
  EXPECT_EQ(gate.ran, (std::vector<int>{1, 2})) << "in submission order; finished jobs are not run again";
  EXPECT_EQ(q.get(done)->result, (nlohmann::json{{"n", 0}}));
  EXPECT_EQ(state_of(q, withdrawn), JobState::kCancelled);
  EXPECT_EQ(q.list().front().id, done);
  EXPECT_EQ(q.restore(saved), 0) << "ids already held are skipped";
  const std::string fresh = q.submit({{"n", 4}})->id;
  EXPECT_EQ(q.list().size(), 5u);
  EXPECT_EQ(q.list().back().id, fresh);

  EXPECT_EQ(JobSnapshot::from_json({{"id", "x"}}).status().code(), StatusCode::kCorruptData);
  EXPECT_EQ(JobSnapshot::from_json({{"id", "x"}, {"state", "paused"}, {"request", nlohmann::json::object()},
                                    {"submitted_at", 1.0}})
                .status()
                .code(),
            StatusCode::kCorruptData);
}

}  // namespace
}  // namespace vortex::service
