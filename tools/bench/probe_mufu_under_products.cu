// Probe: how a warpgroup's instruction stream (exp2, the softmax's mix, FFMA) and other
// warpgroups' tensor products in its CTA slow each other. The int8fp8 attention kernel's softmax
// takes ~1,420 cycles for 66 exp2 per warp, whose XU time is 528 (bench/notes/attention.md,
// sessions 15–20), while the other consumers issue and wait for their products.
//
// One CTA per SM: one stream warpgroup (eight independent chains per thread, as
// probe_softmax_rates) beside 0, 1 or 2 product warpgroups that issue the kernel's Q·Kᵀ product
// (four wgmma m64n128k32 .s32.s8.s8, both operands K-major in shared memory) back to back until the
// stream's warpgroup is done. The streams: bare ex2; the softmax's mix per score (the kernel's
// VIADD + FFMA + MUFU); that mix with a quarter, a half or all of its score pairs' exp2 computed on
// the FMA pipe in f16x2 instead (half_pair_exp2); bare FFMA at the issue rate, with its two other
// operands immediates (one register read) or registers (three), and with a zero-length nanosleep
// after every eight. Reported per stream and product count, medians over the SMs:
//   - the stream's cycles per chain step on one SMSP (one of its warps per SMSP);
//   - the product warpgroups' tensor-pipe share: int8 operations per cycle / 8,192 (dense int8 peak
//     per SM), also without any stream beside them.
// A last table repeats ex2, the mix and FFMA beside two product warpgroups whose groups chain 1, 2,
// 4 or 8 k32 steps: whether the slowdown is paid per group or per cycle of tensor work.
//
//   <build>/probe_mufu_under_products
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/hopper_primitives.cuh"
#include "probe_check.h"

namespace {

using vortex::cuda::hopper::k_major_descriptor;
using vortex::cuda::hopper::wgmma_commit;
using vortex::cuda::hopper::wgmma_fence;
using vortex::cuda::hopper::wgmma_s8;
using vortex::cuda::hopper::wgmma_wait;

constexpr int kChains = 8;
constexpr int kIterations = 8192;
constexpr int kThreadsPerWarpgroup = 128;
// Q8 tile [64 rows, 128 B] and K8 tile [128 rows, 128 B], 1024-byte aligned (the swizzle period).
constexpr int kQBytes = 64 * 128, kKBytes = 128 * 128;
constexpr int kSmemBytes = kQBytes + kKBytes + 1024;

struct Result {
  long long stream_cycles;     // the stream warpgroup's loop (its slowest warp)
  long long product_cycles;  // the product warpgroups' loops (the longest)
  long long products;        // k32 product steps issued by all product warpgroups
};

enum Stream : int {
  kEx2,
  kSoftmaxMix,
  kMixHalfQuarter,
  kMixHalfHalf,
  kMixHalfAll,
  kFfma,
  kFfmaRegisters,
  kFfmaNanosleep,
  kStreamCount
};
const char* const kStreamNames[kStreamCount] = {"ex2",         "softmax mix",  "mix, 1/4 f16",   "mix, 1/2 f16",
                                                "mix, f16",    "ffma, 1 reg",  "ffma, 3 regs",   "ffma+sleep0"};

// The softmax's two scores x, y (int32 bits) to exp2 on the FMA pipe, packed f16x2: the fp32
// exponent argument t as the mix computes it, rounded to f16x2 and clamped at −11 (below e4m3's
// reach once scaled); n = round(t) by the 1.5·2^10 shift; 2^f for f = t − n ∈ [−½, ½] by a degree-2
// polynomial; 2^n as the f16 exponent field built from the shifted bits by one integer multiply-add
// (both lanes at once: (r − 0x65F165F1)·1024 never borrows across them). x ← the two exp2, y ← 2^n.
__device__ __forceinline__ void half_pair_exp2(uint32_t& x, uint32_t& y) {
  asm volatile(
      "{.reg .b32 tx, ty, h, r, n, f, q, e, k;\n"
      " add.u32 tx, %0, 0x4B400000; add.u32 ty, %1, 0x4B400000;\n"
      " fma.rn.f32 tx, tx, 0f38000000, 0fCB400000; fma.rn.f32 ty, ty, 0f38000000, 0fCB400000;\n"
      " cvt.rn.f16x2.f32 h, ty, tx;\n"
      " mov.b32 k, 0xC980C980; max.f16x2 h, h, k;\n"
      " mov.b32 k, 0x66006600; add.rn.f16x2 r, h, k; sub.rn.f16x2 n, r, k; sub.rn.f16x2 f, h, n;\n"
      " mov.b32 k, 0x33B033B0; mov.b32 e, 0x398C398C; fma.rn.f16x2 q, f, k, e; mul.rn.f16x2 q, q, f;\n"
      " mad.lo.u32 e, r, 1024, 0x3A683C00; fma.rn.f16x2 %0, q, e, e; mov.b32 %1, e;}"
      : "+r"(x), "+r"(y));
}

// One step of every chain; a and b are loop-invariant registers (the 3-register FFMA's operands).
template <int kStream>
__device__ __forceinline__ void stream_step(uint32_t (&v)[kChains], uint32_t a, uint32_t b) {
  constexpr bool kMix = kStream == kSoftmaxMix || kStream == kMixHalfQuarter || kStream == kMixHalfHalf ||
                        kStream == kMixHalfAll;
  // The mixes' last 0, 1, 2 or 4 of their kChains / 2 score pairs take the f16x2 path.
  constexpr int kHalfPairs = kStream == kMixHalfQuarter ? 1 : kStream == kMixHalfHalf ? 2 : kStream == kMixHalfAll ? 4 : 0;
  static_assert(kChains == 8, "the f16 shares assume four pairs");
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    if constexpr (kMix) {
      if (c >= kChains - 2 * kHalfPairs) {
        if (c % 2 == 0) half_pair_exp2(v[c], v[c + 1]);
      } else {
        // The softmax per score: bits of 1.5·2^23 + s (integer add), FFMA by the tile factor, exp2.
        asm volatile(
            "{.reg .b32 t; add.u32 t, %0, 0x4B400000; fma.rn.f32 t, t, 0f38000000, 0fCB400000; "
            "ex2.approx.ftz.f32 %0, t;}"
            : "+r"(v[c]));
      }
    } else if constexpr (kStream == kFfma || kStream == kFfmaNanosleep) {
      asm volatile("fma.rn.f32 %0, %0, 0f3F000000, 0f3F000000;" : "+r"(v[c]));
      // After the step's last FFMA, a zero-length sleep: does it hand the issue slot to the
      // product warps that the always-ready stream otherwise starves?
      if (kStream == kFfmaNanosleep && c == kChains - 1) asm volatile("nanosleep.u32 0;");
    } else if constexpr (kStream == kFfmaRegisters) {
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+r"(v[c]) : "r"(a), "r"(b));
    } else {
      asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(v[c]));
    }
  }
}

// One product group: kSteps chained k32 steps into one accumulator (the tile's four steps, cycled),
// then committed and waited for.
template <int kSteps>
__device__ __forceinline__ void product_group(uint32_t (&s)[64], uint64_t q, uint64_t k) {
  wgmma_fence();
  wgmma_s8<0>(s, q, k);
#pragma unroll
  for (int step = 1; step < kSteps; ++step) wgmma_s8<1>(s, q + 2 * (step % 4), k + 2 * (step % 4));  // +32 B per step
  wgmma_commit();
  wgmma_wait<0>();
}

template <int kStream, int kGroupSteps>
__global__ void __launch_bounds__(3 * kThreadsPerWarpgroup, 1)
    mufu_under_products(int product_warpgroups, bool stream_active, Result* results, uint32_t* sink) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ volatile int stream_done;
  __shared__ int stop_products[3];  // each product warpgroup's copy of stream_done, read by all its warps
  __shared__ unsigned long long product_count;
  __shared__ long long product_cycles;
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  uint8_t* tiles = smem_raw + (base - static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)));
  for (int i = threadIdx.x; i < (kQBytes + kKBytes) / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(tiles)[i] = 0x01010101u * (i % 7);
  }
  if (threadIdx.x == 0) {
    stream_done = 0;
    product_count = 0;
    product_cycles = 0;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the tiles, written generically, read by wgmma
  __syncthreads();
  const int warpgroup = threadIdx.x / kThreadsPerWarpgroup;
  if (warpgroup == 0) {
    uint32_t v[kChains];
#pragma unroll
    for (int c = 0; c < kChains; ++c) v[c] = 0x3f000000u + threadIdx.x + c;
    const long long start = clock64();
    if (stream_active) {
      // 0.5 or 0.5 + an ulp by thread: values the compiler cannot fold into immediates.
      const uint32_t a = 0x3F000000u + (threadIdx.x & 1u), b = 0x3F000000u + ((threadIdx.x >> 1) & 1u);
      for (int i = 0; i < kIterations; ++i) stream_step<kStream>(v, a, b);
    } else {  // the products' baseline: as long as the ex2 loop, without issuing
      while (clock64() - start < 8 * kChains * kIterations) __nanosleep(500);
    }
    const long long stop = clock64();
    uint32_t x = 0;
#pragma unroll
    for (int c = 0; c < kChains; ++c) x ^= v[c];
    if (x == 0x12345678u) sink[threadIdx.x] = x;
    // The slowest warp's loop; then stop the products.
    atomicMax(reinterpret_cast<unsigned long long*>(&results[blockIdx.x].stream_cycles),
              static_cast<unsigned long long>(stop - start));
    // The products stop once all four stream warps are done (named barrier 4: this warpgroup only).
    asm volatile("bar.sync 4, %0;" ::"n"(kThreadsPerWarpgroup) : "memory");
    if (threadIdx.x == 0) stream_done = 1;
  } else if (warpgroup <= product_warpgroups) {
    const uint64_t q = k_major_descriptor(base), k = k_major_descriptor(base + kQBytes);
    uint32_t s[64];
    long long issued = 0;
    const long long start = clock64();
    // wgmma is warpgroup-wide (.sync.aligned): the four warps agree on each iteration through a
    // named barrier (1 + the warpgroup) around the flag's copy.
    for (;;) {
      if (threadIdx.x % kThreadsPerWarpgroup == 0) stop_products[warpgroup] = stream_done;
      asm volatile("bar.sync %0, %1;" ::"r"(warpgroup + 1), "n"(kThreadsPerWarpgroup) : "memory");
      const bool stop_now = stop_products[warpgroup] != 0;
      asm volatile("bar.sync %0, %1;" ::"r"(warpgroup + 1), "n"(kThreadsPerWarpgroup) : "memory");
      if (stop_now) break;
      product_group<kGroupSteps>(s, q, k);
      issued += kGroupSteps;
    }
    const long long stop = clock64();
    uint32_t x = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) x ^= s[i];
    if (x == 0x12345678u) sink[threadIdx.x] = x;
    if (threadIdx.x % kThreadsPerWarpgroup == 0) {
      atomicAdd(&product_count, static_cast<unsigned long long>(issued));
      atomicMax(reinterpret_cast<unsigned long long*>(&product_cycles), static_cast<unsigned long long>(stop - start));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    results[blockIdx.x].products = static_cast<long long>(product_count);
    results[blockIdx.x].product_cycles = product_cycles;
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// One configuration: returns the stream's cycles per chain step (0 without a stream) and stores
// the products' tensor-pipe share in *tensor_percent.
template <int kStream, int kGroupSteps = 4>
double run(int sms, int product_warpgroups, bool stream_active, Result* results, uint32_t* sink,
           double* tensor_percent) {
  const auto kernel = mufu_under_products<kStream, kGroupSteps>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  std::vector<Result> host(sms);
  for (int pass = 0; pass < 2; ++pass) {  // the first pass warms up
    CHECK_CUDA(cudaMemset(results, 0, sizeof(Result) * sms));
    kernel<<<sms, 3 * kThreadsPerWarpgroup, kSmemBytes>>>(product_warpgroups, stream_active, results, sink);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  CHECK_CUDA(cudaMemcpy(host.data(), results, sizeof(Result) * sms, cudaMemcpyDeviceToHost));
  std::vector<double> per_step, tensor_share;
  for (const Result& r : host) {
    // One warp of the stream warpgroup per SMSP: each SMSP issues kIterations · kChains chain steps.
    per_step.push_back(static_cast<double>(r.stream_cycles) / (static_cast<double>(kIterations) * kChains));
    if (r.product_cycles > 0) {
      const double ops = static_cast<double>(r.products) * 64 * 128 * 32 * 2;
      tensor_share.push_back(ops / static_cast<double>(r.product_cycles) / 8192.0);
    }
  }
  *tensor_percent = tensor_share.empty() ? 0.0 : 100.0 * median(tensor_share);
  return stream_active ? median(per_step) : 0.0;
}

template <int kStream>
void row(int sms, Result* results, uint32_t* sink) {
  double tensor[3] = {};
  double cycles[3];
  for (int p = 0; p <= 2; ++p) cycles[p] = run<kStream>(sms, p, true, results, sink, &tensor[p]);
  std::printf("%-12s %8.2f %8.2f (%4.1f%%) %8.2f (%4.1f%%)\n", kStreamNames[kStream], cycles[0], cycles[1], tensor[1],
              cycles[2], tensor[2]);
}

template <int kSteps>
void group_row(int sms, Result* results, uint32_t* sink) {
  double alone = 0.0, t_ex2 = 0.0, t_mix = 0.0, t_ffma = 0.0;
  run<kEx2, kSteps>(sms, 2, false, results, sink, &alone);
  const double ex2 = run<kEx2, kSteps>(sms, 2, true, results, sink, &t_ex2);
  const double mix = run<kSoftmaxMix, kSteps>(sms, 2, true, results, sink, &t_mix);
  const double ffma = run<kFfma, kSteps>(sms, 2, true, results, sink, &t_ffma);
  std::printf("%d steps: %5.1f%% | %6.2f (%4.1f%%) | %6.2f (%4.1f%%) | %5.2f (%4.1f%%)\n", kSteps, alone, ex2, t_ex2, mix,
              t_mix, ffma, t_ffma);
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  Result* results = nullptr;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&results, sizeof(Result) * sms));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(uint32_t) * 3 * kThreadsPerWarpgroup));
  std::printf("%d SMs, one CTA each: a stream warpgroup (%d chains per thread) beside 0-2 product warpgroups\n", sms,
              kChains);
  for (int p = 1; p <= 2; ++p) {
    double tensor = 0.0;
    run<kEx2>(sms, p, false, results, sink, &tensor);
    std::printf("%d product warpgroups alone: tensor pipe %.1f%%\n", p, tensor);
  }
  std::printf("cycles per chain step   alone   beside 1 (tensor pipe)   beside 2 (tensor pipe)\n");
  row<kEx2>(sms, results, sink);
  row<kSoftmaxMix>(sms, results, sink);
  row<kMixHalfQuarter>(sms, results, sink);
  row<kMixHalfHalf>(sms, results, sink);
  row<kMixHalfAll>(sms, results, sink);
  row<kFfma>(sms, results, sink);
  row<kFfmaRegisters>(sms, results, sink);
  row<kFfmaNanosleep>(sms, results, sink);
  // If the products' accumulators were written back once per group rather than per k32 step, the
  // streams' slowdown per unit of tensor-pipe share would fall with longer groups.
  std::printf("beside 2 product warpgroups, by k32 steps per group: pipe alone | ex2 (pipe) | mix (pipe) | ffma (pipe)\n");
  group_row<1>(sms, results, sink);
  group_row<2>(sms, results, sink);
  group_row<4>(sms, results, sink);
  group_row<8>(sms, results, sink);
  CHECK_CUDA(cudaFree(results));
  CHECK_CUDA(cudaFree(sink));
  return 0;
}
