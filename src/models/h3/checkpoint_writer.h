// Writing H3 checkpoints one block at a time, and layout conversion of an existing checkpoint.
//
// The released model (31B parameters, 62 GB in bf16) does not fit in the memory of the machines
// that make and convert checkpoints, so nothing here holds more than one shard of output plus one
// group of tensors: a group is the part of the schema that a layout conversion needs together
// (a block's to_q/to_k/to_v become one fused qkv_proj). Tensors are asked for group by group,
// converted to the target layout, appended to the current shard, and each shard is written as soon
// as the next tensor would take it past max_shard_bytes.
//
// Output folder (both layouts):
//   model-00001-of-0000N.safetensors ...   metadata: "config" (config JSON), "layout", "format"
//   model.safetensors.index.json           {"metadata": {"total_size": bytes}, "weight_map": {...}}
//   config.json                            the diffusers config, with "_class_name"
// It is built in `<dir>.tmp-<pid>` and renamed to `<dir>` only when complete, so a crash or an error
// never leaves a checkpoint that looks whole but is not.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "vortex/status.h"

namespace vortex::h3 {

// Hugging Face's default shard size (decimal, as `max_shard_size="5GB"`).
constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct WeightGroup {
  std::string name;               // "inputs", "token_refiner.refiner_blocks.0", ..., "outputs"
  std::vector<TensorSpec> specs;  // diffusers schema entries, in schema order
};

// The diffusers schema cut into groups, in order: input projections and time MLP ("inputs"), each
// refiner block, the refiner's final norm, each transformer block, the output head ("outputs").
std::vector<WeightGroup> schema_groups(const H3Config& config);
// The WeightGroup::name a diffusers tensor name falls in; names outside the schema land in "inputs".
std::string group_of(const std::string& diffusers_name);

struct CheckpointWriteOptions {
  CheckpointLayout layout = CheckpointLayout::kDiffusers;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;  // a larger tensor gets a shard of its own
  bool replace_existing = false;                     // otherwise a non-empty `dir` is refused
  // The linears the fp8 recipe quantizes per output channel written as its e4m3 codes and scales
  // (scaled_weights.h: quantize_linears_fp8), in either layout.
  bool quantize_fp8 = false;
  std::function<void(const std::string& line)> progress;  // one line per shard written; optional
  // Polled between groups and before each shard is written: once it is set the write stops with
  // kIoError "interrupted" and removes its temp folder (the CLI sets it on SIGINT / SIGTERM).
  const std::atomic<bool>* cancel = nullptr;
};

// Diffusers-named tensors of one group, in any order, on the host. They must be exactly the
// group's specs (names and shapes); dtypes are the source's choice and are written as given.
using GroupSource = std::function<Result<NamedTensors>(const WeightGroup& group)>;

// Writes the checkpoint described above into `dir` (created with its parents when missing).
Status write_checkpoint(const std::string& dir, const H3Config& config, const GroupSource& source,
                        const CheckpointWriteOptions& options);

// Checks the tensors of a checkpoint in either layout against the schema of `config` without
// copying data. The error is validate_against_schema's, so it names tensors by their diffusers
// names, except a fused original qkv_proj or rope.inv_freq of the wrong shape (named as stored).
Status validate_checkpoint_tensors(const NamedTensors& tensors, CheckpointLayout layout, const H3Config& config);
// The same on names and shapes alone, the quantization side tensors already left out (what a GGUF
// file's infos give without dequantizing).
Status validate_checkpoint_shapes(const NamedShapes& tensors, CheckpointLayout layout, const H3Config& config);

// Re-writes the checkpoint at `in_path` (file, index or folder; either layout) into `dir` in
// options.layout, moving bytes only: every value keeps its dtype and bits, except the fp8 weights of
// a quantized input (scaled_weights.h), written dequantized to bf16, and what options.quantize_fp8
// quantizes. The config is the one
// resolve_config finds; the input is validated against it before anything is written. `transform`,
// when given, runs on each group's diffusers-named tensors before they are written (a LoRA merge):
// the tensors it replaces are written as it leaves them.
Status convert_checkpoint(const std::string& in_path, const std::string& dir, const CheckpointWriteOptions& options,
                          const TensorTransform& transform = {});

// "61.68 GB": decimal units, for progress lines and summaries.
std::string human_bytes(uint64_t bytes);

}  // namespace vortex::h3
