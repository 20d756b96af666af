#include "cuda/attention_fallback.h"

#include <cuda_bf16.h>

#include <cmath>

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
  int64_t group;  // query heads per key/value head: query head h reads k/v head h / group
  bool causal;    // query i sees keys 0 ..= i
  int d;
  float scale;
};

// One warp per (query row, head), keys in chunks of 32: lane t scores key j0 + t on its own (q
// from shared memory, the key row read whole), the chunk's maximum and sum take one shuffle tree
// each, and the P·V update broadcasts each key's weight to the lanes, which own channels
// lane + 32·c (c < PER_LANE: 4 covers D <= 128). VEC: 16-byte loads of the key rows (D a multiple
// of 8 and aligned rows). Causal rows are taken longest first (the last query sees every key), so
// that the grid's tail is the short rows.
template <bool VEC, int PER_LANE>
__global__ void attention_fallback_kernel(FallbackParams p) {
  __shared__ float q_shared[kWarpsPerBlock][kFallbackMaxHeadDim];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (item >= p.nq * p.heads) return;  // whole warps: the shuffles below stay within live warps
  const int64_t i = p.causal ? p.nq - 1 - item / p.heads : item / p.heads;
  const int64_t h = item % p.heads, kv = h / p.group;
  const int64_t keys = p.causal ? i + 1 : p.nk;
  float* q = q_shared[warp];
  for (int ch = lane; ch < p.d; ch += kWarp) q[ch] = bf16_bits_to_f32(p.q[i * p.q_row + h * p.q_head + ch]);
  __syncwarp();
  float acc[PER_LANE];
#pragma unroll
  for (int c = 0; c < PER_LANE; ++c) acc[c] = 0.0f;
  float running_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j0 = 0; j0 < keys; j0 += kWarp) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (j < keys) {
      const uint16_t* kj = p.k + j * p.k_row + kv * p.k_head;
      float dot = 0.0f;
      if constexpr (VEC) {
        for (int ch = 0; ch < p.d; ch += 8) {
          const uint4 packed = *reinterpret_cast<const uint4*>(kj + ch);
          const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            dot = fmaf(q[ch + 2 * w], bf16_bits_to_f32(static_cast<uint16_t>(words[w] & 0xFFFFu)), dot);
            dot = fmaf(q[ch + 2 * w + 1], bf16_bits_to_f32(static_cast<uint16_t>(words[w] >> 16)), dot);
          }
        }
      } else {
        for (int ch = 0; ch < p.d; ++ch) dot = fmaf(q[ch], bf16_bits_to_f32(kj[ch]), dot);
      }
      s = dot * p.scale;
    }
    float chunk_max = s;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xFFFFFFFFu, chunk_max, offset));
    }
    const float new_max = fmaxf(running_max, chunk_max);  // finite: every chunk holds a key
    const float rescale = expf(running_max - new_max);    // 0 on the first chunk (running_max = -inf)
    const float weight = j < keys ? expf(s - new_max) : 0.0f;
    // The PV product takes P in bf16, as the tensor-core kernel and the CPU reference do.
    const float weight_bf16 = round_bf16(weight);
    float chunk_sum = weight;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) chunk_sum += __shfl_xor_sync(0xFFFFFFFFu, chunk_sum, offset);
    row_sum = row_sum * rescale + chunk_sum;
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) acc[c] *= rescale;
    const int in_chunk = static_cast<int>(keys - j0 < kWarp ? keys - j0 : kWarp);  // the same on every lane
    // Unrolled so that several keys' v loads are in flight at once.
#pragma unroll 4
    for (int t = 0; t < in_chunk; ++t) {
      const float pt = __shfl_sync(0xFFFFFFFFu, weight_bf16, t);
      const uint16_t* vj = p.v + (j0 + t) * p.v_row + kv * p.v_head;
#pragma unroll
      for (int c = 0; c < PER_LANE; ++c) {
        const int ch = lane + c * kWarp;
        if (ch < p.d) acc[c] = fmaf(pt, bf16_bits_to_f32(vj[ch]), acc[c]);
      }
    }
    running_max = new_max;
  }
  uint16_t* o = p.out + i * p.out_row + h * p.out_head;
#pragma unroll
  for (int c = 0; c < PER_LANE; ++c) {
    const int ch = lane + c * kWarp;
    if (ch < p.d) o[ch] = f32_to_bf16_bits(acc[c] / row_sum);
  }
}

Status launch_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       float scale, bool causal, cudaStream_t stream) {
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
  p.group = q.shape[1] / k.shape[1];
  p.causal = causal;
  p.d = static_cast<int>(d);
  p.scale = scale;
  const int64_t items = p.nq * p.heads;
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT32_MAX) return invalid_argument("cuda attention fallback: too many (query, head) pairs");
  if (blocks == 0) return ok_status();
  const bool vec = d % 8 == 0 && reinterpret_cast<uintptr_t>(p.k) % 16 == 0 && p.k_row % 8 == 0 && p.k_head % 8 == 0;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarpsPerBlock * kWarp);
  if (d <= 4 * kWarp) {
    vec ? attention_fallback_kernel<true, 4><<<grid, block, 0, stream>>>(p)
        : attention_fallback_kernel<false, 4><<<grid, block, 0, stream>>>(p);
  } else {
    vec ? attention_fallback_kernel<true, kPerLane><<<grid, block, 0, stream>>>(p)
        : attention_fallback_kernel<false, kPerLane><<<grid, block, 0, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace

Status attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream) {
  return launch_fallback(q, k, v, out, scale, /*causal=*/false, stream);
}

Status causal_attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                 float scale, cudaStream_t stream) {
  return launch_fallback(q, k, v, out, scale, /*causal=*/true, stream);
}

}  // namespace vortex::cuda
