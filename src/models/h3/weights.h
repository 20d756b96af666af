// H3 weights: the tensor schema, the two checkpoint layouts, and loading into the model's form.
//
// The diffusers layout is the schema's own naming. The original layout differs by renames and
// two transforms: QKV fused per head (`[h0: q k v, h1: q k v, ...]` rows) and `mlp.fc1` stored
// `[gate; value]` where diffusers stores `[value; gate]`; it also carries `rope.inv_freq`.
// Internally the model keeps one fused QKV weight `[q_all; k_all; v_all]` and FC1 as
// `[value; gate]`. Weights keep their checkpoint dtype on disk; at load the fp32 islands (patch
// projections, time MLP, output heads) stay F32 and everything else takes the model dtype.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "models/h3/config.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

enum class CheckpointLayout { kDiffusers, kOriginal };
const char* layout_name(CheckpointLayout layout);
// Decides from tensor names; an error names a tensor that fits neither layout.
Result<CheckpointLayout> detect_layout(const std::vector<std::string>& names);

struct TensorSpec {
  std::string name;  // diffusers name
  Shape shape;
  bool fp32_island;  // kept F32 whatever the model dtype
};
// Every tensor of the diffusers layout for `config`, in a stable order.
std::vector<TensorSpec> diffusers_schema(const H3Config& config);
bool is_fp32_island(const std::string& diffusers_name);

// The diffusers name of an original-layout tensor, by renaming alone: the fused `attn.qkv_proj` and
// `mlp.fc1` only move under the diffusers block prefix, since splitting and reordering them needs
// the data (original_to_diffusers). Lets a caller sort tensors into blocks without copying any.
std::string original_name_to_diffusers(std::string name);

// Rows of a weight as runs (first row, count), taken in order; the rows `runs` of a tensor (any
// dtype, rows = the first dim) copied into a new contiguous one.
using RowRuns = std::vector<std::pair<int64_t, int64_t>>;
int64_t row_count(const RowRuns& runs);
Tensor gather_rows(const Tensor& tensor, const RowRuns& runs);

// A model's host tensors under diffusers' names, handed out a weight at a time: what the device
// loaders read. Either tensors already named so, as they are, or an original-layout checkpoint's:
// a renamed tensor is the stored one (a view), and a fused layer's parts (QKV's q, k and v rows,
// which are interleaved per head; FC1's halves reordered) are gathered only when asked for, so a
// load holds one part's copy at a time rather than a copy of every fused layer (at the released
// size 27 GB in bf16, 7.6 GB as Q4_K). Quantized weights (scaled_weights.h) come with their side
// tensors, a fused one split still quantized (take_quantized_rows). Copies share the tensors.
class HostWeights {
 public:
  HostWeights() = default;
  HostWeights(NamedTensors diffusers);  // NOLINT(google-explicit-constructor): a model's tensors are its weights
  // The original layout's tensors; side tensors and the fused layers' rows are checked here.
  static Result<HostWeights> original(NamedTensors original, const H3Config& config);

  bool empty() const { return order_.empty(); }
  // The tensor `name` with a quantized weight's side tensors, gathered if it is a fused layer's
  // part; an empty list when there is no tensor of that name.
  Result<NamedTensors> weight(const std::string& name) const;
  // Every tensor, the parts gathered (original_to_diffusers).
  Result<NamedTensors> all() const;
  // A fused layer's part as its rows of the stored weight: for a caller that copies the rows where
  // they go without gathering them first (a quantized one through quantized_rows in
  // scaled_weights.h). Null for any other tensor.
  struct StoredRows {
    NamedTensors stored;  // the fused weight (first) and its side tensors, original names
    RowRuns runs;
    Shape shape() const;  // the part's stored shape: the fused weight's, with the part's rows
  };
  std::optional<StoredRows> stored_rows(const std::string& name) const;

 private:
  struct Entry {
    Tensor tensor;      // the stored tensor (for a part: undefined)
    std::string fused;  // for a part: the fused weight's original name, a key of fused_
    RowRuns runs;       // for a part: its rows of the fused weight
  };
  std::vector<std::string> order_;  // diffusers names in the stored order, a part in its layer's place
  std::unordered_map<std::string, Entry> by_name_;
  std::unordered_map<std::string, NamedTensors> fused_;  // a fused weight with its side tensors, original names
};

// Layout conversion. Pure renames are zero-copy; QKV and FC1 are rebuilt. Conversions are exact
// (bytes are moved, never re-rounded), so original -> diffusers -> original is bit-exact.
// original_to_diffusers is HostWeights::original(...).all(): quantized weights keep their side
// tensors, renamed with them, and a quantized QKV or FC1 is split still quantized.
Result<NamedTensors> original_to_diffusers(const NamedTensors& original, const H3Config& config);
Result<NamedTensors> diffusers_to_original(const NamedTensors& diffusers, const H3Config& config);

// All tensors of a checkpoint as zero-copy views, and the comfy_quant descriptors of a ComfyUI
// file that keeps them in its header (comfy_quant_from_header in scaled_weights.h).
Result<NamedTensors> read_all(const ShardedCheckpoint& checkpoint);

// The shape a stored weight has in the model: an NVFP4 weight, stored U8 [O, I/2] (two e2m1 codes a
// byte; scaled_weights.h), is [O, I]; every other tensor its own shape.
Shape logical_weight_shape(const Tensor& stored);

// A tensor's shape (logical_weight_shape; a weight held as GGUF blocks, by its P.ggml_type) and
// stored dtype: what the schema checks and the config inference read, so that they need no tensor
// data (a GGUF file's quantized tensors are not dequantized for them).
struct ShapeEntry {
  Shape shape;
  DType dtype = DType::kBF16;
};
using NamedShapes = std::vector<std::pair<std::string, ShapeEntry>>;
NamedShapes shapes_of(const NamedTensors& tensors);

// Where a checkpoint's config came from (resolve_config in model_source.h).
enum class ConfigSource { kConfigJson, kMetadata, kInferred };
const char* config_source_name(ConfigSource source);
// The config from the tensor shapes of either layout (eps / theta / patch from the released
// defaults; rope_freq_dim from `rope.inv_freq` when present).
Result<H3Config> infer_config(const NamedShapes& stored, CheckpointLayout layout);

// Checks names and shapes against the schema: a missing tensor, an unexpected tensor or a wrong
// shape is an error naming the tensor (and both shapes).
Status validate_against_schema(const NamedShapes& diffusers_tensors, const H3Config& config);
Status validate_against_schema(const NamedTensors& diffusers_tensors, const H3Config& config);

struct LinearWeights {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
};

struct BlockWeights {  // a transformer block, or a refiner block (no adaln)
  Tensor norm1, norm2;    // [C]
  Tensor norm_q, norm_k;  // [D]
  LinearWeights qkv;      // [3 * inner, C], rows q_all; k_all; v_all
  LinearWeights out;      // [C, inner]
  LinearWeights fc1;      // [2F, C], rows value; gate
  LinearWeights fc2;      // [C, F]
  LinearWeights adaln;    // [6 * 3 * C, TE] + bias; transformer blocks only
};

struct H3Weights {
  H3Config config;
  DType dtype = DType::kF32;  // storage dtype of everything but the fp32 islands
  LinearWeights proj_in, audio_proj_in, context_embedder;
  LinearWeights time_linear_1, time_linear_2;
  std::vector<BlockWeights> refiner;
  Tensor refiner_final_norm;
  std::vector<BlockWeights> blocks;
  Tensor norm_out_norm;
  LinearWeights norm_out_linear;  // [2C, TE]: shift then scale
  LinearWeights proj_out, audio_proj_out;
};

// Builds the model's weights from diffusers-named tensors (validated first), converting dtypes.
Result<H3Weights> assemble_weights(const NamedTensors& diffusers_tensors, const H3Config& config, DType dtype);

// Opens `path` (file, index or folder), detects the layout, resolves the config and assembles.
// `transform`, when given, runs on the diffusers-named tensors before they are assembled (LoRA merges).
using TensorTransform = std::function<Status(NamedTensors& tensors, const H3Config& config)>;
struct LoadedModel {
  H3Config config;
  CheckpointLayout layout = CheckpointLayout::kDiffusers;
  H3Weights weights;
};
Result<LoadedModel> load_model(const std::string& path, DType dtype, const TensorTransform& transform = {});

}  // namespace vortex::h3
