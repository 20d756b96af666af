// LoRA adapters for the H3 transformer: read in every layout that circulates, merged into the
// weights at load.
//
// A LoRA module adds strength * scale * (B · A) to one linear's weight [out, in], with A ("down",
// lora_A) [rank, in] and B ("up", lora_B) [out, rank]. read_lora() reads a file into modules named by
// the diffusers layout's linears, as diffusers' MiniMaxH3LoraLoaderMixin.lora_state_dict converts it
// (tests/golden/h3_lora holds its results for each layout):
//   - diffusers names under `transformer.` or `transformer_ref.` (one partition a file), or bare;
//     a peft dump (`.lora_A.default.weight`, no prefix);
//   - the original checkpoint's names, optionally under `diffusion_model.` (ai-toolkit, ComfyUI):
//     the fused `attn.qkv_proj` is split into to_q / to_k / to_v (A shared, B in thirds), `mlp.fc1`'s
//     B halves are swapped from [gate; value] to [value; gate]; kohya's lora_down / lora_up;
//     musubi-tuner's flattened `lora_unet_blocks_0_attn_qkv_proj`; DiffSynth-Studio's peft infix over
//     the raw per-head-interleaved QKV (de-interleaved at the config's head width).
// The scale is alpha / rank: per-module `.alpha` tensors; else the `lora_adapter_metadata` JSON that
// diffusers' save_lora_weights writes (peft's r, lora_alpha, rank_pattern, alpha_pattern, use_rslora:
// alpha / sqrt(rank)); else a network `alpha` in `__metadata__`; else 1 (alpha == rank, the
// convention of the published alpha-less H3 LoRAs). Under diffusers' names peft's DoRA magnitudes
// (`lora_magnitude_vector`) and `lora_B` biases are read too (a bias only on a linear that has one,
// and not in a DoRA file: peft refuses lora_bias with use_dora); the original layouts refuse them,
// as diffusers' converter does. kohya's DoRA (`dora_scale`) is refused by name (diffusers drops
// those tensors and loads the rest, which is not the adapter as trained).
//
// merge_loras() folds modules into the weights in fp32 and rounds once to the tensor's storage dtype
// (fp32 islands stay F32): W' = round(W + s_1·Δ_1 + s_2·Δ_2 + ...), one adapter after another, each
// s·Δ[o, i] rounded from one fp32 chain over the rank in order (every product and sum rounded: no
// FMA) times s = strength · scale. A DoRA module does what
// peft's unmerged forward does: with f = m / ‖W + s·Δ‖ per output row (W the unmerged weight), the
// sum so far becomes f · (sum + s·Δ), so it also scales the adapters before it. A lora_B bias b adds
// s·b to the linear's bias, scaled likewise by a later DoRA module's f. The bits do not depend on the
// thread count or the BLAS. Merged weights cost the same memory as the weights they replace (a
// checkpoint's are otherwise mapped, not copied); nothing is added to a forward's time. On a GPU the
// same bits can be merged on the device (models/h3/cuda_lora_merge.h, VORTEX_VARIANT_LORA_MERGE).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/h3/config.h"
#include "models/h3/weights.h"
#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::h3 {

struct LoraModule {
  std::string target;  // the diffusers linear, e.g. "transformer_blocks.3.attn.to_q"
  std::string source;  // the file's name for it (errors and summaries)
  Tensor down;         // [rank, in] F32
  Tensor up;           // [out, rank] F32
  Tensor magnitude;    // DoRA (peft's lora_magnitude_vector): [out] F32; undefined for a plain LoRA
  Tensor bias;         // peft's lora_B bias (lora_bias): [out] F32; undefined when the file has none
  double scale = 1.0;  // alpha / rank

  // The model tensors a merge of this module writes: the weight, and the bias when it has one.
  std::vector<std::string> merged_tensors() const;
};

struct LoraAdapter {
  std::string path;
  std::string format;        // the layout it was read as, in words ("musubi-tuner (lora_unet_)", ...)
  std::string partition;     // "transformer" or "transformer_ref": the prefix it names ("transformer" when none)
  std::string alpha_source;  // what set the scales: ".alpha tensors", "lora_adapter_metadata", ...
  std::vector<LoraModule> modules;
  std::vector<std::string> warnings;  // what the reference would log and load anyway
};

// Whether a tensor name is a LoRA factor or alpha in any layout read_lora reads (".lora_A.",
// ".lora_down.", a `lora_unet_` name, ...): tells an adapter from a checkpoint.
bool is_lora_tensor_name(const std::string& name);

// Reads and converts one LoRA file, checking every module against `config`'s linears: an error
// names the file and the tensor (a layout it cannot place, a missing half, a shape that does not fit,
// DoRA, biases).
Result<LoraAdapter> read_lora(const std::string& path, const H3Config& config);

struct LoraApplication {
  const LoraAdapter* adapter = nullptr;
  double strength = 1.0;
};

// Adapters and their strengths, owned together: what a merge that outlives its caller holds.
struct LoraStack {
  std::vector<LoraAdapter> adapters;
  std::vector<double> strengths;
  std::vector<LoraApplication> applications() const;
};

// One module as a merge applies it: s = strength · scale, rounded once to fp32.
struct LoraTerm {
  const LoraModule* module = nullptr;
  float scale = 0.0f;
};
// Each targeted linear's terms (keyed by the linear, e.g. "transformer_blocks.3.attn.to_q"), in the
// order the adapters came.
std::map<std::string, std::vector<LoraTerm>> lora_terms_by_linear(const std::vector<LoraApplication>& loras);
bool has_dora(const std::vector<LoraTerm>& terms);
bool has_bias(const std::vector<LoraTerm>& terms);
// Whether a linear's terms fit its weight [out, in] (read_lora checked them against the config);
// the error names the first module and the weight.
Status check_lora_fits(const std::vector<LoraTerm>& terms, const std::string& weight_name, const Tensor& weight);
// The error of a DoRA row whose W + s·Δ is all zeros, which its magnitude cannot scale.
Status dora_zero_norm_error(const LoraModule& module, const std::string& weight_name, int64_t row);

// Merges the adapters, in order, into `tensors` (diffusers names; a targeted weight or bias is replaced
// by a new tensor of the storage dtype: F32 for fp32 islands, else `model_dtype`: F32, BF16 or F16).
// Modules whose weight is not among `tensors` are left for another call (a checkpoint converted one
// group of tensors at a time; a linear's bias must come with its weight when a DoRA module scales
// it); read_lora checked every target against the config. A DoRA row whose W + s·Δ is all zeros is
// an error naming the module.
Status merge_loras(NamedTensors& tensors, const std::vector<LoraApplication>& loras, DType model_dtype);

}  // namespace vortex::h3
