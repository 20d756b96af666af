// LoRA modules merged into a weight on the device, with the bits of the host merge
// (models/h3/lora.h, merge_loras): serve's adapter switches and `generate --lora` on a GPU then cost
// the weights' upload and a few milliseconds of device work instead of a host merge of every
// targeted linear (seconds per block on a few cores).
//
// The host merge's arithmetic, step for step (DESIGN section 3's rounding points):
//   - each term's delta element is round(scale * chain), chain = ((up[r,0]·down[0,c]) + up[r,1]·down[1,c])
//     + ..., every product and every sum rounded to fp32 (cpu::GemmVariant::kLoops, built with
//     -ffp-contract=off: no FMA);
//   - a plain term: acc = acc + delta; a DoRA term: acc = f[r] · (acc + delta), with
//     f[r] = float(m[r] / sqrt(Σ_c (double(W[r,c]) + double(delta[r,c]))²)), the sum one double
//     FMA chain in column order over the unmerged weight W;
//   - acc starts as W widened to fp32 and is rounded once (RNE) to the output's dtype.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "vortex/status.h"
#include "vortex/tensor.h"

namespace vortex::cuda {

// The most terms one lora_merge call takes (its kernel gets them as a parameter).
constexpr int kMaxLoraMergeTerms = 64;

// One module's factors on the device (F32, contiguous), applied in the order given.
struct LoraMergeTerm {
  const float* up = nullptr;         // [rows, rank]
  const float* down = nullptr;       // [rank, cols]
  const float* magnitude = nullptr;  // DoRA's per-row magnitude [rows]; null for a plain term
  int64_t rank = 0;
  float scale = 0.0f;  // strength · alpha / rank
};

// The device memory a merge of `terms` into a [rows, cols] weight works in: 0 without DoRA terms,
// else their row factors and one band of rows' sums (128 MB at most). A caller that merges many weights keeps
// one workspace for all of them (the merges reuse it in the stream's order) rather than a
// stream-ordered allocation for each: the default pool keeps nothing across a synchronisation, so
// each would be mapped again.
size_t dora_workspace_bytes(int64_t rows, int64_t cols, const std::vector<LoraMergeTerm>& terms);

// out = round(weight + the terms), as above. `weight`: a contiguous [rows, cols] F32, BF16 or F16
// device tensor; `out`: contiguous, the same shape, F32 or BF16, and may be `weight` itself; at most
// kMaxLoraMergeTerms terms. Queued on `stream` without waiting for it. With DoRA terms it also
// needs `dora_workspace` (a device tensor of at least dora_workspace_bytes) and `zero_rows` (device
// memory, one value per term), and checks on the device that every DoRA row's W + delta has a
// nonzero norm for its magnitude to scale: zero_rows[t] gets ~0, or term t's first row without one,
// whose merged row is then NaN. The caller reads zero_rows once the stream has run the merge (the
// host merge's error for that row), which lets it queue the next weight first. The factors must
// stay until the merge has run.
Status lora_merge(const Tensor& weight, const Tensor& out, const std::vector<LoraMergeTerm>& terms,
                  const Tensor& dora_workspace, unsigned long long* zero_rows, cudaStream_t stream);

}  // namespace vortex::cuda
