// Checkpoints whose linear weights are stored in fp8 or NVFP4 with their scales beside them, as
// LightX2V, ComfyUI and NVIDIA's ModelOpt write them, and the fp8 checkpoints `vortex convert
// --quantize fp8` writes.
//
// A weight `P.weight` stored F8_E4M3 or F8_E5M2 may have one scale tensor beside it,
//   P.weight_scale   (LightX2V, ModelOpt, ComfyUI's quantized layers, vortex convert)
//   P.scale_weight   (ComfyUI's "scaled fp8" checkpoints)
// of dtype F32, BF16 or F16 and shape [] or [1] (one scale for the tensor) or [O] or [O, 1] (one per
// output channel, O = the weight's first dim). Without one the scale is 1 (a checkpoint cast to fp8).
//
// A weight stored U8 is NVFP4 (formats/nvfp4.h): U8 [O, I/2], two e2m1 codes a byte, with
//   P.weight_scale     F8_E4M3, one per 16 elements of a row: [O, I/16] row-major (ModelOpt), or
//                      cuBLAS's tiled layout [roundup(O, 128), roundup(I/16, 4)] (ComfyUI), and
//   P.weight_scale_2   F32 / BF16 / F16 [] or [1], one for the tensor.
// The block scales are tiled when ComfyUI's descriptor P.comfy_quant says {"format": "nvfp4"} or
// when only the tiled shape fits; otherwise (the two shapes agree and there is no descriptor, as
// ModelOpt writes them) row-major. An NVFP4 weight's schema shape is [O, I] (logical_weight_shape).
//
// A GGUF file's quantized matrix (formats/gguf.h) is held as stored, zero-copy, in the same way: its
// blocks as P.weight U8 [O, row bytes] (each row whole blocks) and the ggml type beside it as
//   P.ggml_type        I32 [], a quantized type formats/gguf.h dequantizes (Q4_0 ... Q6_K).
// Its schema shape is [O, row bytes / block bytes · block values] (shapes_of in weights.h).
// Dequantized, its values are ggml's fp32 values (dequantize_ggml), rounded once.
//
// Read past, because nothing here needs them: static activation scales (P.input_scale,
// P.scale_input; the fp8 recipe quantizes each token's activations with its own scale, the bf16
// recipe does not quantize them), the comfy_quant descriptors of fp8 layers and ComfyUI's
// `scaled_fp8` marker. Refused by name: scaled integer weights, and comfy_quant formats other than
// nvfp4 on a U8 weight.
//
// Dequantized, every element is w = float(q) · float(scale) in fp32 (NVFP4: e2m1(q) ·
// (tensor scale · block scale)), rounded once to the target dtype (round to nearest even); the fp32 islands (weights.h) are dequantized into F32. This runs
// before the layout conversion, on the names as stored, so a per-channel scale of an original
// layout's per-head-interleaved qkv_proj follows its rows.
//
// quantize_linears_fp8 writes the fp8 recipe's own weights (cpu::quantize_weight_fp8: e4m3 codes,
// one scale per output channel, amax / 448) for the linears the recipe quantizes per channel:
// each transformer block's to_q, to_k, to_v, ff.net.0.proj and ff.net.2. The recipe's
// block-scaled out projection (to_out.0) and everything else stay as they are. Dequantized to bf16
// and quantized again by the recipe, such a weight gives back its codes and scales bit for bit
// (float(q) · scale · (448 / amax) is q within 2^-9, half of e4m3's finest relative step or less,
// and the largest element gives back amax exactly), so the fp8 recipe on the quantized checkpoint
// runs the weights it runs on the source (tests/test_h3_scaled_weights.cc checks the round trip).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/nvfp4.h"
#include "models/h3/weights.h"
#include "vortex/status.h"

namespace vortex::h3 {

// The side tensor that marks a weight as GGUF blocks, and one holding `type`.
inline constexpr const char* kGgmlTypeSuffix = ".ggml_type";
Tensor ggml_type_tensor(uint32_t type);

// The dtypes quantized weights are stored in: F8_E4M3, F8_E5M2 and U8 (NVFP4, GGUF blocks).
bool is_quantized_storage(DType dtype);

// A scale, static activation scale or format descriptor beside a weight: not a model tensor.
bool is_quantization_side_tensor(const std::string& name);

struct ScaledWeightsSummary {
  int64_t fp8_weights = 0;  // weights stored F8_E4M3 / F8_E5M2
  int64_t per_channel = 0;  // ... with one scale per output channel
  int64_t per_tensor = 0;   // ... with one scale for the tensor
  int64_t side_tensors_read_past = 0;  // input scales, fp8 layers' descriptors, the marker
  int64_t nvfp4_weights = 0;  // weights stored NVFP4 (U8)
  int64_t nvfp4_tiled = 0;    // ... whose block scales are in cuBLAS's tiled layout
  int64_t ggml_weights = 0;   // weights held as GGUF blocks (U8 with a ggml_type)
};

// The names of the side tensors the dequantization of `weight_name` (P.weight) may read:
// P.weight_scale, P.scale_weight, P.weight_scale_2, P.comfy_quant, P.ggml_type.
std::vector<std::string> side_tensor_names_of(const std::string& weight_name);

// Checks every quantized weight's scales and every side tensor (a scale without its weight, a scale
// of a weight that is neither fp8 nor NVFP4, a scale's shape or dtype, an NVFP4 weight without both
// of its scales); the error names the tensor.
Result<ScaledWeightsSummary> check_scaled_weights(const NamedTensors& tensors);

// A quantized weight as stored, for a loader that dequantizes it on the device
// (cuda/dequantize_weights.h): its codes, and fp8's scale widened to F32 ([1] or [O]; undefined: 1)
// or NVFP4's block scales with their layout and the tensor scale.
struct StoredQuantizedWeight {
  Tensor codes;  // F8_E4M3 / F8_E5M2 [O, ...], NVFP4's U8 [O, I/2], or GGUF blocks U8 [O, row bytes]
  // Set for some rows of a stored weight (quantized_rows): the weight's codes are these rows of
  // `codes`, in order, left in place for the loader to copy. Empty: `codes` are the weight's own.
  RowRuns codes_rows;
  Tensor fp8_scales;
  Tensor nvfp4_block_scales;
  Nvfp4ScaleLayout nvfp4_layout = Nvfp4ScaleLayout::kRowMajor;
  float nvfp4_tensor_scale = 1.0f;
  std::optional<uint32_t> ggml_type;
  bool nvfp4() const { return nvfp4_block_scales.defined(); }
  // The weight's rows (O) and its shape in the model: [O, I].
  int64_t rows() const;
  Shape logical_shape() const;
};
// `name`'s entry of `tensors` (the weight and its side tensors: side_tensor_names_of), checked as
// check_scaled_weights checks it; an error when it is not a quantized weight.
Result<StoredQuantizedWeight> stored_quantized_weight(const NamedTensors& tensors, const std::string& name);

// The quantized weight `name` of `tensors` holding only `runs`' rows, in their order, still
// quantized: its codes' rows (as codes_rows, not copied), fp8's per-row scales' rows (widened to
// F32 [rows]; one scale for the tensor kept), NVFP4's block scales' rows (made row-major first; the
// tensor scale kept) and a GGUF weight's type. For splitting and reordering a fused layer (the
// original layout's QKV and FC1) without dequantizing it: dequantized, each row has the bits it had.
Result<StoredQuantizedWeight> quantized_rows(const NamedTensors& tensors, const std::string& name,
                                             const RowRuns& runs);
// The same as tensors named `new_name` (P.weight) and its side tensors, the codes' rows gathered.
Result<NamedTensors> take_quantized_rows(const NamedTensors& tensors, const std::string& name, const RowRuns& runs,
                                         const std::string& new_name);

// The tensors with every fp8, NVFP4 and GGUF-block weight dequantized (above) into `into` (F32 or
// BF16; fp32 islands into F32) and the side tensors left out; every other tensor is passed on as it
// was. Checks first.
Result<NamedTensors> dequantize_scaled_weights(const NamedTensors& tensors, DType into);

// ComfyUI files may keep their per-layer descriptors in the safetensors header instead of beside
// each weight: "_quantization_metadata" = {"layers": {"P": {"format": ...}, ...}}. ComfyUI turns each
// into a P.comfy_quant tensor (its JSON bytes) when it loads such a file, and so does read_all, with
// these. Empty without the key; a malformed value is an error naming it.
Result<NamedTensors> comfy_quant_from_header(const std::map<std::string, std::string>& metadata);

// True for the names quantize_linears_fp8 quantizes, in either layout: the diffusers names above,
// and the original layout's blocks.N.attn.qkv_proj, mlp.fc1 and mlp.fc2. Quantization is per row,
// so a fused QKV or [gate; value] FC1 gets its parts' codes and scales, rows reordered.
bool is_fp8_channel_quantized_linear(const std::string& name);

// Tensors of either layout with each such linear's weight replaced by its e4m3 codes and a
// `weight_scale` [O] F32 beside it; the other tensors as they were.
Result<NamedTensors> quantize_linears_fp8(const NamedTensors& tensors);

}  // namespace vortex::h3
