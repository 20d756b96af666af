// cuda::rms_norm_fused against the separate launches it replaces (gated_residual / residual_add,
// rms_norm, adaln_modulate) on the same random inputs: BITWISE equal outputs and residual streams,
// which is what lets the block use it by default (DESIGN section 3). Widths cover every rms_norm
// variant: the group kernel (24, 200), the register-cached block kernel (5376), and the re-reading
// block kernel (5001 at an odd column offset: scalar loads, more than the cache holds); with bf16
// operands at 5376 and an aligned view, the fused pass runs on packed bf16 pairs (norm.cu's
// rms_norm_fused_bf16_kernel) while the separate launches keep the scalar steps; the video VAE
// decoder's blocks at 2048 (an fp32 residual stream and gate, bf16 or fp32 branch and output).
// Views are column slices of wider buffers, aligned and odd; with a weight and without. Also: bad
// gate / modulation rows give NaN rows as the separate ops do, and bad arguments are refused with
// the operand named.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/elementwise.h"
#include "gpu/gpu_test_util.h"

namespace vortex {
namespace {

using test::columns;
using test::compare;
using test::must;
using test::random_tensor;

class GpuNormFused : public test::GpuTest {};

struct Case {
  int64_t rows, channels, col;
  DType dtype;
  // The branch and the output in bf16 whatever `dtype` (x, gate, tables and weight) is: the video
  // VAE decoder's blocks, an fp32 residual stream with bf16 activations.
  bool bf16_branch_and_output = false;
};
constexpr Case kCases[] = {{1, 24, 8, DType::kBF16},     {129, 24, 3, DType::kF32},  {7, 200, 8, DType::kBF16},
                           {1000, 5376, 8, DType::kBF16}, {37, 5376, 3, DType::kBF16}, {5, 5001, 3, DType::kBF16},
                           {9, 5376, 8, DType::kF32},     {1801, 2048, 0, DType::kF32, true},
                           {301, 2048, 0, DType::kF32}};

enum class Residual { kNone, kPlain, kGated };

std::string describe(const Case& c, Residual r, bool modulate) {
  return "rows " + std::to_string(c.rows) + " channels " + std::to_string(c.channels) + " col " +
         std::to_string(c.col) + " " + dtype_name(c.dtype) + (c.bf16_branch_and_output ? " bf16 branch/out" : "") +
         " residual " + std::to_string(static_cast<int>(r)) + (modulate ? " modulate" : "");
}

TEST_F(GpuNormFused, BitwiseEqualToTheSeparateLaunches) {
  uint64_t seed = 9100;
  constexpr int64_t kPad = 16, kTableRows = 6;
  for (const Case& c : kCases) {
    for (Residual residual : {Residual::kNone, Residual::kPlain, Residual::kGated}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool modulate = variant % 2 == 1, with_weight = variant < 2;
        ArenaScope scope(arena_);
        const std::string what = describe(c, residual, modulate) + (with_weight ? "" : " no weight");
        const int64_t n = c.rows, C = c.channels;
        const Tensor x = random_tensor({n, C + kPad}, c.dtype, ++seed, 3.0f, 0.2f);
        const DType act = c.bf16_branch_and_output ? DType::kBF16 : c.dtype;
        const Tensor branch = random_tensor({n, C + kPad}, act, ++seed);
        const Tensor table = random_tensor({kTableRows, 3 * C}, c.dtype, ++seed, 0.5f);
        const Tensor weight = random_tensor({C}, c.dtype, ++seed, 0.2f, 1.0f);
        const Tensor y0 = random_tensor({n, C + kPad}, act, ++seed);
        const std::vector<int32_t> gate_row = test::random_indices<int32_t>(n, kTableRows, ++seed);
        const std::vector<int32_t> mod_row = test::random_indices<int32_t>(n, kTableRows, ++seed);
        const int32_t* gate_row_d = device_vector(gate_row);
        const int32_t* mod_row_d = device_vector(mod_row);
        const Tensor td = to_device(table), bd = to_device(branch), wd = to_device(weight);
        const TensorView w = wd.view(), gate = columns(td, 0, C), shift = columns(td, C, C),
                         scale = columns(td, 2 * C, C), b = columns(bd, c.col, C);

        // The separate launches.
        const Tensor xs = to_device(x), ys = to_device(y0);
        const TensorView xs_v = columns(xs, c.col, C), ys_v = columns(ys, c.col, C);
        if (residual == Residual::kGated) VORTEX_EXPECT_OK(cuda::gated_residual(xs_v, gate, gate_row_d, b, stream_));
        if (residual == Residual::kPlain) VORTEX_EXPECT_OK(cuda::residual_add(xs_v, b, stream_));
        const TensorView* wp = with_weight ? &w : nullptr;
        VORTEX_EXPECT_OK(cuda::rms_norm(xs_v, wp, 1e-6f, ys_v, stream_));
        if (modulate) VORTEX_EXPECT_OK(cuda::adaln_modulate(ys_v, shift, scale, mod_row_d, ys_v, stream_));

        // One fused pass.
        const Tensor xf = to_device(x), yf = to_device(y0);
        cuda::NormFusion fusion;
        if (residual != Residual::kNone) fusion.branch = &b;
        if (residual == Residual::kGated) {
          fusion.gate = &gate;
          fusion.gate_row = gate_row_d;
        }
        if (modulate) {
          fusion.shift = &shift;
          fusion.scale = &scale;
          fusion.mod_row = mod_row_d;
        }
        VORTEX_EXPECT_OK(cuda::rms_norm_fused(columns(xf, c.col, C), wp, 1e-6f, fusion, columns(yf, c.col, C), stream_));

        test::expect_bitwise(compare(to_host(yf), to_host(ys)), what + ": output");
        test::expect_bitwise(compare(to_host(xf), to_host(xs)), what + ": residual stream");
      }
    }
  }
}

// Out-of-range table rows: the separate ops write NaN rows; so must the fused pass, row by row.
TEST_F(GpuNormFused, BadTableRowsGiveTheSameNanRows) {
  constexpr int64_t n = 4, C = 64;
  const Tensor x = random_tensor({n, C}, DType::kBF16, 9201);
  const Tensor branch = random_tensor({n, C}, DType::kBF16, 9202);
  const Tensor table = random_tensor({2, 3 * C}, DType::kBF16, 9203);
  const std::vector<int32_t> gate_row = {0, 5, 1, 0}, mod_row = {1, 0, -1, 0};
  const int32_t* gate_row_d = device_vector(gate_row);
  const int32_t* mod_row_d = device_vector(mod_row);
  const Tensor td = to_device(table), bd = to_device(branch);
  const TensorView gate = columns(td, 0, C), shift = columns(td, C, C), scale = columns(td, 2 * C, C);
  const TensorView b = bd.view();
  const Tensor xs = to_device(x), ys = to_device(x), xf = to_device(x), yf = to_device(x);
  VORTEX_EXPECT_OK(cuda::gated_residual(xs.view(), gate, gate_row_d, b, stream_));
  VORTEX_EXPECT_OK(cuda::rms_norm(xs.view(), nullptr, 1e-6f, ys.view(), stream_));
  VORTEX_EXPECT_OK(cuda::adaln_modulate(ys.view(), shift, scale, mod_row_d, ys.view(), stream_));
  const cuda::NormFusion fusion{&b, &gate, gate_row_d, &shift, &scale, mod_row_d};
  VORTEX_EXPECT_OK(cuda::rms_norm_fused(xf.view(), nullptr, 1e-6f, fusion, yf.view(), stream_));
  const Tensor got = to_host(yf), want = to_host(ys);
  for (int64_t i = 0; i < n; ++i) {
    const bool bad = gate_row[i] >= 2 || mod_row[i] < 0;
    EXPECT_EQ(std::isnan(bf16_bits_to_f32(got.data_as<uint16_t>()[i * C])), bad)
        << "row " << i;
  }
  test::expect_bitwise(compare(got, want), "bad rows");
}

// qk_norm_rope on the q and k column slices of a fused [N, 3·H·D] buffer against rms_norm +
// apply_rope on a copy: the released head (D 128, rotary 96), a full rotation, no rotation, D 64,
// a 24-wide head (4-lane groups), F32, an odd column offset (the separate-launch fallback),
// 28,693 (token, head) rows (1,794 blocks), and head counts that exercise the several heads per
// thread: H3's 56 (four per thread, the last rows of the block idle), 37 (three), 70 (two chunks
// per token), 40 heads of 64 (two per thread) and 56 in F32; the video VAE decoder's heads
// (32 of 64, rotary 48, no weight) in bf16 and F32.
struct QkCase {
  int64_t rows, heads, dim, rot, col;
  DType dtype;
  bool weighted = true;
};
constexpr QkCase kQkCases[] = {{37, 3, 128, 96, 0, DType::kBF16}, {129, 2, 128, 128, 8, DType::kBF16},
                               {5, 4, 128, 0, 0, DType::kBF16},   {33, 2, 64, 64, 0, DType::kBF16},
                               {17, 5, 24, 16, 0, DType::kBF16},  {9, 2, 128, 96, 0, DType::kF32},
                               {11, 2, 128, 96, 3, DType::kBF16},
                               {4099, 7, 128, 96, 0, DType::kBF16},
                               {301, 56, 128, 128, 0, DType::kBF16}, {67, 37, 128, 96, 0, DType::kBF16},
                               {45, 70, 128, 96, 8, DType::kBF16},   {23, 40, 64, 64, 0, DType::kBF16},
                               {19, 56, 128, 96, 0, DType::kF32},
                               {1801, 32, 64, 48, 0, DType::kBF16, false},
                               {301, 32, 64, 48, 0, DType::kF32, false}};

TEST_F(GpuNormFused, QkNormRopeIsBitwiseEqualToTheSeparateLaunches) {
  uint64_t seed = 9400;
  for (const QkCase& c : kQkCases) {
    ArenaScope scope(arena_);
    const std::string what = "rows " + std::to_string(c.rows) + " heads " + std::to_string(c.heads) + " dim " +
                             std::to_string(c.dim) + " rot " + std::to_string(c.rot) + " col " + std::to_string(c.col) +
                             " " + dtype_name(c.dtype) + (c.weighted ? "" : " no weight");
    const int64_t inner = c.heads * c.dim, width = 3 * inner + 16;
    const Tensor qkv = random_tensor({c.rows, width}, c.dtype, ++seed, 2.0f, 0.3f);
    const Tensor wq = random_tensor({c.dim}, c.dtype, ++seed, 0.2f, 1.0f);
    const Tensor wk = random_tensor({c.dim}, c.dtype, ++seed, 0.2f, 1.0f);
    const Tensor cos = random_tensor({c.rows, std::max<int64_t>(c.rot, 1)}, DType::kF32, ++seed);
    const Tensor sin = random_tensor({c.rows, std::max<int64_t>(c.rot, 1)}, DType::kF32, ++seed);
    const Tensor wqd = to_device(wq), wkd = to_device(wk), cd = to_device(cos), sd = to_device(sin);
    const TensorView wqv = wqd.view(), wkv = wkd.view(), cv = cd.view(), sv = sd.view();
    const TensorView* wqp = c.weighted ? &wqv : nullptr;
    const TensorView* wkp = c.weighted ? &wkv : nullptr;
    const bool rope = c.rot > 0;
    const Tensor fused = to_device(qkv), separate = to_device(qkv);
    auto heads = [&](const Tensor& t, int64_t which) { return test::head_view(t, c.col + which * inner, c.heads, c.dim); };
    VORTEX_EXPECT_OK(cuda::rms_norm(heads(separate, 0), wqp, 1e-6f, heads(separate, 0), stream_));
    VORTEX_EXPECT_OK(cuda::rms_norm(heads(separate, 1), wkp, 1e-6f, heads(separate, 1), stream_));
    if (rope) {
      VORTEX_EXPECT_OK(cuda::apply_rope(heads(separate, 0), cv, sv, stream_));
      VORTEX_EXPECT_OK(cuda::apply_rope(heads(separate, 1), cv, sv, stream_));
    }
    VORTEX_EXPECT_OK(cuda::qk_norm_rope(heads(fused, 0), heads(fused, 1), wqp, wkp, 1e-6f, rope ? &cv : nullptr,
                                        rope ? &sv : nullptr, stream_));
    test::expect_bitwise(compare(to_host(fused), to_host(separate)), what);
  }
}

TEST_F(GpuNormFused, RefusesInconsistentFusions) {
  const Tensor x = to_device(random_tensor({4, 64}, DType::kBF16, 9301));
  const Tensor y = to_device(random_tensor({4, 64}, DType::kBF16, 9302));
  const Tensor other = to_device(random_tensor({4, 32}, DType::kBF16, 9303));
  const TensorView wrong_branch = other.view(), xv = x.view();
  const int32_t* rows = device_vector(std::vector<int32_t>{0, 0, 0, 0});
  auto expect_invalid = [](const Status& s, const std::string& names) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(names), std::string::npos) << s.to_string();
  };
  expect_invalid(cuda::rms_norm_fused(x.view(), nullptr, 1e-6f, {&wrong_branch}, y.view(), stream_), "branch");
  expect_invalid(cuda::rms_norm_fused(x.view(), nullptr, 1e-6f, {&xv}, x.view(), stream_), "output apart");
  const TensorView table = wrong_branch;
  expect_invalid(cuda::rms_norm_fused(x.view(), nullptr, 1e-6f, {nullptr, nullptr, nullptr, &table, &table, rows},
                                      y.view(), stream_),
                 "shift");
  const TensorView yv = y.view();
  expect_invalid(
      cuda::rms_norm_fused(x.view(), nullptr, 1e-6f, {nullptr, &yv, rows, nullptr, nullptr, nullptr}, y.view(), stream_),
      "gate");
}

}  // namespace
}  // namespace vortex
