// host_weight_filler (cuda_transformer.h): host tensors into the model's device weights. A quantized
// weight (fp8 or NVFP4 with its scales, GGUF blocks with their type; scaled_weights.h) uploads as
// stored and is dequantized on the device (cuda/dequantize_weights.h), the same bits as the host's
// dequantization with half (fp8), a quarter (NVFP4) or less (the 2- to 6-bit GGUF types) of bf16's
// bytes over PCIe and no host pass over the weight;
// VORTEX_VARIANT_DEQUANTIZE=host dequantizes on the host instead. An original-layout checkpoint's
// fused QKV / FC1 parts (HostWeights) are written from their rows of the fused weight, never
// gathered on the host first where the rows can go as they are.
#include <cstdlib>
#include <memory>
#include <string>

#include "cuda/dequantize_weights.h"
#include "cuda/runtime.h"
#include "models/h3/cuda_transformer.h"
#include "models/h3/scaled_weights.h"

namespace vortex::h3 {

Result<bool> device_variant(const char* variable) {
  const char* variant = std::getenv(variable);
  const std::string chosen = variant == nullptr || *variant == '\0' ? "device" : variant;
  if (chosen != "device" && chosen != "host") {
    return invalid_argument(std::string(variable) + " must be device or host (got '" + chosen + "')");
  }
  return chosen == "device";
}

namespace {

Status shape_check(const std::string& name, const Shape& shape, const Shape& expected) {
  if (shape == expected) return ok_status();
  return invalid_argument("tensor '" + name + "': shape " + shape.to_string() + " but the config expects " +
                          expected.to_string());
}

// Codes (a fused layer's part: its rows of the stored codes) and scales uploaded into scratch in
// the stream's order, dequantized into `dst`.
Status dequantize_into(const StoredQuantizedWeight& q, const Tensor& dst, cudaStream_t stream) {
  Shape codes_shape = q.codes.shape();
  codes_shape[0] = q.rows();
  size_t bytes = cuda::DeviceArena::bytes_for(codes_shape, q.codes.dtype());
  const Tensor& scales = q.nvfp4() ? q.nvfp4_block_scales : q.fp8_scales;
  if (scales.defined()) bytes += cuda::DeviceArena::bytes_for(scales.shape(), scales.dtype());
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create_on_stream(bytes, stream));
  VORTEX_ASSIGN_OR_RETURN(const Tensor codes, arena.alloc(codes_shape, q.codes.dtype()));
  if (q.codes_rows.empty()) {
    VORTEX_RETURN_IF_ERROR(cuda::copy_to_device_staged(q.codes, codes, stream));
  } else {
    VORTEX_RETURN_IF_ERROR(cuda::copy_rows_to_device_staged(q.codes, q.codes_rows, codes, stream));
  }
  Tensor device_scales;
  if (scales.defined()) {
    VORTEX_ASSIGN_OR_RETURN(device_scales, cuda::upload_staged(scales, arena, stream));
  }
  if (q.ggml_type) return cuda::dequantize_ggml_weight(codes, *q.ggml_type, dst, stream);
  if (q.nvfp4()) {
    return cuda::dequantize_nvfp4_weight(codes, device_scales, q.nvfp4_layout, q.nvfp4_tensor_scale, dst, stream);
  }
  return cuda::dequantize_fp8_weight(codes, device_scales, dst, stream);
}

// Whether a quantized weight written into dst is dequantized on the device.
Result<bool> dequantizes_on_device(DequantizeOn where, const Tensor& dst) {
  VORTEX_ASSIGN_OR_RETURN(const bool device, where == DequantizeOn::kConfigured
                                                 ? device_variant("VORTEX_VARIANT_DEQUANTIZE")
                                                 : Result<bool>(where == DequantizeOn::kDevice));
  return device && (dst.dtype() == DType::kF32 || dst.dtype() == DType::kBF16);
}

// A fused layer's part written from its rows of the stored weight, with no gathered copy: bf16 rows
// staged as they are, a quantized part's codes staged from the stored codes and dequantized there.
// False when the part takes the gathered way (another dtype to convert into; dequantized on the host).
Result<bool> write_stored_rows(const HostWeights::StoredRows& rows, const TensorSpec& spec, const Tensor& dst,
                               cudaStream_t stream, DequantizeOn where) {
  const auto& [stored_name, stored] = rows.stored.front();
  if (is_quantized_storage(stored.dtype())) {
    VORTEX_ASSIGN_OR_RETURN(const bool on_device, dequantizes_on_device(where, dst));
    if (!on_device) return false;
    VORTEX_ASSIGN_OR_RETURN(const StoredQuantizedWeight q, quantized_rows(rows.stored, stored_name, rows.runs));
    VORTEX_RETURN_IF_ERROR(shape_check(spec.name, q.logical_shape(), spec.shape));
    VORTEX_RETURN_IF_ERROR(dequantize_into(q, dst, stream));
    return true;
  }
  if (stored.dtype() != dst.dtype()) return false;
  VORTEX_RETURN_IF_ERROR(shape_check(spec.name, rows.shape(), spec.shape));
  VORTEX_RETURN_IF_ERROR(cuda::copy_rows_to_device_staged(stored.contiguous(), rows.runs, dst, stream));
  return true;
}

}  // namespace

Status write_host_weight(const NamedTensors& weight, const TensorSpec& spec, const Tensor& dst, cudaStream_t stream,
                         DequantizeOn where) {
  if (weight.empty()) return invalid_argument("missing tensor '" + spec.name + "'");
  Tensor host = weight.front().second;
  if (is_quantized_storage(host.dtype())) {
    VORTEX_ASSIGN_OR_RETURN(const bool on_device, dequantizes_on_device(where, dst));
    if (on_device) {
      VORTEX_ASSIGN_OR_RETURN(const StoredQuantizedWeight q, stored_quantized_weight(weight, spec.name));
      VORTEX_RETURN_IF_ERROR(shape_check(spec.name, q.logical_shape(), spec.shape));
      return dequantize_into(q, dst, stream);
    }
    VORTEX_ASSIGN_OR_RETURN(const NamedTensors dequantized,
                            dequantize_scaled_weights(weight, dst.dtype() == DType::kF32 ? DType::kF32 : DType::kBF16));
    host = dequantized.front().second;
  }
  VORTEX_RETURN_IF_ERROR(shape_check(spec.name, host.shape(), spec.shape));
  if (host.dtype() != dst.dtype()) {
    VORTEX_ASSIGN_OR_RETURN(host, host.to(dst.dtype()));
  }
  return cuda::copy_to_device_staged(host, dst, stream);
}

WeightFiller host_weight_filler(HostWeights weights, cudaStream_t stream, DequantizeOn where) {
  auto shared = std::make_shared<const HostWeights>(std::move(weights));
  // A bad VORTEX_VARIANT_DEQUANTIZE is the error of every quantized weight's fill.
  if (where == DequantizeOn::kConfigured) {
    const Result<bool> device = device_variant("VORTEX_VARIANT_DEQUANTIZE");
    if (device.ok()) where = *device ? DequantizeOn::kDevice : DequantizeOn::kHost;
  }
  return [shared, stream, where](const TensorSpec& spec, const Tensor& dst) -> Status {
    if (const auto rows = shared->stored_rows(spec.name)) {
      VORTEX_ASSIGN_OR_RETURN(const bool written, write_stored_rows(*rows, spec, dst, stream, where));
      if (written) return ok_status();
    }
    VORTEX_ASSIGN_OR_RETURN(const NamedTensors weight, shared->weight(spec.name));
    return write_host_weight(weight, spec, dst, stream, where);
  };
}

}  // namespace vortex::h3
