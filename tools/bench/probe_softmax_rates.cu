// Probe: how many cycles one warp-instruction of each softmax step occupies an SM sub-partition
// (SMSP) on this GPU, and whether two steps share a pipe. The attention kernels' softmax is
// bounded by these rates (bench/notes/attention.md): 64 exp2 per thread and key tile, the packs of
// P to bf16 or e4m3, the max reduction. Each thread runs 8 independent chains of one instruction
// (so latency hides behind the other chains), one block of W warps per SM; a warp times its own
// loop with clock64. Reported: cycles per warp-instruction per SMSP = elapsed / (instructions
// issued on that SMSP). With one warp per SMSP the figure includes the warp's own issue limits;
// with four it is the pipe's rate.
//
//   <build>/probe_softmax_rates
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kChains = 8;
constexpr int kIterations = 4096;

enum Step : int {
  kEx2F32,        // ex2.approx.ftz.f32: the exact kernel's exp2
  kEx2F16x2,      // ex2.approx.f16x2: two exp2 per lane
  kEx2Bf16x2,     // ex2.approx.ftz.bf16x2
  kPackBf16x2,    // cvt.rn.bf16x2.f32: P → bf16 (F2FP)
  kPackE4m3x2,    // cvt.rn.satfinite.e4m3x2.f32: P → e4m3
  kPackF16x2,     // cvt.rn.f16x2.f32
  kMaxF32,        // max.f32 (FMNMX)
  kFmaF32,        // fma.rn.f32 (FFMA)
  kEx2AndPack,    // one ex2.f32 and one bf16x2 pack per chain step: do they share a pipe?
  kEx2AndMax,     // one ex2.f32 and one max per chain step
  kStepCount
};
const char* const kStepNames[kStepCount] = {"ex2.approx.ftz.f32",  "ex2.approx.f16x2",          "ex2.approx.ftz.bf16x2",
                                            "cvt.rn.bf16x2.f32",   "cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.f16x2.f32",
                                            "max.f32",             "fma.rn.f32",                "ex2.f32 + bf16x2 pack",
                                            "ex2.f32 + max.f32"};
// Instructions per chain step (the two mixed steps issue two).
const int kInstructionsPerStep[kStepCount] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 2};

template <int kStep>
__device__ __forceinline__ void step(uint32_t& v) {
  if constexpr (kStep == kEx2F32) {
    asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(v));
  } else if constexpr (kStep == kEx2F16x2) {
    asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v));
  } else if constexpr (kStep == kEx2Bf16x2) {
    asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(v));
  } else if constexpr (kStep == kPackBf16x2) {
    asm volatile("cvt.rn.bf16x2.f32 %0, %0, %0;" : "+r"(v));
  } else if constexpr (kStep == kPackE4m3x2) {
    asm volatile("{.reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, %0, %0; cvt.u32.u16 %0, h;}" : "+r"(v));
  } else if constexpr (kStep == kPackF16x2) {
    asm volatile("cvt.rn.f16x2.f32 %0, %0, %0;" : "+r"(v));
  } else if constexpr (kStep == kMaxF32) {
    asm volatile("max.f32 %0, %0, 0f3F000000;" : "+r"(v));
  } else if constexpr (kStep == kFmaF32) {
    asm volatile("fma.rn.f32 %0, %0, 0f3F000000, 0f3F000000;" : "+r"(v));
  } else if constexpr (kStep == kEx2AndPack) {
    asm volatile("{.reg .b32 t; ex2.approx.ftz.f32 t, %0; cvt.rn.bf16x2.f32 %0, t, t;}" : "+r"(v));
  } else {
    asm volatile("{.reg .b32 t; ex2.approx.ftz.f32 t, %0; max.f32 %0, t, 0f3F000000;}" : "+r"(v));
  }
}

template <int kStep>
__global__ void time_step(long long* cycles, uint32_t* sink) {
  uint32_t v[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) v[c] = 0x3f000000u + threadIdx.x + c;
  __syncthreads();
  const long long start = clock64();
  for (int i = 0; i < kIterations; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) step<kStep>(v[c]);
  }
  const long long stop = clock64();
  uint32_t x = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) x ^= v[c];
  if (x == 0x12345678u) sink[threadIdx.x] = x;  // keeps the chains alive
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = stop - start;
}

template <int kStep>
double cycles_per_instruction(int sms, int warps_per_sm, long long* cycles, uint32_t* sink) {
  time_step<kStep><<<sms, warps_per_sm * 32>>>(cycles, sink);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<long long> host(static_cast<size_t>(sms) * warps_per_sm);
  CHECK_CUDA(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  long long longest = 0;
  for (long long c : host) longest = c > longest ? c : longest;
  // Warps w, w+4, ... share SMSP w % 4: each SMSP issues warps_per_sm / 4 warps' instructions.
  const double per_smsp = static_cast<double>(kIterations) * kChains * kInstructionsPerStep[kStep] * (warps_per_sm / 4);
  return static_cast<double>(longest) / per_smsp;
}

template <int... kSteps>
void run_all(std::integer_sequence<int, kSteps...>, int sms, long long* cycles, uint32_t* sink) {
  std::printf("%-30s %14s %14s\n", "step", "1 warp/SMSP", "4 warps/SMSP");
  const auto row = [&](auto step_constant) {
    constexpr int kStep = decltype(step_constant)::value;
    cycles_per_instruction<kStep>(sms, 4, cycles, sink);  // warm-up
    const double one = cycles_per_instruction<kStep>(sms, 4, cycles, sink);
    const double four = cycles_per_instruction<kStep>(sms, 16, cycles, sink);
    std::printf("%-30s %14.2f %14.2f\n", kStepNames[kStep], one, four);
  };
  (row(std::integral_constant<int, kSteps>{}), ...);
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  long long* cycles = nullptr;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&cycles, sizeof(long long) * sms * 16));
  CHECK_CUDA(cudaMalloc(&sink, sizeof(uint32_t) * 16 * 32));
  std::printf("cycles per warp-instruction per SMSP (%d SMs, %d independent chains per thread)\n", sms, kChains);
  run_all(std::make_integer_sequence<int, kStepCount>{}, sms, cycles, sink);
  CHECK_CUDA(cudaFree(cycles));
  CHECK_CUDA(cudaFree(sink));
  return 0;
}
