// The vortex binary run as a user runs it, for the tests: exit code and captured output, and the
// check that an error is one line naming the problem.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "safetensors_test_util.h"

namespace vortex::test_util {

struct CliRun {
  int code = -1;
  std::string out, err;
};

// Runs `vortex <args>` (args already shell-quoted) with stdout and stderr captured in files;
// `env`, when given, is a list of NAME=value settings for the run.
inline CliRun run_cli(const std::string& args, const std::string& env = "") {
  static TempDir capture;
  const std::string out = capture.file("stdout"), err = capture.file("stderr");
  const std::string command = (env.empty() ? "" : "env " + env + " ") + std::string(VORTEX_CLI_PATH) + " " + args +
                              " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  CliRun run;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = test_util::read_bytes(out);
  run.err = test_util::read_bytes(err);
  return run;
}

inline std::string q(const std::string& s) { return "'" + s + "'"; }

// Exit code `code` (2: bad input; 1: a valid request this machine cannot serve) and exactly one
// stderr line that contains `needle`.
inline void expect_one_line_error(const CliRun& run, const std::string& needle, int code = 2) {
  EXPECT_EQ(run.code, code) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_TRUE(run.err.starts_with("vortex: ")) << run.err;
  EXPECT_NE(run.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << run.err;
}

// The "video latents ..." and "audio latents ..." checksum lines of a generate run's stdout (or
// what is missing), for comparing runs that must give the same bits.
inline std::string latent_checksum_lines(const CliRun& run) {
  std::string lines;
  for (const char* latents : {"video latents", "audio latents"}) {
    const size_t at = run.out.find(latents);
    if (at == std::string::npos) return "no '" + std::string(latents) + "' in: " + run.out;
    lines += run.out.substr(at, run.out.find('\n', at) - at) + "\n";
  }
  return lines;
}

}  // namespace vortex::test_util
