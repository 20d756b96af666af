// vortex convert: re-writes a checkpoint in the other layout (bytes moved, never re-rounded; with
// --lora, the adapters merged into the weights they change), or writes the deterministic synthetic
// weights of a preset. Both stream one block at a time.
#include <csignal>
#include <cstdio>
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "formats/safetensors.h"
#include "lora_options.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/config.h"
#include "models/h3/model_source.h"
#include "models/h3/synthetic.h"

namespace vortex::cli {

namespace {

constexpr int64_t kDefaultMaxShardMb = 5000;

// Set by SIGINT / SIGTERM so that an interrupted write removes its temp folder (tens of GB for the
// h3 preset) instead of leaving it behind. The handler is one-shot: a second signal kills at once.
std::atomic<bool> g_interrupted{false};

void on_interrupt(int) { g_interrupted.store(true); }

void install_interrupt_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_interrupt;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

struct ConvertArgs {
  std::string in, out, to, preset;
  std::vector<std::string> loras;
  std::string layout = "diffusers";
  std::string dtype = "bf16";
  std::string quantize;
  bool synthetic = false;
  bool force = false;
  uint64_t seed = 0;
  int64_t max_shard_mb = kDefaultMaxShardMb;
  // Options whose presence matters, not only their value.
  CLI::Option *to_opt = nullptr, *preset_opt = nullptr, *layout_opt = nullptr, *dtype_opt = nullptr,
              *seed_opt = nullptr;
};

Result<h3::CheckpointLayout> parse_layout(const std::string& value, const std::string& flag) {
  if (value == "diffusers") return h3::CheckpointLayout::kDiffusers;
  if (value == "original") return h3::CheckpointLayout::kOriginal;
  return invalid_argument(flag + " '" + value + "': expected diffusers or original");
}

Result<DType> parse_dtype(const std::string& value) {
  if (value == "bf16") return DType::kBF16;
  if (value == "f32") return DType::kF32;
  return invalid_argument("--dtype '" + value + "': expected bf16 or f32");
}

// Checked here, before any work, so the message can point at --force; write_checkpoint refuses
// the same folder on its own.
Status check_output_folder(const std::string& out, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (force || !fs::is_directory(out, ec)) return ok_status();
  if (!fs::is_empty(out, ec)) {
    return invalid_argument(out + ": the folder exists and is not empty; pass --force to replace it");
  }
  return ok_status();
}

Status check_combination(const ConvertArgs& a) {
  if (a.synthetic == !a.in.empty()) return invalid_argument("convert: give exactly one of --in PATH and --synthetic");
  if (a.max_shard_mb <= 0) return invalid_argument("convert: --max-shard-mb must be positive");
  if (!a.in.empty()) {
    if (a.preset_opt->count() || a.layout_opt->count() || a.dtype_opt->count() || a.seed_opt->count()) {
      return invalid_argument("convert: --preset, --layout, --dtype and --seed go with --synthetic (--in keeps the "
                              "input's dtypes; choose the output layout with --to)");
    }
    if (!a.to_opt->count()) return invalid_argument("convert: --in needs --to diffusers|original");
  } else {
    if (!a.loras.empty()) return invalid_argument("convert: --lora goes with --in");
    if (a.to_opt->count()) return invalid_argument("convert: --to goes with --in; with --synthetic use --layout");
    if (!a.preset_opt->count()) return invalid_argument("convert: --synthetic needs --preset (h3, test, small, mid)");
  }
  return ok_status();
}

Status convert(const ConvertArgs& a) {
  VORTEX_RETURN_IF_ERROR(check_combination(a));
  VORTEX_RETURN_IF_ERROR(check_output_folder(a.out, a.force));
  h3::CheckpointWriteOptions options;
  options.max_shard_bytes = static_cast<uint64_t>(a.max_shard_mb) * 1'000'000;
  options.replace_existing = a.force;
  options.quantize_fp8 = a.quantize == "fp8";
  options.progress = [](const std::string& line) { std::fprintf(stderr, "vortex convert: %s\n", line.c_str()); };
  options.cancel = &g_interrupted;
  install_interrupt_handlers();
  LoraOptions loras;
  if (!a.in.empty()) {
    VORTEX_ASSIGN_OR_RETURN(options.layout, parse_layout(a.to, "--to"));
    VORTEX_ASSIGN_OR_RETURN(const h3::ModelSource in, h3::ModelSource::open(a.in));
    VORTEX_ASSIGN_OR_RETURN(const h3::H3Config config, h3::resolve_config(in));
    VORTEX_ASSIGN_OR_RETURN(loras, read_lora_options(a.loras, config));
    // A merged weight keeps the dtype the checkpoint stores its block weights in.
    const auto merge = [&loras](h3::NamedTensors& group, const h3::H3Config&) -> Status {
      for (const auto& [name, tensor] : group) {
        if (tensor.rank() == 2 && !h3::is_fp32_island(name)) {
          return h3::merge_loras(group, loras.applications(), tensor.dtype()).with_context("--lora");
        }
      }
      return h3::merge_loras(group, loras.applications(), DType::kF32).with_context("--lora");
    };
    VORTEX_RETURN_IF_ERROR(h3::convert_checkpoint(a.in, a.out, options, loras.adapters.empty() ? h3::TensorTransform() : merge));
  } else {
    VORTEX_ASSIGN_OR_RETURN(options.layout, parse_layout(a.layout, "--layout"));
    VORTEX_ASSIGN_OR_RETURN(const DType dtype, parse_dtype(a.dtype));
    VORTEX_ASSIGN_OR_RETURN(const h3::H3Config config, h3::config_preset(a.preset));
    VORTEX_RETURN_IF_ERROR(h3::write_synthetic_checkpoint(a.out, config, dtype, a.seed, options));
  }
  // Re-opened as a reader would, so the summary describes what is on disk.
  VORTEX_ASSIGN_OR_RETURN(const ShardedCheckpoint written, ShardedCheckpoint::open(a.out));
  uint64_t bytes = 0;
  for (const std::string& name : written.names()) {
    VORTEX_ASSIGN_OR_RETURN(const TensorInfo info, written.info(name));
    bytes += info.nbytes();
  }
  std::printf("wrote %s: %s layout, %zu shard%s, %zu tensors, %s\n", a.out.c_str(), h3::layout_name(options.layout),
              written.shards().size(), written.shards().size() == 1 ? "" : "s", written.names().size(),
              h3::human_bytes(bytes).c_str());
  if (options.quantize_fp8) {
    std::printf("fp8: each transformer block's to_q, to_k, to_v, ff.net.0.proj and ff.net.2%s in e4m3 with one scale "
                "per output channel (the fp8 recipe's own weights)\n",
                options.layout == h3::CheckpointLayout::kOriginal ? " (qkv_proj, mlp.fc1, mlp.fc2)" : "");
  }
  for (const auto& lora : loras.summary) {
    std::printf("merged %s at strength %g: %zu modules (%s; alpha: %s)\n", lora["path"].get<std::string>().c_str(),
                lora["strength"].get<double>(), lora["modules"].get<size_t>(), lora["format"].get<std::string>().c_str(),
                lora["alpha"].get<std::string>().c_str());
  }
  return ok_status();
}

}  // namespace

void add_convert_command(CLI::App& app, Action& action) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a checkpoint's layout bit-exactly, or write synthetic weights");
  cmd->footer(
      "Forms:\n"
      "  vortex convert --in PATH --to diffusers|original --out DIR [--lora PATH[:STRENGTH] ...]\n"
      "                 [--quantize fp8] [--max-shard-mb N] [--force]\n"
      "  vortex convert --synthetic --preset h3|test|small|mid --out DIR [--layout diffusers|original]\n"
      "                 [--dtype bf16|f32] [--seed N] [--quantize fp8] [--max-shard-mb N] [--force]\n"
      "An input with fp8 weights (a scale beside each, as LightX2V, ComfyUI and --quantize fp8 write them) is\n"
      "written with those weights dequantized to bf16, unless --quantize fp8 writes them quantized again.\n"
      "DIR receives model-0000k-of-0000N.safetensors, model.safetensors.index.json and config.json, written one\n"
      "block at a time (the h3 preset needs about 6 GB of memory) into DIR.tmp-<pid> and renamed when complete.");
  cmd->add_option("--in", a->in, "Checkpoint to convert: a .safetensors file, an index JSON, or a folder");
  cmd->add_option("--out", a->out, "Output folder; must be missing or empty unless --force")->required();
  a->to_opt = cmd->add_option("--to", a->to, "Output layout for --in: diffusers or original");
  cmd->add_option("--lora", a->loras,
                  "With --in: a LoRA adapter merged into the weights written (PATH or PATH:STRENGTH; repeat it to "
                  "stack adapters, as generate's --lora merges them); merged weights keep the checkpoint's dtype");
  cmd->add_option("--quantize", a->quantize,
                  "fp8: write each transformer block's to_q, to_k, to_v, ff.net.0.proj and ff.net.2 as the fp8 "
                  "recipe quantizes them (e4m3, one scale per output channel: 48.95 GB for the released size, 74% of bf16; in the "
                  "original layout the fused qkv_proj and mlp.fc1 rows alike); generate and serve dequantize them to "
                  "bf16, and the fp8 recipe gets back its own weights bit for bit")
      ->check(CLI::IsMember({"fp8"}));
  cmd->add_flag("--synthetic", a->synthetic, "Write synthetic weights instead of converting");
  a->preset_opt = cmd->add_option("--preset", a->preset, "Config of the synthetic weights: h3, test, small or mid");
  a->layout_opt = cmd->add_option("--layout", a->layout, "Layout of the synthetic weights: diffusers or original")
                      ->capture_default_str();
  a->dtype_opt = cmd->add_option("--dtype", a->dtype, "dtype of the synthetic weights (fp32 islands stay f32): bf16 or f32")
                     ->capture_default_str();
  a->seed_opt = cmd->add_option("--seed", a->seed, "Seed of the synthetic weights")->capture_default_str();
  cmd->add_option("--max-shard-mb", a->max_shard_mb, "Largest shard, in MB of 10^6 bytes (a larger tensor gets its own)")
      ->capture_default_str();
  cmd->add_flag("--force", a->force, "Replace a non-empty output folder (only once the new checkpoint is complete)");
  cmd->callback([a, &action] {
    action = [a] {
      const Status status = convert(*a);
      return status.ok() ? 0 : report_error(status);
    };
  });
}

}  // namespace vortex::cli
