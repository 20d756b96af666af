// vortex bench: timed workloads on the GPU with run manifests (DESIGN section 4).
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "formats/safetensors.h"
#if defined(VORTEX_HAVE_CUDA)
#include "bench/cuda_workloads.h"
#include "cuda/runtime.h"
#endif

namespace vortex::cli {

namespace {

struct BenchArgs {
  std::string workload;
  int warmup = 3;
  int repetitions = 10;
  uint64_t seed = 0;
  std::string out_dir;
  std::string json_path;
  std::string peer;
  std::string work_dir = "/tmp/vortex-bench";
  std::string commit = "unknown";
};

// Where the manifests go, checked before any GPU time is spent (nothing is created here):
// --json's folder must exist, and --json-dir must be a folder or not exist yet.
Status check_outputs(const BenchArgs& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!args.json_path.empty()) {
    const fs::path folder = fs::path(args.json_path).parent_path();
    if (!folder.empty() && !fs::is_directory(folder, ec)) {
      return invalid_argument("--json " + args.json_path + ": the folder " + folder.string() + " does not exist");
    }
  }
  if (!args.out_dir.empty() && fs::exists(args.out_dir, ec) && !fs::is_directory(args.out_dir, ec)) {
    return invalid_argument("--json-dir " + args.out_dir + ": exists and is not a folder");
  }
  return ok_status();
}

int run_bench(const BenchArgs& args) {
  if (Status outputs = check_outputs(args); !outputs.ok()) return report_error(outputs);
#if defined(VORTEX_HAVE_CUDA)
  if (Status usable = cuda::require_hopper_device("vortex bench"); !usable.ok()) return report_error(usable);
  bench::BenchOptions options;
  options.workload = args.workload;
  options.warmup = args.warmup;
  options.repetitions = args.repetitions;
  options.seed = args.seed;
  options.peer_command = args.peer;
  options.work_dir = args.work_dir;
  options.git_commit = args.commit;
  const bool vae = args.workload.rfind("vae-", 0) == 0;
  auto manifests = vae                                ? bench::run_vae_workload(options)
                   : args.workload == "text-encode"   ? bench::run_text_workload(options)
                   : args.workload == "vision-encode" ? bench::run_vision_workload(options)
                   : args.workload == "lora-merge"    ? bench::run_lora_workload(options)
                   : args.workload == "weight-load"   ? bench::run_load_workload(options)
                                                      : bench::run_cuda_workload(options);
  if (!manifests.ok()) return report_error(manifests.status());
  std::printf("%-14s %10s %10s %10s %9s  %s\n", "workload", "median ms", "min ms", "max ms", "TFLOP/s", "peers (ratio peer/vortex)");
  bool all_passed = true;
  for (const auto& m : *manifests) {
    std::string peers;
    for (const auto& p : m.peers) {
      char buffer[128];
      std::snprintf(buffer, sizeof(buffer), "%s %.2f ms (%.2fx)  ", p.value("name", "?").c_str(),
                    p.value("median_ms", 0.0), p.value("ratio_peer_over_vortex", 0.0));
      peers += buffer;
    }
    // TFLOP/s where the workload states its FLOPs (whole-model workloads state them per block).
    char tflops[16] = "-";
    if (m.derived.contains("tflops")) std::snprintf(tflops, sizeof(tflops), "%.1f", m.derived["tflops"].get<double>());
    std::printf("%-14s %10.3f %10.3f %10.3f %9s  %s\n", m.workload.c_str(), m.samples.median(), m.samples.min(),
                m.samples.max(), tflops, peers.c_str());
    std::printf("  correctness: %s rel-L2 %.3e (bound %.2g) %s\n", m.correctness.comparator.c_str(),
                m.correctness.rel_l2, m.correctness.bound, m.correctness.passed ? "passed" : "NOT PASSED");
    all_passed = all_passed && m.correctness.passed;
    if (!args.out_dir.empty()) {
      std::error_code ec;
      if (!std::filesystem::create_directories(args.out_dir, ec) && ec) {
        return report_error(io_error("--json-dir " + args.out_dir + ": cannot create the folder: " + ec.message()));
      }
      const std::string path = args.out_dir + "/" + m.workload + ".json";
      Status s = write_file_atomically(path, m.to_json().dump(2) + "\n");
      if (!s.ok()) return report_error(s);
      std::printf("  manifest: %s\n", path.c_str());
    }
  }
  if (!args.json_path.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& m : *manifests) all.push_back(m.to_json());
    Status s = write_file_atomically(args.json_path, (all.size() == 1 ? all[0] : all).dump(2) + "\n");
    if (!s.ok()) return report_error(s);
    std::printf("  manifest: %s\n", args.json_path.c_str());
  }
  return all_passed ? 0 : 3;
#else
  return report_error(unimplemented("vortex bench needs the CUDA backend; this build has none"));
#endif
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time a workload on the GPU and write run manifests");
  cmd->add_option("workload", args->workload, "h3-block | h3-forward | h3-denoise | h3-denoise-sp | gemm | attention | vae-decode | vae-encode | text-encode | "
                  "vision-encode | lora-merge | weight-load; vae-encode-keyframe, vae-encode-clip or vae-encode-audio runs one item of vae-encode, "
                  "vae-encode-video a 22-frame (two-clip) video reference")
      ->required()
      ->check(CLI::IsMember({"h3-block", "h3-forward", "h3-denoise", "h3-denoise-sp", "gemm", "attention", "vae-decode",
                              "vae-encode", "vae-encode-keyframe", "vae-encode-clip", "vae-encode-audio",
                              "vae-encode-video", "text-encode", "vision-encode", "lora-merge", "weight-load"}));
  cmd->add_option("--warmup", args->warmup, "Untimed repetitions first (>= 3)")->capture_default_str();
  cmd->add_option("--reps", args->repetitions, "Timed repetitions (>= 10); the median is primary")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the synthetic weights and inputs")->capture_default_str();
  cmd->add_option("--json", args->json_path, "Write the manifest here (an array when a workload measures several items)");
  cmd->add_option("--json-dir", args->out_dir, "Write one manifest per measured item into this folder");
  cmd->add_option("--peer", args->peer, "Peer command run in the same call (e.g. 'python3 bench/peers/pytorch_h3.py')");
  cmd->add_option("--work-dir", args->work_dir, "Scratch folder for the dumps the peer reads")->capture_default_str();
  cmd->add_option("--commit", args->commit, "Git commit recorded in the manifest");
  cmd->callback([args, &action] { action = [args] { return run_bench(*args); }; });
}

}  // namespace vortex::cli
