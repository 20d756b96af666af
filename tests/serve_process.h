// `vortex serve` as a child process for the tests: started on a free port with synthetic weights,
// driven over HTTP, stopped with SIGTERM; and the few HTTP helpers the served tests share.
#pragma once

#if defined(VORTEX_HAVE_SERVICE)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "safetensors_test_util.h"
#include "vortex/tensor.h"

extern char** environ;

namespace vortex::test_util {

// `vortex serve --synthetic PRESET --port 0 --results DIR/results [extra]` as a child process.
class ServeProcess {
 public:
  // `results`: the folder (another server's, for a restart), or empty for one of its own.
  explicit ServeProcess(const std::vector<std::string>& extra = {}, const std::string& preset = "test",
                        const std::string& results = "")
      : results_(results.empty() ? (dir_.path() / "results").string() : results) {
    std::vector<std::string> args = {VORTEX_CLI_PATH, "serve", "--synthetic", preset, "--port", "0",
                                     "--results",     results_};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, dir_.file("stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, dir_.file("stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int spawned = posix_spawn(&pid_, argv[0], &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    if (spawned != 0) {
      ADD_FAILURE() << "cannot start " << argv[0];
      return;
    }
    // The port is on the first stdout line once the model is loaded and the socket bound.
    const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string out = test_util::read_bytes(dir_.file("stdout"));
      if (std::regex_search(out, m, listening)) port_ = std::stoi(m[1]);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (port_ == 0) ADD_FAILURE() << "the server did not start: " << test_util::read_bytes(dir_.file("stderr"));
  }
  ~ServeProcess() {
    if (pid_ > 0) stop();
  }
  // SIGTERM, then the exit code (-1 unless it exited normally within 60 s).
  int stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 6000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return -1;
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  const std::string& results() const { return results_; }
  std::string log() const { return test_util::read_bytes(dir_.file("stderr")); }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  std::string results_;
  pid_t pid_ = 0;
  int port_ = 0;
};

inline nlohmann::json json_of(const httplib::Result& r) {
  if (!r) return {{"transport_error", httplib::to_string(r.error())}};
  return nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
}

inline httplib::Result post_json(httplib::Client& c, const std::string& body) {
  return c.Post("/v1/jobs", body, "application/json");
}

// Polls the job until it reaches `state` (`seconds` at most) and returns its last JSON.
inline nlohmann::json wait_for_state(httplib::Client& c, const std::string& id, const std::string& state,
                                     int seconds = 60) {
  nlohmann::json job;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    job = json_of(c.Get("/v1/jobs/" + id));
    if (job.value("state", "") == state) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "job " << id << " did not reach " << state << ": " << job.dump();
  return job;
}

// POSTs `body` as JSON and expects a 400 whose error contains `needle`.
inline void expect_bad_request(httplib::Client& c, const std::string& body, const std::string& needle) {
  SCOPED_TRACE(body);
  const httplib::Result r = post_json(c, body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const std::string error = json_of(r).value("error", "");
  EXPECT_NE(error.find(needle), std::string::npos) << r->body;
  EXPECT_EQ(error.find('\n'), std::string::npos) << r->body;  // one line, whatever the request held
}

// A rank-2 LoRA adapter in diffusers names: each target linear with its [out, in]; `seed` shifts
// the factors' values.
inline void write_lora(const std::string& path, const std::vector<std::tuple<std::string, int64_t, int64_t>>& linears,
                float seed) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [target, out, in] : linears) {
    std::vector<float> down(static_cast<size_t>(2 * in)), up(static_cast<size_t>(out * 2));
    for (size_t i = 0; i < down.size(); ++i) down[i] = 0.05f * static_cast<float>((i * 3 + 1) % 7) - seed;
    for (size_t i = 0; i < up.size(); ++i) up[i] = 0.03f * static_cast<float>(i % 5) - 0.5f * seed;
    tensors.emplace_back("transformer." + target + ".lora_A.weight", Tensor::from_f32(down, {2, in}));
    tensors.emplace_back("transformer." + target + ".lora_B.weight", Tensor::from_f32(up, {out, 2}));
  }
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
}

}  // namespace vortex::test_util

#endif  // VORTEX_HAVE_SERVICE
