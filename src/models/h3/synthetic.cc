#include "models/h3/synthetic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "models/h3/synthetic_rule.h"

namespace vortex::h3 {

namespace {

// Elements per fill_normal call: a 64 KB fp32 scratch per thread that stays in L2.
constexpr int64_t kChunk = int64_t{1} << 14;

// out[i] = round(normal_at(seed, stream, i) * scale). Chunks are filled independently and each
// element depends only on its index, so the result does not depend on the thread count.
void fill_scaled_normals(const Tensor& out, uint64_t seed, uint64_t stream, float scale) {
  const int64_t n = out.numel();
  const bool bf16 = out.dtype() == DType::kBF16;
  parallel_for(0, (n + kChunk - 1) / kChunk, [&](int64_t first_chunk, int64_t last_chunk) {
    std::vector<float> z(kChunk);
    for (int64_t c = first_chunk; c < last_chunk; ++c) {
      const int64_t begin = c * kChunk, count = std::min(kChunk, n - begin);
      fill_normal(z.data(), count, seed, stream, begin);
      if (bf16) {
        uint16_t* dst = out.data_as<uint16_t>() + begin;
        for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_bf16_bits(z[i] * scale);
      } else {
        float* dst = out.data_as<float>() + begin;
        for (int64_t i = 0; i < count; ++i) dst[i] = z[i] * scale;
      }
    }
  });
}

Status check_model_dtype(DType dtype) {
  if (dtype == DType::kF32 || dtype == DType::kBF16) return ok_status();
  return invalid_argument(std::string("synthetic weights: dtype ") + dtype_name(dtype) + " is not supported (F32 or BF16)");
}

void fill_constant(const Tensor& out, float value) {
  if (out.dtype() == DType::kBF16) {
    std::fill_n(out.data_as<uint16_t>(), out.numel(), f32_to_bf16_bits(value));
  } else {
    std::fill_n(out.data_as<float>(), out.numel(), value);
  }
}

}  // namespace

Result<Tensor> synthetic_tensor(const TensorSpec& spec, DType dtype, uint64_t seed) {
  VORTEX_RETURN_IF_ERROR(check_model_dtype(dtype));
  const SyntheticInit init = synthetic_init(spec);
  Tensor out = Tensor::empty(spec.shape, spec.fp32_island ? DType::kF32 : dtype);
  if (init.kind == SyntheticInit::Kind::kConstant) {
    fill_constant(out, init.constant);
  } else {
    fill_scaled_normals(out, seed, init.stream, init.scale);
  }
  return out;
}

Result<NamedTensors> synthetic_weights(const H3Config& config, DType dtype, uint64_t seed) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  NamedTensors out;
  for (const TensorSpec& spec : diffusers_schema(config)) {
    VORTEX_ASSIGN_OR_RETURN(Tensor t, synthetic_tensor(spec, dtype, seed));
    out.emplace_back(spec.name, std::move(t));
  }
  return out;
}

Status write_synthetic_checkpoint(const std::string& dir, const H3Config& config, DType dtype, uint64_t seed,
                                  const CheckpointWriteOptions& options) {
  VORTEX_RETURN_IF_ERROR(check_model_dtype(dtype));  // before the output folder is touched
  const GroupSource source = [&](const WeightGroup& group) -> Result<NamedTensors> {
    NamedTensors out;
    for (const TensorSpec& spec : group.specs) {
      VORTEX_ASSIGN_OR_RETURN(Tensor t, synthetic_tensor(spec, dtype, seed));
      out.emplace_back(spec.name, std::move(t));
    }
    return out;
  };
  return write_checkpoint(dir, config, source, options);
}

}  // namespace vortex::h3
