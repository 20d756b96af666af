#include "cuda/attention_fallback.h"

#include <cuda_bf16.h>

#include "core/dtype.h"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kFallbackMaxHeadDim / kWarp;  // channels each lane owns (strided by 32)

struct FallbackParams {
  const uint16_t *q, *k, *v;
  uint16_t* out;
  int64_t q_row, q_head, k_row, k_head, v_row, v_head, out_row, out_head;
  int64_t nq, nk, heads;
  int d;
  float scale;
};

__global__ void attention_fallback_kernel(FallbackParams p) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.nq * p.heads) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t i = item / p.heads, h = item % p.heads;
  float q[kPerLane], acc[kPerLane];
  for (int c = 0; c < kPerLane; ++c) {
    const int ch = lane + c * kWarp;
    q[c] = ch < p.d ? bf16_bits_to_f32(p.q[i * p.q_row + h * p.q_head + ch]) : 0.0f;
    acc[c] = 0.0f;
  }
  float running_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j = 0; j < p.nk; ++j) {
    const uint16_t* kj = p.k + j * p.k_row + h * p.k_head;
    float partial = 0.0f;
    for (int c = 0; c < kPerLane; ++c) {
      const int ch = lane + c * kWarp;
      if (ch < p.d) partial = fmaf(q[c], bf16_bits_to_f32(kj[ch]), partial);
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xFFFFFFFFu, partial, offset);
    const float s = partial * p.scale;
    const float new_max = fmaxf(running_max, s);
    const float rescale = expf(running_max - new_max);  // 0 on the first key (running_max = -inf)
    const float weight = expf(s - new_max);
    // The PV product takes P in bf16, as the tensor-core kernel and the CPU reference do.
    const float weight_bf16 = round_bf16(weight);
    row_sum = row_sum * rescale + weight;
    const uint16_t* vj = p.v + j * p.v_row + h * p.v_head;
    for (int c = 0; c < kPerLane; ++c) {
      const int ch = lane + c * kWarp;
      if (ch < p.d) acc[c] = fmaf(weight_bf16, bf16_bits_to_f32(vj[ch]), acc[c] * rescale);
    }
    running_max = new_max;
  }
  uint16_t* o = p.out + i * p.out_row + h * p.out_head;
  for (int c = 0; c < kPerLane; ++c) {
    const int ch = lane + c * kWarp;
    if (ch < p.d) o[ch] = f32_to_bf16_bits(acc[c] / row_sum);
  }
}

}  // namespace

Status attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream) {
  const int64_t d = q.shape[2];
  if (d > kFallbackMaxHeadDim) {
    return invalid_argument("cuda attention: head dim " + std::to_string(d) + " above the fallback's " +
                            std::to_string(kFallbackMaxHeadDim));
  }
  FallbackParams p{};
  p.q = static_cast<const uint16_t*>(q.data);
  p.k = static_cast<const uint16_t*>(k.data);
  p.v = static_cast<const uint16_t*>(v.data);
  p.out = static_cast<uint16_t*>(out.data);
  p.q_row = q.strides[0], p.q_head = q.strides[1];
  p.k_row = k.strides[0], p.k_head = k.strides[1];
  p.v_row = v.strides[0], p.v_head = v.strides[1];
  p.out_row = out.strides[0], p.out_head = out.strides[1];
  p.nq = q.shape[0], p.nk = k.shape[0], p.heads = q.shape[1];
  p.d = static_cast<int>(d);
  p.scale = scale;
  const int64_t items = p.nq * p.heads;
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT32_MAX) return invalid_argument("cuda attention fallback: too many (query, head) pairs");
  attention_fallback_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
