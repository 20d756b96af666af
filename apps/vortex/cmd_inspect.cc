// vortex inspect PATH [--json]: what a checkpoint holds, where its config comes from, and whether
// its tensors are exactly the H3 schema of that config (or what a text encoder folder or a LoRA
// adapter holds).
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "inspect_lora.h"
#include "inspect_text_encoder.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "models/h3/checkpoint_writer.h"
#include "models/h3/device_memory_plan.h"
#include "models/h3/layout.h"
#include "models/h3/model_source.h"
#include "models/h3/scaled_weights.h"
#include "models/h3/weights.h"

namespace vortex::cli {

namespace {

struct InspectArgs {
  std::string path;
  std::string model;  // a LoRA adapter is read against this checkpoint's config
  bool json = false;
};

struct DTypeTally {
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

struct Summary {
  std::string file;  // the index, safetensors or GGUF file that was opened
  h3::CheckpointLayout layout = h3::CheckpointLayout::kDiffusers;
  std::vector<std::string> shards;
  int64_t tensors = 0;
  int64_t parameters = 0;  // every tensor but rope.inv_freq (a buffer the config determines) and quantization scales
  uint64_t bytes = 0;
  std::map<std::string, DTypeTally> dtypes;
  h3::H3Config config;
  h3::ConfigSource config_source = h3::ConfigSource::kConfigJson;
  nlohmann::json cuda_memory;  // the canonical request on `--device cuda`; null when it does not apply
  h3::ScaledWeightsSummary fp8;
  int64_t gguf_quantized = -1;     // a GGUF file's tensors in ggml block types; -1: not GGUF
  std::string gguf_architecture;  // its general.architecture, when present
};

// What `generate --device cuda` would put on the device for the canonical request (768 x 1344,
// 124 frames, 100 text tokens) with this config: weights and activation arena per recipe, with
// the AdaLN tables per request that generate uses by default (device_memory_plan.h).
nlohmann::json cuda_memory_of_canonical_request(const h3::H3Config& config) {
  const Result<h3::PackedLayout> layout = h3::canonical_t2va_layout(config);
  if (!layout.ok()) return nullptr;
  const h3::VideoGeometry video;
  nlohmann::json out = {{"request", {{"height", video.height}, {"width", video.width}, {"frames", video.num_frames},
                                     {"text_tokens", h3::kCanonicalTextTokens}, {"rows", layout->num_rows}}},
                        {"adaln_tables", "request"}};
  for (auto [name, recipe] : {std::pair{"bf16", h3::LinearRecipe::kBf16}, std::pair{"fp8", h3::LinearRecipe::kFp8}}) {
    if (recipe == h3::LinearRecipe::kFp8) {
      const Status fp8 = h3::check_cuda_fp8_widths(config);
      if (!fp8.ok()) {
        out[name] = {{"unavailable", fp8.message()}};
        continue;
      }
    }
    out[name] = {{"weights_bytes", h3::device_weight_bytes(config, recipe, false)},
                 {"activations_bytes", h3::plan_activations(config, layout->num_rows, recipe, false, true).total}};
  }
  return out;
}

// Fails with the first problem: unreadable files, an unknown layout, no usable config, or tensors
// that do not match the config's schema.
Result<Summary> summarize(const std::string& path) {
  VORTEX_ASSIGN_OR_RETURN(const h3::ModelSource checkpoint, h3::ModelSource::open(path));
  Summary s;
  s.file = checkpoint.safetensors() ? checkpoint.safetensors()->path() : checkpoint.path();
  const Result<h3::CheckpointLayout> layout = h3::detect_layout(checkpoint.names());
  if (!layout.ok()) return layout.status().with_context(path);
  s.layout = *layout;
  Result<h3::H3Config> config = h3::resolve_config(checkpoint, &s.config_source);
  if (!config.ok()) {
    // The other sources already name the file they read.
    return s.config_source == h3::ConfigSource::kInferred ? config.status().with_context(path) : config.status();
  }
  s.config = *config;
  const auto tally = [&s](const std::string& dtype, uint64_t bytes) {
    DTypeTally& t = s.dtypes[dtype];
    ++t.tensors;
    t.bytes += bytes;
    ++s.tensors;
    s.bytes += bytes;
  };
  if (const ShardedCheckpoint* st = checkpoint.safetensors()) {
    for (const SafetensorsFile& shard : st->shards()) s.shards.push_back(shard.path());
    for (const std::string& name : st->names()) {
      VORTEX_ASSIGN_OR_RETURN(const TensorInfo info, st->info(name));
      tally(dtype_name(info.dtype), info.nbytes());
    }
  } else {
    const GgufFile& gguf = *checkpoint.gguf();
    s.shards.push_back(gguf.path());
    s.gguf_quantized = 0;
    for (const GgufTensorInfo& info : gguf.tensors()) {
      tally(ggml_type_name(info.ggml_type), info.nbytes);
      if (!ggml_type_is_float(info.ggml_type)) ++s.gguf_quantized;
    }
    if (auto it = gguf.metadata().find("general.architecture"); it != gguf.metadata().end()) {
      if (it->second.kind == GgufValue::Kind::kString) s.gguf_architecture = std::get<std::string>(it->second.scalar);
    }
  }
  for (const auto& [name, entry] : checkpoint.shapes()) {
    if (name != "rope.inv_freq" && !h3::is_quantization_side_tensor(name)) s.parameters += entry.shape.numel();
  }
  s.cuda_memory = cuda_memory_of_canonical_request(s.config);
  const Status valid = h3::validate_model_source(checkpoint, s.layout, s.config);
  if (!valid.ok()) {
    return valid.with_context(path + " (" + h3::layout_name(s.layout) + " layout, config from " +
                              h3::config_source_name(s.config_source) + ")");
  }
  if (checkpoint.safetensors()) {
    VORTEX_ASSIGN_OR_RETURN(const h3::NamedTensors tensors, checkpoint.tensors());
    VORTEX_ASSIGN_OR_RETURN(s.fp8, h3::check_scaled_weights(tensors));
  }
  return s;
}

// 31007456256 -> "31,007,456,256"
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_text(const Summary& s) {
  std::printf("checkpoint  %s\n", s.file.c_str());
  std::printf("layout      %s\n", h3::layout_name(s.layout));
  std::printf("shards      %zu\n", s.shards.size());
  std::printf("tensors     %lld\n", static_cast<long long>(s.tensors));
  for (const auto& [dtype, tally] : s.dtypes) {
    std::printf("  %-8s  %lld tensors, %s\n", dtype.c_str(), static_cast<long long>(tally.tensors),
                h3::human_bytes(tally.bytes).c_str());
  }
  std::printf("parameters  %s\n", with_commas(s.parameters).c_str());
  std::printf("bytes       %s (%s)\n", with_commas(static_cast<int64_t>(s.bytes)).c_str(),
              h3::human_bytes(s.bytes).c_str());
  std::printf("config      from %s: %s\n", h3::config_source_name(s.config_source), s.config.to_json_string().c_str());
  std::printf("schema      ok: every tensor of the config's schema, with its shape, and nothing else\n");
  if (s.fp8.fp8_weights > 0) {
    std::printf("fp8         %lld weights (%lld with one scale per output channel, %lld with one per tensor, %lld "
                "without); generate and serve dequantize them to bf16\n",
                static_cast<long long>(s.fp8.fp8_weights), static_cast<long long>(s.fp8.per_channel),
                static_cast<long long>(s.fp8.per_tensor),
                static_cast<long long>(s.fp8.fp8_weights - s.fp8.per_channel - s.fp8.per_tensor));
  }
  if (s.fp8.nvfp4_weights > 0) {
    std::printf("nvfp4       %lld weights (%lld with block scales in cuBLAS's tiled layout, %lld row-major); generate "
                "and serve dequantize them to bf16\n",
                static_cast<long long>(s.fp8.nvfp4_weights), static_cast<long long>(s.fp8.nvfp4_tiled),
                static_cast<long long>(s.fp8.nvfp4_weights - s.fp8.nvfp4_tiled));
  }
  if (s.gguf_quantized >= 0) {
    std::printf("gguf        %lld tensors in ggml block types%s; dequantized to bf16 (fp32 islands to f32) as each "
                "weight loads (generate and serve under --device cuda: on the GPU), by convert a block at a time\n",
                static_cast<long long>(s.gguf_quantized),
                s.gguf_architecture.empty() ? "" : (", architecture '" + s.gguf_architecture + "'").c_str());
  }
  if (!s.cuda_memory.is_null()) {
    const auto recipe = [&](const char* name) {
      const nlohmann::json& r = s.cuda_memory[name];
      if (r.contains("unavailable")) return std::string(name) + " n/a (" + r["unavailable"].get<std::string>() + ")";
      return std::string(name) + " " + h3::human_bytes(r["weights_bytes"].get<uint64_t>()) + " weights + " +
             h3::human_bytes(r["activations_bytes"].get<uint64_t>()) + " activations";
    };
    std::printf("cuda memory 768x1344, 124 frames, 100 text tokens (%s rows; AdaLN tables per request): %s; %s\n",
                with_commas(s.cuda_memory["request"]["rows"].get<int64_t>()).c_str(), recipe("bf16").c_str(),
                recipe("fp8").c_str());
  }
}

void print_json(const Summary& s) {
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [dtype, tally] : s.dtypes) dtypes[dtype] = {{"tensors", tally.tensors}, {"bytes", tally.bytes}};
  const nlohmann::json out = {
      {"checkpoint", s.file},
      {"layout", h3::layout_name(s.layout)},
      {"shards", s.shards.size()},
      {"files", s.shards},
      {"tensors", s.tensors},
      {"dtypes", dtypes},
      {"parameters", s.parameters},
      {"bytes", s.bytes},
      {"config", s.config.to_json()},
      {"config_source", h3::config_source_name(s.config_source)},
      {"schema", "ok"},
      {"cuda_memory", s.cuda_memory},
      {"fp8_weights", {{"weights", s.fp8.fp8_weights},
                       {"per_channel_scales", s.fp8.per_channel},
                       {"per_tensor_scales", s.fp8.per_tensor},
                       {"side_tensors_read_past", s.fp8.side_tensors_read_past}}},
      {"nvfp4_weights", {{"weights", s.fp8.nvfp4_weights}, {"tiled_block_scales", s.fp8.nvfp4_tiled}}},
      {"gguf", s.gguf_quantized < 0 ? nlohmann::json(nullptr)
                                    : nlohmann::json{{"quantized_tensors", s.gguf_quantized},
                                                     {"architecture", s.gguf_architecture}}},
  };
  std::printf("%s\n", out.dump(2).c_str());
}

int run_inspect(const InspectArgs& args) {
  if (is_text_encoder_checkpoint(args.path)) return inspect_text_encoder(args.path, args.json);
  if (is_lora_file(args.path)) return inspect_lora(args.path, args.model, args.json);
  if (!args.model.empty()) return report_error(invalid_argument("--model goes with a LoRA adapter's file"));
  const Result<Summary> summary = summarize(args.path);
  if (!summary.ok()) return report_error(summary.status());
  if (args.json) {
    print_json(*summary);
  } else {
    print_text(*summary);
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a checkpoint (or a text encoder) and check it against its schema");
  cmd->footer(
      "Prints the layout, shards, tensors, dtypes (count and bytes), parameters, total bytes, and the config with\n"
      "its source (config.json, safetensors metadata, or inferred from tensor shapes), and the device memory\n"
      "`generate --device cuda` would take for the canonical request in each recipe. Exits 2 with one line\n"
      "naming the first tensor that is missing, unexpected, or of the wrong shape for that config. fp8 and NVFP4\n"
      "weights (scales beside each, as LightX2V, ComfyUI, ModelOpt or convert --quantize fp8 write them) are\n"
      "counted. A Qwen3-VL text encoder folder (what --text-encoder takes) is described instead: its widths, the\n"
      "layers H3 reads, their bytes on the host and on --device cuda, and whether tokenizer.json is beside it. A\n"
      "LoRA adapter file is read as generate --lora reads it, against the checkpoint --model names (default: the\n"
      "released config): its layout, partition, where its scales come from, and its modules by kind, rank and\n"
      "scale.");
  cmd->add_option("path", args->path, "A .safetensors file, a *.safetensors.index.json, or a folder holding one")
      ->required();
  cmd->add_flag("--json", args->json, "Print one JSON object instead of text");
  cmd->add_option("--model", args->model, "For a LoRA adapter: the checkpoint whose config it is read against");
  cmd->callback([args, &action] { action = [args] { return run_inspect(*args); }; });
}

}  // namespace vortex::cli
