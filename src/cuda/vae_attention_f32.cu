// Exact fp32 attention (contract: vae_attention_f32.h):
//
//   out[i, h, :] = Σ_j softmax_j(scale · q[i, h, :] · k[j, h, :]) · v[j, h, :]
//
// over every key j, or (causal) over j <= i.
//
// One variant, flash-style on CUDA cores: a CTA takes (128 / kSplit queries, one head); each query
// is owned by kSplit adjacent threads, each holding kWidth = kMaxD / kSplit of its q and output
// accumulator in registers (kWidth <= 64 keeps q, the accumulator and a tile of scores within the
// register budget without spills). Tiles of kKeys keys of K and V stream through shared memory;
// per tile the scores are computed (partial dots joined by a shuffle), the running max is
// updated once, the accumulator rescaled once, and P·V accumulated, all in fp32 with IEEE expf.
// Head dims below kMaxD are zero-padded in registers and shared memory, so the unrolled loops need
// no bounds checks and the padding adds exact zeros. Against the CPU (fp32 GEMMs, softmax with the
// max subtracted, division by the row sum at the end) only the summation order and expf differ.
#include "cuda/vae_attention_f32.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

constexpr int kThreads = 128;
// Keys per shared-memory tile: each thread holds one score per key in registers; 32 spilled at head
// dim 128 (ptxas: 255 registers), 16 does not (224).
constexpr int kKeys = 16;
// Shared-memory floats between the kSplit column parts of a K/V row: the parts of one query read
// the same key in the same instruction, and this offset puts them on different banks while
// keeping 16-byte alignment for the vector loads.
constexpr int kPartPad = 4;

struct AttentionF32Params {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  int64_t q_row, q_head, k_row, k_head, v_row, v_head, out_row, out_head;  // strides, elements
  int64_t nq, nk;
  int d;
  float scale;
  bool causal;  // key j is seen by queries j.. only
};

template <int kMaxD>
struct Tiling {
  static constexpr int kSplit = kMaxD > 64 ? kMaxD / 64 : 1;
  static constexpr int kWidth = kMaxD / kSplit;
  static constexpr int kQueries = kThreads / kSplit;
  static constexpr int kPartFloats = kKeys * kWidth + kPartPad;
};

// K or V rows [j0, j0 + kKeys) of head h into smem [part][key][kWidth], zero beyond nk and d.
template <int kMaxD>
__device__ void load_tile(const float* base, int64_t row_stride, int64_t j0, const AttentionF32Params& p,
                          float* smem) {
  using T = Tiling<kMaxD>;
  for (int e = threadIdx.x; e < kKeys * kMaxD; e += kThreads) {
    const int j = e / kMaxD, col = e % kMaxD;
    const int64_t key = j0 + j;
    const float value = (key < p.nk && col < p.d) ? base[key * row_stride + col] : 0.0f;
    smem[(col / T::kWidth) * T::kPartFloats + j * T::kWidth + col % T::kWidth] = value;
  }
}

template <int kMaxD>
__global__ void __launch_bounds__(kThreads) attention_f32_kernel(AttentionF32Params p) {
  using T = Tiling<kMaxD>;
  __shared__ __align__(16) float k_tile[T::kSplit * T::kPartFloats];
  __shared__ __align__(16) float v_tile[T::kSplit * T::kPartFloats];
  const int h = blockIdx.y;
  const int part = threadIdx.x % T::kSplit;
  const int64_t query = static_cast<int64_t>(blockIdx.x) * T::kQueries + threadIdx.x / T::kSplit;
  const bool active = query < p.nq;
  const int col0 = part * T::kWidth;

  float q[T::kWidth], acc[T::kWidth];
#pragma unroll
  for (int i = 0; i < T::kWidth; ++i) {
    q[i] = (active && col0 + i < p.d) ? p.q[query * p.q_row + h * p.q_head + col0 + i] : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -INFINITY, row_sum = 0.0f;
  const float* k_base = p.k + h * p.k_head;
  const float* v_base = p.v + h * p.v_head;
  const float* k_part = k_tile + part * T::kPartFloats;
  const float* v_part = v_tile + part * T::kPartFloats;
  // Keys this thread reads: causal ones up to its query; the CTA's tiles up to its last query's.
  const int64_t seen = p.causal ? min(p.nk, query + 1) : p.nk;
  const int64_t cta_keys = p.causal ? min(p.nk, static_cast<int64_t>(blockIdx.x + 1) * T::kQueries) : p.nk;
  for (int64_t j0 = 0; j0 < cta_keys; j0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<kMaxD>(k_base, p.k_row, j0, p, k_tile);
    load_tile<kMaxD>(v_base, p.v_row, j0, p, v_tile);
    __syncthreads();

    float s[kKeys];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const float4* kr = reinterpret_cast<const float4*>(k_part + j * T::kWidth);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < T::kWidth / 4; ++i) {
        const float4 kv = kr[i];
        dot = fmaf(q[4 * i], kv.x, dot);
        dot = fmaf(q[4 * i + 1], kv.y, dot);
        dot = fmaf(q[4 * i + 2], kv.z, dot);
        dot = fmaf(q[4 * i + 3], kv.w, dot);
      }
#pragma unroll
      for (int offset = 1; offset < T::kSplit; offset <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      s[j] = j0 + j < seen ? dot * p.scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    // Finite: the first tile holds key 0, which every query sees; a later tile of only masked keys
    // keeps the max, and its weights are exp(-inf) = 0.
    const float new_max = fmaxf(running_max, tile_max);
    const float correction = expf(running_max - new_max);
    row_sum *= correction;
#pragma unroll
    for (int i = 0; i < T::kWidth; ++i) acc[i] *= correction;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const float weight = expf(s[j] - new_max);
      row_sum += weight;
      const float4* vr = reinterpret_cast<const float4*>(v_part + j * T::kWidth);
#pragma unroll
      for (int i = 0; i < T::kWidth / 4; ++i) {
        const float4 vv = vr[i];
        acc[4 * i] = fmaf(weight, vv.x, acc[4 * i]);
        acc[4 * i + 1] = fmaf(weight, vv.y, acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(weight, vv.z, acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(weight, vv.w, acc[4 * i + 3]);
      }
    }
    running_max = new_max;
  }
  if (!active) return;
  float* dst = p.out + query * p.out_row + h * p.out_head + col0;
#pragma unroll
  for (int i = 0; i < T::kWidth; ++i) {
    if (col0 + i < p.d) dst[i] = acc[i] / row_sum;
  }
}

template <int kMaxD>
Status launch(const AttentionF32Params& p, int64_t heads, cudaStream_t stream) {
  const int64_t blocks = (p.nq + Tiling<kMaxD>::kQueries - 1) / Tiling<kMaxD>::kQueries;
  attention_f32_kernel<kMaxD><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(heads)), kThreads, 0,
                                 stream>>>(p);
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

std::string describe(const char* name, const TensorView& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape.to_string();
}

Status checked_launch(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      float scale, bool causal, cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda attention_f32: " + what + " (" + describe("q", q) + ", " + describe("k", k) + ", " +
                            describe("v", v) + ", " + describe("out", out) + ")");
  };
  for (const TensorView* t : {&q, &k, &v, &out}) {
    if (t->device != Device::kCuda || t->dtype != DType::kF32) return bad("every operand must be F32 on the device");
    if (t->rank() != 3 || t->strides[2] != 1) return bad("every operand must be [N, H, D] with unit stride on D");
  }
  const int64_t nq = q.shape[0], nk = k.shape[0], heads = q.shape[1], d = q.shape[2];
  if (out.shape != q.shape || v.shape != k.shape || k.shape[1] != heads || k.shape[2] != d) {
    return bad("shapes must be q, out [Nq, H, D] and k, v [Nk, H, D]");
  }
  if (nq < 1 || nk < 1 || heads < 1 || d < 1) return bad("Nq, Nk, H and D must be >= 1");
  if (causal && nq != nk) return bad("causal attention needs Nq == Nk");
  if (d > kAttentionF32MaxHeadDim) return bad("head dim above " + std::to_string(kAttentionF32MaxHeadDim));
  if (heads > 65535 || nq / Tiling<kAttentionF32MaxHeadDim>::kQueries >= INT32_MAX) {
    return bad("too large for one launch");
  }
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    return bad("scale must be finite and > 0, got " + std::to_string(scale));
  }
  AttentionF32Params p{};
  p.q = static_cast<const float*>(q.data);
  p.k = static_cast<const float*>(k.data);
  p.v = static_cast<const float*>(v.data);
  p.out = static_cast<float*>(out.data);
  p.q_row = q.strides[0], p.q_head = q.strides[1];
  p.k_row = k.strides[0], p.k_head = k.strides[1];
  p.v_row = v.strides[0], p.v_head = v.strides[1];
  p.out_row = out.strides[0], p.out_head = out.strides[1];
  p.nq = nq;
  p.nk = nk;
  p.d = static_cast<int>(d);
  p.scale = scale;
  p.causal = causal;
  if (d <= 32) return launch<32>(p, heads, stream);
  if (d <= 64) return launch<64>(p, heads, stream);
  if (d <= 128) return launch<128>(p, heads, stream);
  return launch<256>(p, heads, stream);
}

}  // namespace

Status attention_f32(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out, float scale,
                     cudaStream_t stream) {
  return checked_launch(q, k, v, out, scale, /*causal=*/false, stream);
}

Status causal_attention_f32(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            float scale, cudaStream_t stream) {
  return checked_launch(q, k, v, out, scale, /*causal=*/true, stream);
}

}  // namespace vortex::cuda
