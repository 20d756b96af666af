// The video VAE encoder's causal 3D convolution as an implicit GEMM on tensor cores (contract:
// conv3d_implicit in vae_conv3d.h).
//
// What it computes: conv3d_gather's rows times the weight's real-tap columns, plus the bias — the
// gather and the GEMM of the encoder's v0 path — without writing the rows anywhere. A CTA owns
// kBlockM output pixels of one output frame and kBlockN output channels; its K loop walks the
// frame's real temporal taps, the spatial taps and the input channels in blocks of kBlockK (one
// tap's channels at a time, so every shared row is one input pixel's 32 contiguous channels,
// reflected and causal-offset as conv3d_gather reads them). A and B tiles stream through a
// kStages-deep cp.async ring; fragments come by ldmatrix (an fp32 row of 4 values is the 16 bytes
// ldmatrix moves per row, so its b16 fragments are the tf32 mma's A and B fragments); the products
// are mma.sync m16n8k8 tf32 with fp32 accumulation.
//
// Numerics (variants, VORTEX_VARIANT_VAE_CONV; the encoder's default is still `gemm`):
//   tf32x3: each fp32 operand is split into a tf32 high part and the tf32 rounding of its remainder,
//       and a·b is accumulated as a_lo·b_hi + a_hi·b_lo + a_hi·b_hi (the a_lo·b_lo term, ~2^-22
//       relative, is dropped). Each product is then good to ~2^-21, but the tensor core's own fp32
//       accumulation is not IEEE round-to-nearest: measured on the H100, 2e-6 to 2e-5 rel-L2 from
//       double sums over K = 864 to 3456 (a_hi·b_hi alone: 2.9e-4), against ~1e-7 to 1e-6 for an
//       fp32 GEMM. Adding each k-block's products into the running sum outside the tensor core
//       (fp32 FADD) is the known remedy; it needs a second accumulator set (64 registers).
//   tf32: a_hi·b_hi alone (PyTorch's default for convolutions): ~3e-4, for measurement.
//   gemm: the v0 path (conv3d_gather + cuBLASLt fp32), chosen in the encoder, not here.
// Sums run in a fixed order (no split-K, no atomics): the output is the same bits run to run.
#include "cuda/vae_conv3d.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/hopper_primitives.cuh"
#include "cuda/runtime.h"

namespace vortex::cuda {

namespace {

using hopper::cp_async_16;
using hopper::cp_async_commit;
using hopper::cp_async_wait;
using hopper::ldmatrix_x4;
using hopper::smem_address;

// A 128 x 128 CTA tile: 128 output pixels by 128 output channels (every encoder conv but conv_in's
// and conv_out's has a multiple of 128 output channels), kBlockK = 32 input channels (128-byte
// shared rows; every conv but conv_in's has a multiple of 32 input channels).
constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 32;
// Three stages: the copies of k-blocks kb + 1 and kb + 2 run under the products of kb. A stage is
// 32 KB (A and B), so two CTAs fit an SM's shared memory.
constexpr int kStages = 3;
// Eight warps as 2 x 4, each 64 pixels by 32 channels: 4 x 4 m16n8 tiles, 64 fp32 accumulators
// per thread, and the split fragments (A 32, B 16 registers) beside them.
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpM = kBlockM / kWarpsM, kWarpN = kBlockN / kWarpsN;
constexpr int kMTiles = kWarpM / 16, kNTiles = kWarpN / 8;
// 16-byte chunks of a shared row; the CTA's threads load kLoadRows rows per pass.
constexpr int kChunks = kBlockK / 4;
constexpr int kLoadRows = kThreads / kChunks;
constexpr int kRowsPerThread = kBlockM / kLoadRows;
static_assert(kBlockM == kBlockN, "A and B tiles share the load pattern and the tile size");
static_assert(kChunks == 8, "the swizzle permutes 8 chunks per row");
constexpr int kTileFloats = kBlockM * kBlockK;
// A row's first frame in x before its temporal tap is added (negative for a clip's first frames,
// whose early taps are the causal zeros): this marks a row past the frame's end instead.
constexpr int kPastTheEnd = INT32_MIN;
constexpr int kSmemBytes = kStages * 2 * kTileFloats * static_cast<int>(sizeof(float));

struct ImplicitParams {
  const float* x;     // [clips·T, H, W, C]
  const float* w;     // [O, kt·kh·kw·C]
  const float* bias;  // [O]
  float* y;           // [T_out·frame_rows, O]
  int T, H, W, C, O;
  int kt, kh, kw, st, sh, sw, pad_top, pad_left, temporal_padding;
  int plane, w_out, frame_rows;  // frame_rows = clips · plane
  int64_t k_total;               // kt·kh·kw·C
};

__device__ __forceinline__ int reflect_index(int i, int n) {
  if (i < 0) i = -i;
  if (i >= n) i = 2 * (n - 1) - i;
  return i;
}

// Row `row`, 16-byte chunk `chunk` of a tile, in floats: chunks XOR-swizzled by the row's low
// three bits, so the 8 rows an ldmatrix phase reads sit in 8 different bank groups.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * kBlockK + ((chunk ^ (row & 7)) * 4); }

__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
  return r;
}

// hi = tf32(f), lo = tf32(f − hi) (the subtraction is exact).
__device__ __forceinline__ void split(uint32_t f, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(__uint_as_float(f));
  lo = to_tf32(__uint_as_float(f) - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One CTA: output pixels [m0, m0 + kBlockM) of frame blockIdx.z, channels [n0, n0 + kBlockN).
template <bool kSplit>
__global__ void __launch_bounds__(kThreads, 2) conv3d_tf32_kernel(ImplicitParams p) {
  extern __shared__ __align__(128) float smem[];
  float* a_tiles = smem;
  float* b_tiles = smem + kStages * kTileFloats;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp % kWarpsM, warp_n = warp / kWarpsM;
  const int frame = blockIdx.z, m0 = blockIdx.x * kBlockM, n0 = blockIdx.y * kBlockN;
  // Temporal taps [a0, kt) of this frame read real frames; the ones before read the causal zeros.
  const int a0 = min(max(p.temporal_padding - frame * p.st, 0), p.kt);
  const int spatial = p.kh * p.kw, c_blocks = p.C / kBlockK;
  const int k_blocks = (p.kt - a0) * spatial * c_blocks;

  // This thread loads chunk `chunk` of rows load_row + kLoadRows·i of both tiles. The tap-independent
  // part of each A row's source coordinates (its frame in x, the top-left of its window) is worked
  // out once and kept in shared memory, not registers: two CTAs an SM need ≤ 128 registers a thread.
  __shared__ int row_t[kBlockM], row_h[kBlockM], row_w[kBlockM];
  const int chunk = tid % kChunks, load_row = tid / kChunks;
  if (tid < kBlockM) {
    const int r = m0 + tid, clip = r / p.plane, pixel = r % p.plane;
    row_t[tid] = r < p.frame_rows ? clip * p.T + frame * p.st - p.temporal_padding : kPastTheEnd;
    row_h[tid] = (pixel / p.w_out) * p.sh - p.pad_top;
    row_w[tid] = (pixel % p.w_out) * p.sw - p.pad_left;
  }
  __syncthreads();

  const auto load_stage = [&](int stage, int kb) {
    const int tap = kb / c_blocks, c0 = (kb % c_blocks) * kBlockK + chunk * 4;
    const int ta = a0 + tap / spatial, b = (tap % spatial) / p.kw, d = tap % p.kw;
    float* a_tile = a_tiles + stage * kTileFloats;
    float* b_tile = b_tiles + stage * kTileFloats;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = load_row + kLoadRows * i, t0 = row_t[row];
      const int t = t0 + ta, hi = reflect_index(row_h[row] + b, p.H), wi = reflect_index(row_w[row] + d, p.W);
      const float* src = p.x + ((static_cast<int64_t>(t) * p.H + hi) * p.W + wi) * p.C + c0;
      // Rows past the frame's end arrive as zeros (and are not stored).
      cp_async_16(a_tile + swizzled(row, chunk), t0 != kPastTheEnd ? src : p.x, t0 != kPastTheEnd ? 16 : 0);
      const float* w_src = p.w + static_cast<int64_t>(n0 + row) * p.k_total +
                           static_cast<int64_t>(a0 * spatial + tap) * p.C + c0;
      cp_async_16(b_tile + swizzled(row, chunk), w_src, 16);
    }
  };

  float acc[kMTiles][kNTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) load_stage(s, s);
    cp_async_commit();
  }
  for (int kb = 0; kb < k_blocks; ++kb) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // k-block kb has landed for everyone, and everyone is done with kb − 1's stage
    const int next = kb + kStages - 1;
    if (next < k_blocks) load_stage(next % kStages, next);
    cp_async_commit();  // possibly empty: keeps "all but the newest kStages − 2 groups" meaning kb + 1

    const float* a_tile = a_tiles + (kb % kStages) * kTileFloats;
    const float* b_tile = b_tiles + (kb % kStages) * kTileFloats;
    // Not unrolled: unrolled, ptxas hoists the next steps' fragments and spills at two CTAs an SM.
#pragma unroll 1
    for (int kk = 0; kk < kBlockK / 8; ++kk) {
      // B fragments for the warp's four n8 tiles: b0 = B[k = t][n = g], b1 = B[t + 4][g], read
      // from the [n][k] tile two n8 tiles per ldmatrix.x4.
      uint32_t b_hi[kNTiles][2], b_lo[kNTiles][2];
#pragma unroll
      for (int nt = 0; nt < kNTiles; nt += 2) {
        uint32_t raw[4];
        const int row = warp_n * kWarpN + nt * 8 + (lane / 16) * 8 + lane % 8;
        ldmatrix_x4(raw, smem_address(b_tile + swizzled(row, 2 * kk + (lane / 8) % 2)));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kSplit) {
            split(raw[j], b_hi[nt + j / 2][j % 2], b_lo[nt + j / 2][j % 2]);
          } else {
            b_hi[nt + j / 2][j % 2] = to_tf32(__uint_as_float(raw[j]));
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        // A fragment: a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4].
        uint32_t raw[4], a_hi[4], a_lo[4];
        const int row = warp_m * kWarpM + mt * 16 + lane % 16;
        ldmatrix_x4(raw, smem_address(a_tile + swizzled(row, 2 * kk + lane / 16)));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kSplit) {
            split(raw[j], a_hi[j], a_lo[j]);
          } else {
            a_hi[j] = to_tf32(__uint_as_float(raw[j]));
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          if constexpr (kSplit) {
            mma_tf32(acc[mt][nt], a_lo, b_hi[nt][0], b_hi[nt][1]);
            mma_tf32(acc[mt][nt], a_hi, b_lo[nt][0], b_lo[nt][1]);
          }
          mma_tf32(acc[mt][nt], a_hi, b_hi[nt][0], b_hi[nt][1]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row g + 8. Plus the bias.
  float* y = p.y + static_cast<int64_t>(frame) * p.frame_rows * p.O;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int col = n0 + warp_n * kWarpN + nt * 8 + (lane % 4) * 2;
    const float2 bias = *reinterpret_cast<const float2*>(p.bias + col);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int row = m0 + warp_m * kWarpM + mt * 16 + lane / 4;
      if (row < p.frame_rows) {
        *reinterpret_cast<float2*>(y + static_cast<int64_t>(row) * p.O + col) =
            make_float2(acc[mt][nt][0] + bias.x, acc[mt][nt][1] + bias.y);
      }
      if (row + 8 < p.frame_rows) {
        *reinterpret_cast<float2*>(y + static_cast<int64_t>(row + 8) * p.O + col) =
            make_float2(acc[mt][nt][2] + bias.x, acc[mt][nt][3] + bias.y);
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Result<VaeConvVariant> vae_conv_variant_from_env() {
  const char* v = std::getenv("VORTEX_VARIANT_VAE_CONV");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "gemm") return VaeConvVariant::kGatherGemm;
  if (s == "tf32x3") return VaeConvVariant::kTf32x3;
  if (s == "tf32") return VaeConvVariant::kTf32;
  return invalid_argument("VORTEX_VARIANT_VAE_CONV must be gemm, tf32x3 or tf32 (got '" + s + "')");
}

bool conv3d_implicit_supports(int64_t in_channels, int64_t out_channels) {
  return in_channels % kBlockK == 0 && out_channels % kBlockN == 0;
}

Status conv3d_implicit(const TensorView& x, int64_t clips, const Conv3dTaps& taps, int64_t h_out, int64_t w_out,
                       const TensorView& weight, const TensorView& bias, const TensorView& y, VaeConvVariant variant,
                       cudaStream_t stream) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument("cuda conv3d_implicit: " + what + " (" + describe_view("x", x) + ", " +
                            describe_view("weight", weight) + ", " + describe_view("y", y) + ")");
  };
  const auto f32_device = [](const TensorView& t) { return t.device == Device::kCuda && t.dtype == DType::kF32; };
  if (!f32_device(x) || !f32_device(weight) || !f32_device(bias) || !f32_device(y)) {
    return bad("x, weight, bias and y must be F32 device tensors");
  }
  if (variant == VaeConvVariant::kGatherGemm) return bad("the gather + GEMM variant is not an implicit GEMM");
  if (x.rank() != 4 || !x.is_contiguous()) return bad("x must be contiguous [T, H, W, C]");
  if (clips < 1 || x.shape[0] % clips != 0) return bad("x must hold a whole number of clips");
  const int64_t T = x.shape[0] / clips, C = x.shape[3];
  const int64_t k_total = taps.kt * taps.kh * taps.kw * C;
  if (weight.rank() != 2 || !weight.is_contiguous() || weight.shape[1] != k_total) {
    return bad("weight must be contiguous [O, kt·kh·kw·C]");
  }
  const int64_t O = weight.shape[0];
  if (!conv3d_implicit_supports(C, O)) return bad("C must be a multiple of 32 and O of 128");
  if (bias.rank() != 1 || bias.shape[0] != O) return bad("bias must be [O]");
  if (taps.st < 1 || T + taps.temporal_padding < taps.kt) return bad("the clip is shorter than the temporal kernel");
  const int64_t t_out = (T + taps.temporal_padding - taps.kt) / taps.st + 1;
  if (clips > 1 && t_out != 1) return bad("batched clips must have one output frame");
  const int64_t plane = h_out * w_out, frame_rows = clips * plane;
  if (y.rank() != 2 || !y.is_contiguous() || y.shape[0] != t_out * frame_rows || y.shape[1] != O) {
    return bad("y must be contiguous [T_out·clips·h_out·w_out, O]");
  }
  if (!aligned16(x.data) || !aligned16(weight.data) || !aligned16(bias.data) || !aligned16(y.data)) {
    return bad("x, weight, bias and y must be 16-byte aligned");
  }
  // Every tap of every output frame lies inside its clip (the causal zeros are skipped): the last
  // frame's last tap reads frame (t_out − 1)·st + kt − 1 − temporal_padding, and the spatial
  // reflection needs the window within one reflection of the edges.
  if ((t_out - 1) * taps.st + taps.kt - 1 - taps.temporal_padding >= T) return bad("the taps leave the clip");
  const int64_t h_reach = (h_out - 1) * taps.sh + taps.kh - 1 - taps.pad_top;
  const int64_t w_reach = (w_out - 1) * taps.sw + taps.kw - 1 - taps.pad_left;
  if (taps.pad_top >= x.shape[1] || taps.pad_left >= x.shape[2] || h_reach > 2 * (x.shape[1] - 1) ||
      w_reach > 2 * (x.shape[2] - 1)) {
    return bad("the spatial window reaches past one reflection");
  }
  if (x.numel() >= (int64_t{1} << 31) / 2 || frame_rows >= (int64_t{1} << 31) / 2 || t_out > 65535) {
    return bad("too large for the kernel's 32-bit coordinates");
  }
  if (frame_rows == 0) return ok_status();
  const ImplicitParams p{static_cast<const float*>(x.data),
                         static_cast<const float*>(weight.data),
                         static_cast<const float*>(bias.data),
                         static_cast<float*>(y.data),
                         static_cast<int>(T),
                         static_cast<int>(x.shape[1]),
                         static_cast<int>(x.shape[2]),
                         static_cast<int>(C),
                         static_cast<int>(O),
                         static_cast<int>(taps.kt),
                         static_cast<int>(taps.kh),
                         static_cast<int>(taps.kw),
                         static_cast<int>(taps.st),
                         static_cast<int>(taps.sh),
                         static_cast<int>(taps.sw),
                         static_cast<int>(taps.pad_top),
                         static_cast<int>(taps.pad_left),
                         static_cast<int>(taps.temporal_padding),
                         static_cast<int>(plane),
                         static_cast<int>(w_out),
                         static_cast<int>(frame_rows),
                         k_total};
  const dim3 grid(static_cast<unsigned>((frame_rows + kBlockM - 1) / kBlockM), static_cast<unsigned>(O / kBlockN),
                  static_cast<unsigned>(t_out));
  if (variant == VaeConvVariant::kTf32x3) {
    VORTEX_CUDA_CHECK(
        cudaFuncSetAttribute(conv3d_tf32_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    conv3d_tf32_kernel<true><<<grid, kThreads, kSmemBytes, stream>>>(p);
  } else {
    VORTEX_CUDA_CHECK(
        cudaFuncSetAttribute(conv3d_tf32_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    conv3d_tf32_kernel<false><<<grid, kThreads, kSmemBytes, stream>>>(p);
  }
  VORTEX_CUDA_CHECK_LAUNCH();
  return ok_status();
}

}  // namespace vortex::cuda
