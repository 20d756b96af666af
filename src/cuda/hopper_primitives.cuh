// Hopper (sm_90a) building blocks shared by the attention kernels v1 (attention_wgmma.cu), v2
// (attention_wgmma_v2.cu) and int8fp8 (attention_int8fp8.cu): shared-memory mbarriers, TMA tensor
// loads (multicast within a cluster), named barriers, setmaxnreg, 128-byte-swizzle wgmma
// descriptors, the bf16 and 8-bit wgmma shapes the kernels issue (and the tf32 ones of the video
// VAE encoder's convolution), and the host-side tensor-map encoding of a strided [N, H, D] bf16
// view; ldmatrix and the cp.async copies for the kernels that load fragments from shared memory
// themselves (attention v0 and v1's Q, the video VAE encoder's implicit-GEMM convolution in
// vae_conv3d_tc.cu). Device code only for translation units compiled for sm_90a (wgmma and
// setmaxnreg do not exist before it).
#pragma once

#include <cuda.h>          // CUtensorMap and its enums (types only: the encoder comes via the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda::hopper {

// ---- shared memory, mbarriers, TMA ----------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Orders this thread's earlier shared-memory writes before later reads through the async proxy
// (TMA, wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Makes the initialised barriers visible to the async proxy (TMA's complete_tx) and to the CTA.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  fence_proxy_async_shared();
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Returns once the barrier's phase with this parity has completed. A fresh barrier is in phase 0,
// so waiting for parity 1 returns at once: the producer's first pass over an empty ring.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Whether the barrier's phase with this parity has completed, without waiting: a consumer asks
// early and overlaps the answer's latency with other work, then waits only if it was not.
__device__ __forceinline__ bool mbarrier_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// One [rows, 64 channels] box at (channel, head, row) of a [N, H, D] tensor map into shared memory,
// completing on `bar`. Rows past N arrive as zeros (and still count in the transaction bytes).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int channel, int head, int row,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(channel), "r"(head), "r"(row), "r"(bar)
      : "memory");
}

// ---- thread-block clusters ------------------------------------------------------------------------------

// This CTA's rank in its cluster (0 for a launch without clusters).
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// Every thread of every CTA of the cluster meets here; this CTA's earlier shared-memory writes
// (barrier initialisations) are visible to the others after it. All threads of each warp must call it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrives on the mbarrier at shared address `bar` of cluster CTA `cta` (this CTA's own included),
// with the default release at CTA scope: a release at cluster scope would wait for the thread's
// products still in flight.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
// One word into shared memory `addr` of cluster CTA `cta` (the same offset as in this CTA), then an
// arrival on that CTA's mbarrier at `bar` that releases the word to it at cluster scope.
__device__ __forceinline__ void send_to_cluster_cta(uint32_t addr, uint32_t value, uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote_addr, remote_bar;\n"
      "mapa.shared::cluster.u32 remote_addr, %0, %3;\n"
      "mapa.shared::cluster.u32 remote_bar, %2, %3;\n"
      "st.shared::cluster.u32 [remote_addr], %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote_bar];\n"
      "}\n" ::"r"(addr),
      "r"(value), "r"(bar), "r"(cta)
      : "memory");
}
// Waits for the phase of this parity of an mbarrier that another CTA of the cluster arrives on,
// acquiring at cluster scope what that CTA released with its arrival (send_to_cluster_cta).
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// A cluster's producer before its CTA exits: the other CTAs write into this one's rings and arrive
// on its barriers until their consumers have released the last slots, so it waits for the releases
// of the last min(slots, stages) slots of a ring (the empty mbarrier of stage s at empty + 8·s;
// slot t used stage t % stages in phase (t / stages) & 1).
__device__ __forceinline__ void wait_for_last_releases(uint32_t empty, int slots, int stages) {
  for (int slot = slots > stages ? slots - stages : 0; slot < slots; ++slot) {
    mbarrier_wait(empty + 8 * (slot % stages), (slot / stages) & 1);
  }
}
// tma_load's box written to the same shared address of every CTA in `cta_mask` (bit i: cluster
// rank i), each completing its transaction bytes on the mbarrier at `bar` of that CTA.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int channel, int head,
                                                   int row, uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(channel), "r"(head), "r"(row), "r"(bar), "h"(cta_mask)
      : "memory");
}

// 16-byte global→shared copy through L2 only (cp.async.cg); src_bytes = 0 fills zeros, which keeps
// tail rows finite (0 · garbage could be NaN). Groups of them are committed and waited for with
// all but the newest kPending groups complete.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8×8 b16 matrices from shared memory, lane l giving the address of row l % 8 of matrix l / 8;
// register i of lane l holds row l / 4, elements 2·(l % 4) and + 1, of matrix i (the A fragment of
// mma m16n8k16 and of a warp's 16 rows of wgmma m64nNk16). volatile: a shared address may hold a
// different tile later.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// ---- named barriers, register budgets --------------------------------------------------------------

// A warpgroup: the four warps that a wgmma and a setmaxnreg act on together.
constexpr int kWarpgroupThreads = 128;
// The registers per thread a CTA of `threads` is launched with at one CTA an SM: the file's 65,536
// over the threads, in the allocation's steps of 8 (168 for three warpgroups, 128 for four).
constexpr int launch_registers_per_thread(int threads) {
  const int per_thread = 65536 / threads / 8 * 8;
  return per_thread < 255 ? per_thread : 255;
}
// Whether the setmaxnreg budgets (registers per thread) of one producer warpgroup and `consumers`
// consumer warpgroups fit. setmaxnreg only moves registers between the CTA's own warps, so the
// budgets must fit what the CTA was launched with, not the whole file: 112 + 2 · 200 (65,536) does
// not fit three warpgroups' 384 · 168 = 64,512, and the consumers' setmaxnreg.inc would wait for
// registers no warp can give back (what a warp-specialized conv with those budgets did, it seems:
// it hung; bench/notes/video_vae_encoder.md, session 43).
constexpr bool register_budgets_fit(int producer, int consumers, int consumer) {
  const int threads = kWarpgroupThreads * (1 + consumers);
  return kWarpgroupThreads * (producer + consumers * consumer) <= threads * launch_registers_per_thread(threads);
}
static_assert(register_budgets_fit(24, 2, 240) && register_budgets_fit(24, 3, 160), "the attention kernels' budgets");
static_assert(!register_budgets_fit(112, 2, 200), "over three warpgroups' launch allocation");

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- wgmma descriptors (128-byte swizzle) ------------------------------------------------------------

// The 128-byte swizzle repeats every 8 rows of 128 bytes; tiles start on such a period (base
// offset 0), and 8-row core-matrix groups of a K-major operand are one period apart.
constexpr int kSwizzleBytes = 128;
constexpr int kSwizzlePeriodBytes = 8 * kSwizzleBytes;

// Shared-memory matrix descriptor: start address, leading and stride byte offsets (all >> 4, 14
// bits each, at bits 0, 16 and 32), base offset 0, swizzle mode 1 = 128-byte at bits 62-63.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
// K-major operand (the contraction dim is contiguous): rows in 8-row groups one period apart;
// the leading offset is unused under a swizzle (encoded 1).
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t address) {
  return smem_descriptor(address, 16, kSwizzlePeriodBytes);
}
// MN-major operand (the contraction dim is the row; transpose bit set in the instruction): the
// leading offset steps between 64-channel column halves, the stride offset between 8-row groups.
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t address, uint32_t half_bytes) {
  return smem_descriptor(address, half_bytes, kSwizzlePeriodBytes);
}
// Descriptor increment (16-byte units) to k16 step s of a K-major operand of 128 channels stored
// as two [rows, 64] column halves `half_bytes` apart: byte 32·(s % 4) of half s / 4. Added to the
// start address; the hardware applies the swizzle to the final address, as TMA did.
__device__ __forceinline__ constexpr uint64_t k_major_step(int s, int half_bytes) {
  return static_cast<uint64_t>(((s / 4) * half_bytes + (s % 4) * 32) >> 4);
}

// ---- wgmma ----------------------------------------------------------------------------------------

#define VORTEX_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63}"
#define VORTEX_WGMMA_D64_OPERANDS(c) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), \
    c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), \
    c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), \
    c(d[28]), c(d[29]), c(d[30]), c(d[31]), c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), \
    c(d[37]), c(d[38]), c(d[39]), c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), \
    c(d[46]), c(d[47]), c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), \
    c(d[55]), c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])
#define VORTEX_WGMMA_D88 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
    "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
    "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87}"
#define VORTEX_WGMMA_D88_OPERANDS(c) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), \
    c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), \
    c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), \
    c(d[28]), c(d[29]), c(d[30]), c(d[31]), c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), \
    c(d[37]), c(d[38]), c(d[39]), c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), \
    c(d[46]), c(d[47]), c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), \
    c(d[55]), c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63]), \
    c(d[64]), c(d[65]), c(d[66]), c(d[67]), c(d[68]), c(d[69]), c(d[70]), c(d[71]), c(d[72]), \
    c(d[73]), c(d[74]), c(d[75]), c(d[76]), c(d[77]), c(d[78]), c(d[79]), c(d[80]), c(d[81]), \
    c(d[82]), c(d[83]), c(d[84]), c(d[85]), c(d[86]), c(d[87])


// d = a·b (scale_d 0: d is not read) or d += a·b (scale_d 1), a [64, 16] and b [16, N] both
// K-major in shared memory, fp32 accumulators in the m64nNk16 layout: thread t of the warpgroup
// holds rows 16·(t/32) + (t%32)/4 (elements 4j, 4j+1) and that + 8 (4j+2, 4j+3), columns
// 8j + 2·(t%4) and + 1, for j < N/8.
template <int kScaleD>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VORTEX_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("=f")
        : "l"(a), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VORTEX_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("+f")
        : "l"(a), "l"(b), "r"(1));
  }
}
template <int kScaleD>
__device__ __forceinline__ void wgmma_m64n176k16_ss(float (&d)[88], uint64_t a, uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 " VORTEX_WGMMA_D88 ", %88, %89, p, 1, 1, 0, 0;\n}\n"
        : VORTEX_WGMMA_D88_OPERANDS("=f")
        : "l"(a), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 " VORTEX_WGMMA_D88 ", %88, %89, p, 1, 1, 0, 0;\n}\n"
        : VORTEX_WGMMA_D88_OPERANDS("+f")
        : "l"(a), "l"(b), "r"(1));
  }
}
// d = a·b (scale_d 0) or d += a·b (scale_d 1) in tf32: a [64, 8] and b [8, 128], both K-major
// fp32 rows in shared memory (tf32 takes no transpose), of which the tensor core reads each
// value's tf32 bits (sign, exponent, the mantissa's top 10). The accumulator layout of
// wgmma_m64n128k16_ss.
template <int kScaleD>
__device__ __forceinline__ void wgmma_m64n128k8_tf32_ss(float (&d)[64], uint64_t a, uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " VORTEX_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("=f")
        : "l"(a), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " VORTEX_WGMMA_D64 ", %64, %65, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("+f")
        : "l"(a), "l"(b), "r"(1));
  }
}
// The same with a [64, 8] in registers: the m16n8k8 tf32 A fragment of the warp's 16 rows,
// {row g, k t}, {g + 8, t}, {g, t + 4}, {g + 8, t + 4} (g = lane / 4, t = lane % 4).
template <int kScaleD>
__device__ __forceinline__ void wgmma_m64n128k8_tf32_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " VORTEX_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("=f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " VORTEX_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("+f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}
// The S = Q·Kᵀ shape of an N-key tile, picked by its accumulator count (N / 2 per thread).
template <int kScaleD, int kAccumulators>
__device__ __forceinline__ void wgmma_ss(float (&d)[kAccumulators], uint64_t a, uint64_t b) {
  static_assert(kAccumulators == 64 || kAccumulators == 88, "S tiles of 128 or 176 keys");
  if constexpr (kAccumulators == 64) {
    wgmma_m64n128k16_ss<kScaleD>(d, a, b);
  } else {
    wgmma_m64n176k16_ss<kScaleD>(d, a, b);
  }
}

// d += a·b, a [64, 16] bf16 in registers (the accumulator layout of a k16 column slice, packed:
// {row g, k 2q..2q+1}, {g+8, same}, {g, k+8}, {g+8, k+8}), b [16, 128] MN-major in shared memory
// (transpose bit 1).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VORTEX_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : VORTEX_WGMMA_D64_OPERANDS("+f")
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
}
// d = a·b (scale_d 0) or d += a·b (scale_d 1), a [64, 16] bf16 in registers (layout as above),
// b [16, 128] K-major in shared memory (transpose bit 0): S = Q·Kᵀ with Q held in registers.
template <int kScaleD>
__device__ __forceinline__ void wgmma_m64n128k16_rs_kmajor(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                           uint32_t a3, uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VORTEX_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("=f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VORTEX_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("+f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
}
// ---- 8-bit wgmma (the int8fp8 attention kernel) -----------------------------------------------------

// d (s32) = a·b (scale_d 0) or d += a·b (scale_d 1): a [64, 32] and b [32, 128] int8, both K-major
// in shared memory; the accumulator layout of m64nNk16 above, over k32 steps.
template <int kScaleD>
__device__ __forceinline__ void wgmma_s8(uint32_t (&d)[64], uint64_t a, uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " VORTEX_WGMMA_D64 ", %64, %65, p;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("=r")
        : "l"(a), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " VORTEX_WGMMA_D64 ", %64, %65, p;\n}\n"
        : VORTEX_WGMMA_D64_OPERANDS("+r")
        : "l"(a), "l"(b), "r"(1));
  }
}

#undef VORTEX_WGMMA_D64
#undef VORTEX_WGMMA_D64_OPERANDS

#define VORTEX_WGMMA_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define VORTEX_WGMMA_D32_OPERANDS(c) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), \
    c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), \
    c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), \
    c(d[28]), c(d[29]), c(d[30]), c(d[31])
// d (f32) = a·b (scale_d 0) or d += a·b for 64 output columns: a [64, 32] e4m3 in registers
// (4 × 4 bytes: rows g / g+8, k 4t..4t+3 and 16+4t..16+4t+3), b [32, 64] e4m3 K-major in shared
// memory, d 32 fp32 registers.
template <int kScaleD>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " VORTEX_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D32_OPERANDS("=f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " VORTEX_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D32_OPERANDS("+f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
}
// d += a·b for 64 output columns: a [64, 16] bf16 in registers (wgmma_m64n128k16_rs's layout),
// b [16, 64] MN-major in shared memory (transpose bit 1), d 32 fp32 registers: P·V at head dim 64.
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2,
                                                   uint32_t a3, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " VORTEX_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : VORTEX_WGMMA_D32_OPERANDS("+f")
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
}
#undef VORTEX_WGMMA_D32
#undef VORTEX_WGMMA_D32_OPERANDS

#define VORTEX_WGMMA_D36 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}"
#define VORTEX_WGMMA_D36_OPERANDS(c) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), c(d[8]), c(d[9]), \
    c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), c(d[16]), c(d[17]), c(d[18]), \
    c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), c(d[24]), c(d[25]), c(d[26]), c(d[27]), \
    c(d[28]), c(d[29]), c(d[30]), c(d[31]), c(d[32]), c(d[33]), c(d[34]), c(d[35])
// wgmma_e4m3 for 72 output columns: b [32, 72], d 36 fp32 registers.
template <int kScaleD>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[36], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t b) {
  if constexpr (kScaleD == 0) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 " VORTEX_WGMMA_D36 ", {%36, %37, %38, %39}, %40, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D36_OPERANDS("=f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(0));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 " VORTEX_WGMMA_D36 ", {%36, %37, %38, %39}, %40, p, 1, 1;\n}\n"
        : VORTEX_WGMMA_D36_OPERANDS("+f")
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
  }
}
#undef VORTEX_WGMMA_D36
#undef VORTEX_WGMMA_D36_OPERANDS
#undef VORTEX_WGMMA_D88
#undef VORTEX_WGMMA_D88_OPERANDS

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// ptxas follows wgmma groups within one loop iteration only: reading the accumulator of a wgmma
// issued in an earlier iteration under wait_group N > 0 (other groups still pending) makes it
// serialize every wgmma of the kernel (info C7514; correct output, 20–30% slower in the int8fp8
// kernel). Retire everything from the previous iteration with wait_group 0 before reading, or issue
// and read within one iteration. tools/kernels/check_ptxas.sh (ctest ptxas_wgmma_kernels) fails
// on C7514.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler sees a wgmma's registers written when it is issued, not when it completes, and
// does not know that wgmma.fence orders register accesses. These empty statements "rewrite"
// registers at a fixed point among the volatile wgmma statements: after a wgmma_wait, so reads of
// accumulators stay below the wait and registers an in-flight wgmma still reads (P) are not reused
// before it; before a wgmma_fence, so the writes it must order (rescaled O, packed P) precede it.
// They bind the C++ compiler only: they emit no PTX, so ptxas, which treats a wgmma's A registers
// as read at the issue, may give an A register's physical register to a new value before the wait.
// Where a new value is computed while a product that reads A is in flight, read the old registers
// again after the wait with a real instruction (attention_int8fp8.cu, consume).
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin_registers(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---- softmax arithmetic ------------------------------------------------------------------------------

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx(-inf) = 0, as masking needs
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Row r (0: the thread's row g, 1: row g + 8) of an f32 wgmma accumulator tile of N / 4 key pairs
// (elements 4j + 2r and 4j + 2r + 1): S → P = exp2(S·scale·log2e − m_new·scale·log2e) in place, with
// m_new = row_max[r] already updated, and this lane's share of the row sum (two chains), folded into
// row_sum[r] after rescaling it by alpha[r]. The exact kernels' softmax (v1 and v2).
template <int N>
__device__ __forceinline__ void exponentiate_row(float (&s)[N], int r, const float (&row_max)[2], float (&row_sum)[2],
                                                 const float (&alpha)[2], float scale_log2) {
  const float offset = -row_max[r] * scale_log2;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    s[4 * j + 2 * r] = fast_exp2(fmaf(s[4 * j + 2 * r], scale_log2, offset));
    s[4 * j + 2 * r + 1] = fast_exp2(fmaf(s[4 * j + 2 * r + 1], scale_log2, offset));
    sum0 += s[4 * j + 2 * r];
    sum1 += s[4 * j + 2 * r + 1];
  }
  row_sum[r] = row_sum[r] * alpha[r] + (sum0 + sum1);
}

// Two fp32 → one bf16x2 register, RNE; `lo` (the smaller column index) in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- host: clusters of CTAs sharing K / V loads ----------------------------------------------------

// The attention kernels share each K / V load between the 2 CTAs of a cluster (TMA multicast) for
// sweeps of at least this many query-key pairs over all heads: there the 700 W cap sets the clock
// and the saved L2 traffic raises it; shorter sweeps lose the cycles the pair spends waiting for its
// slower CTA (bench/notes/attention.md, sessions 11 and 12). A judgment between the measured shapes.
constexpr int64_t kMulticastMinPairs = int64_t{1} << 33;
inline int multicast_cluster_ctas(int64_t nq, int64_t nk, int64_t heads) {
  return nq * nk * heads >= kMulticastMinPairs ? 2 : 1;
}
// A caller's cluster_ctas: 0 for multicast_cluster_ctas's choice, 1 or 2 as given; anything else
// invalid_argument naming `who`.
inline Result<int> resolve_cluster_ctas(const char* who, int cluster_ctas, int64_t nq, int64_t nk, int64_t heads) {
  if (cluster_ctas == 0) return multicast_cluster_ctas(nq, nk, heads);
  if (cluster_ctas == 1 || cluster_ctas == 2) return cluster_ctas;
  return invalid_argument(std::string(who) + ": cluster_ctas must be 0 (chosen by size), 1 or 2, got " +
                          std::to_string(cluster_ctas));
}

// The grid of a key-sweep kernel: query blocks (x, padded to whole clusters) by heads (y).
inline dim3 cluster_grid(int64_t q_blocks, int cluster_ctas, int64_t heads) {
  return dim3(static_cast<unsigned>((q_blocks + cluster_ctas - 1) / cluster_ctas * cluster_ctas),
              static_cast<unsigned>(heads));
}

// The launch attribute for clusters of `cluster_ctas` CTAs along x.
inline cudaLaunchAttribute cluster_dimension(int cluster_ctas) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster_ctas);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// ---- host: tensor maps ------------------------------------------------------------------------------

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled through the runtime's driver entry point (the library does not link
// libcuda); null when the driver lacks it.
inline EncodeTiled tensor_map_encoder() {
  static const EncodeTiled encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encoder;
}

// A [N, H, head_dim] bf16 view as a 3-d tensor map {D, H, N} with [box_rows, 64] boxes (64 bf16 =
// the 128-byte swizzle's widest box) and the 128-byte swizzle. The stride of a size-1 dim is never
// applied; it is given a valid value. `who` prefixes messages ("attention v2").
inline Status encode_head_view(EncodeTiled encode, CUtensorMap* map, const char* who, const char* name,
                               const TensorView& t, int head_dim, int box_rows) {
  const int64_t rows = t.shape[0], heads = t.shape[1];
  const int64_t head_bytes = heads == 1 ? int64_t{head_dim} * 2 : t.strides[1] * 2;
  const int64_t row_bytes = rows == 1 ? heads * head_bytes : t.strides[0] * 2;
  if (head_bytes <= 0 || row_bytes <= 0) {
    return unimplemented(std::string(who) + ": " + name + " has a non-positive stride");
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_bytes), static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kSwizzleBytes / 2), 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, t.data, dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return unimplemented(std::string(who) + ": the driver rejects the tensor map of " + name + " (CUresult " +
                         std::to_string(static_cast<int>(result)) + ")");
  }
  return ok_status();
}

}  // namespace vortex::cuda::hopper
