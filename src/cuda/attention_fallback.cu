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

__global__ void attention_fallback_kernel(FallbackParams p) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (item >= p.nq * p.heads) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t i = item / p.heads, h = item % p.heads, kv = h / p.group;
  const int64_t keys = p.causal ? i + 1 : p.nk;
  float q[kPerLane], acc[kPerLane];
  for (int c = 0; c < kPerLane; ++c) {
    const int ch = lane + c * kWarp;
    q[c] = ch < p.d ? bf16_bits_to_f32(p.q[i * p.q_row + h * p.q_head + ch]) : 0.0f;
    acc[c] = 0.0f;
  }
  float running_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    const uint16_t* kj = p.k + j * p.k_row + kv * p.k_head;
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
    const uint16_t* vj = p.v + j * p.v_row + kv * p.v_head;
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
  attention_fallback_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace

Status attention_fallback(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          float scale, cudaStream_t stream) {
  return launch_fallback(q, k, v, out, scale, /*causal=*/false, stream);
}

Status causal_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        float scale, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda causal_attention: " + what + " (" + describe_view("q", q) + ", " +
                            describe_view("k", k) + ", " + describe_view("v", v) + ", " + describe_view("out", out) +
                            ")");
  };
  for (const TensorView* t : {&q, &k, &v, &out}) {
    if (t->device != Device::kCuda || t->dtype != DType::kBF16 || t->data == nullptr) {
      return bad("every operand must be BF16 on the device");
    }
    if (t->rank() != 3 || t->strides[2] != 1) return bad("every operand must be [N, H, D] with unit stride on D");
  }
  const int64_t n = q.shape[0], heads = q.shape[1], kv_heads = k.shape[1], d = q.shape[2];
  if (out.shape != q.shape || v.shape != k.shape || k.shape[0] != n || k.shape[2] != d) {
    return bad("shapes must be q, out [N, H, D] and k, v [N, Hkv, D]");
  }
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) return bad("H must be a positive multiple of Hkv");
  if (!(scale > 0.0f) || !std::isfinite(scale)) return bad("scale must be finite and > 0, got " + std::to_string(scale));
  return launch_fallback(q, k, v, out, scale, /*causal=*/true, stream);
}

}  // namespace vortex::cuda
