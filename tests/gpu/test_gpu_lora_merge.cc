// The LoRA merge on the device (cuda/lora_merge.h through h3::lora_merging_filler) against the host
// merge (h3::merge_loras), bit for bit: plain terms of ranks that cross the host's 256-wide k
// blocks and the kernel's 32-wide rank chunks, DoRA terms before and after plain ones, DoRA bands
// wider than the scratch, F32 / BF16 / F16 base weights, an fp32 island, lora_B biases (merged on
// the host), a DoRA module meeting a bias on one linear (the whole linear on the host), and the
// error of a DoRA row with nothing to scale, which the device checks while the host goes on
// (reported by finish(), or by a fill once many checks are pending).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "models/h3/cuda_lora_merge.h"
#include "models/h3/lora.h"

namespace vortex {
namespace {

using test::must;
using test::random_tensor;

struct Linear {
  std::string name;  // without ".weight"
  int64_t out, in;
  DType dtype;
  bool bias;
};

// up · down of a module about `delta` in size, on weights about 0.05.
h3::LoraModule module_for(const Linear& l, int64_t rank, uint64_t seed, bool dora, bool bias, double scale) {
  h3::LoraModule m;
  m.target = l.name;
  m.source = l.name + ".lora_A.weight (seed " + std::to_string(seed) + ")";
  m.down = random_tensor({rank, l.in}, DType::kF32, seed, 0.1f);
  m.up = random_tensor({l.out, rank}, DType::kF32, seed + 1, 0.1f);
  if (dora) m.magnitude = random_tensor({l.out}, DType::kF32, seed + 2, 0.05f, 1.0f);
  if (bias) m.bias = random_tensor({l.out}, DType::kF32, seed + 3, 0.02f);
  m.scale = scale;
  return m;
}

class GpuLoraMerge : public test::GpuTest {
 protected:
  // Every tensor of `base` filled through the merging filler into device tensors of the model's
  // dtypes (F32 for fp32 islands, else BF16), compared with the host merge of the same adapters.
  void expect_host_bits(const h3::NamedTensors& base, std::shared_ptr<const h3::LoraStack> stack) {
    h3::NamedTensors host = base;
    must(h3::merge_loras(host, stack->applications(), DType::kBF16));
    std::set<std::string> targets;
    for (const h3::LoraAdapter& adapter : stack->adapters) {
      for (const h3::LoraModule& m : adapter.modules) {
        for (std::string& name : m.merged_tensors()) targets.insert(std::move(name));
      }
    }
    const h3::WeightFiller fill = h3::lora_merging_filler(base, stack, DType::kBF16, stream_);
    for (size_t i = 0; i < base.size(); ++i) {
      const auto& [name, tensor] = base[i];
      ArenaScope scope(arena_);
      const DType dtype = h3::is_fp32_island(name) ? DType::kF32 : DType::kBF16;
      const Tensor dst = must(arena_.alloc(tensor.shape(), dtype));
      must(fill({name, tensor.shape(), h3::is_fp32_island(name)}, dst));
      const Tensor got = to_host(dst);
      const Tensor want = host[i].second.dtype() == dtype ? host[i].second : must(host[i].second.to(dtype));
      ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
      EXPECT_EQ(std::memcmp(got.data(), want.contiguous().data(), got.nbytes()), 0) << name;
      const bool changed = std::memcmp(got.data(), must(tensor.to(dtype)).data(), got.nbytes()) != 0;
      EXPECT_EQ(changed, targets.count(name) == 1) << name;
    }
    must(fill.finish());
  }
};

TEST_F(GpuLoraMerge, TheDeviceMergeIsTheHostMergeBitForBit) {
  const std::vector<Linear> linears = {
      {"blocks.0.plain", 37, 129, DType::kBF16, false},       // two plain terms, rank 300 > 256
      {"blocks.0.dora_between", 64, 1000, DType::kBF16, false},  // plain, DoRA, plain
      {"blocks.0.f32_base", 300, 33, DType::kF32, false},     // read from a copy (F32 into BF16)
      {"blocks.0.f16_base", 40, 48, DType::kF16, false},
      {"proj_in", 32, 16, DType::kF32, true},                 // an fp32 island
      {"blocks.0.with_bias", 50, 70, DType::kBF16, true},     // a lora_B bias
      {"blocks.0.dora_meets_bias", 24, 40, DType::kBF16, true},
      {"blocks.1.wide", 1043, 16403, DType::kBF16, false},    // DoRA in two bands, the second's last rows a part group
  };
  h3::NamedTensors base;
  for (size_t i = 0; i < linears.size(); ++i) {
    const Linear& l = linears[i];
    base.emplace_back(l.name + ".weight", random_tensor({l.out, l.in}, l.dtype, 100 + i, 0.05f));
    if (l.bias) base.emplace_back(l.name + ".bias", random_tensor({l.out}, l.dtype, 200 + i, 0.05f));
  }
  auto stack = std::make_shared<h3::LoraStack>();
  stack->adapters.resize(3);
  stack->strengths = {0.8, -1.3, 0.6};
  h3::LoraAdapter &a = stack->adapters[0], &b = stack->adapters[1], &c = stack->adapters[2];
  const auto at = [&](const char* name) -> const Linear& {
    for (const Linear& l : linears) {
      if (l.name == name) return l;
    }
    throw std::runtime_error(name);
  };
  a.modules.push_back(module_for(at("blocks.0.plain"), 7, 1, false, false, 1.0));
  b.modules.push_back(module_for(at("blocks.0.plain"), 300, 11, false, false, 0.25));
  a.modules.push_back(module_for(at("blocks.0.dora_between"), 4, 21, false, false, 0.5));
  c.modules.push_back(module_for(at("blocks.0.dora_between"), 16, 31, true, false, 1.0 / 16));
  b.modules.push_back(module_for(at("blocks.0.dora_between"), 3, 41, false, false, 2.0));
  a.modules.push_back(module_for(at("blocks.0.f32_base"), 33, 51, false, false, 1.0));
  c.modules.push_back(module_for(at("blocks.0.f32_base"), 8, 61, true, false, 1.0));
  b.modules.push_back(module_for(at("blocks.0.f16_base"), 1, 71, false, false, 3.0));
  a.modules.push_back(module_for(at("proj_in"), 5, 81, false, false, 1.0));
  c.modules.push_back(module_for(at("proj_in"), 2, 91, true, false, 0.5));
  a.modules.push_back(module_for(at("blocks.0.with_bias"), 6, 101, false, true, 1.0));
  b.modules.push_back(module_for(at("blocks.0.with_bias"), 2, 111, false, false, 1.0));
  a.modules.push_back(module_for(at("blocks.0.dora_meets_bias"), 4, 121, false, true, 1.0));
  c.modules.push_back(module_for(at("blocks.0.dora_meets_bias"), 4, 131, true, false, 1.0));
  c.modules.push_back(module_for(at("blocks.1.wide"), 5, 141, true, false, 1.0));
  expect_host_bits(base, stack);
}

// The filler's copies run on a stream of their own, ahead of the caller's: work the caller queued
// on its stream before a fill, and after an earlier fill into the same memory, still reads what was
// there. The caller's stream is held up by a host function meanwhile, so copies that did not wait
// for it would land first.
TEST_F(GpuLoraMerge, CopiesWaitForTheCallersWorkOnTheMemoryTheyWrite) {
  const Linear q{"blocks.0.attn.to_q", 96, 160, DType::kBF16, false};
  const Linear k{"blocks.0.attn.to_k", 96, 160, DType::kBF16, false};
  h3::NamedTensors base = {{q.name + ".weight", random_tensor({96, 160}, DType::kBF16, 1, 0.05f)},
                           {k.name + ".weight", random_tensor({96, 160}, DType::kBF16, 2, 0.05f)}};
  auto stack = std::make_shared<h3::LoraStack>();
  stack->adapters.resize(1);
  stack->strengths = {1.0};
  stack->adapters[0].modules.push_back(module_for(q, 4, 3, false, false, 1.0));
  stack->adapters[0].modules.push_back(module_for(k, 4, 13, true, false, 1.0));
  h3::NamedTensors host = base;
  must(h3::merge_loras(host, stack->applications(), DType::kBF16));
  const Tensor before = random_tensor({96, 160}, DType::kBF16, 4, 1.0f);
  const Tensor dst = to_device(before);
  const Tensor seen_before = must(arena_.alloc({96, 160}, DType::kBF16));
  const Tensor seen_q = must(arena_.alloc({96, 160}, DType::kBF16));
  const auto hold_stream = [&] {
    ASSERT_EQ(cudaLaunchHostFunc(
                  stream_, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr),
              cudaSuccess);
  };
  const auto copy_into = [&](const Tensor& to) {
    ASSERT_EQ(cudaMemcpyAsync(to.data(), dst.data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
  };
  const h3::WeightFiller fill = h3::lora_merging_filler(base, stack, DType::kBF16, stream_);
  hold_stream();
  copy_into(seen_before);  // queued before the batch's first fill
  must(fill({base[0].first, {96, 160}, false}, dst));
  hold_stream();
  copy_into(seen_q);  // queued between two fills into the same memory
  must(fill({base[1].first, {96, 160}, false}, dst));
  must(fill.finish());
  EXPECT_EQ(test::compare(to_host(seen_before), before).differing, 0);
  EXPECT_EQ(test::compare(to_host(seen_q), host[0].second).differing, 0);
  EXPECT_EQ(test::compare(to_host(dst), host[1].second).differing, 0);
}

// `count` linears of 8 x 20, each with a rank-3 DoRA module; those in `unscalable` have a row 5
// whose W + delta is all zeros.
struct DoraLinears {
  h3::NamedTensors base;
  std::shared_ptr<h3::LoraStack> stack = std::make_shared<h3::LoraStack>();
};

DoraLinears dora_linears(int count, const std::set<int>& unscalable) {
  DoraLinears d;
  d.stack->adapters.resize(1);
  d.stack->strengths = {1.0};
  for (int i = 0; i < count; ++i) {
    const Linear l{"blocks." + std::to_string(i) + ".attn.to_q", 8, 20, DType::kBF16, false};
    Tensor weight = random_tensor({l.out, l.in}, DType::kF32, 7 + i, 0.05f);
    h3::LoraModule m = module_for(l, 3, 9 + 10 * i, true, false, 1.0);
    if (unscalable.count(i)) {
      for (int64_t c = 0; c < l.in; ++c) weight.data_as<float>()[5 * l.in + c] = 0.0f;
      for (int64_t k = 0; k < 3; ++k) m.up.data_as<float>()[5 * 3 + k] = 0.0f;
    }
    d.stack->adapters[0].modules.push_back(m);
    d.base.emplace_back(l.name + ".weight", must(weight.to(DType::kBF16)));
  }
  return d;
}

TEST_F(GpuLoraMerge, ADoraRowWithNothingToScaleIsTheHostsError) {
  const DoraLinears d = dora_linears(1, {0});
  h3::NamedTensors host = d.base;
  const Status want = h3::merge_loras(host, d.stack->applications(), DType::kBF16);
  ASSERT_FALSE(want.ok());
  const Tensor dst = must(arena_.alloc({8, 20}, DType::kBF16));
  const h3::WeightFiller fill = h3::lora_merging_filler(d.base, d.stack, DType::kBF16, stream_);
  must(fill({d.base[0].first, {8, 20}, false}, dst));  // the check runs on the device meanwhile
  const Status got = fill.finish();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.message(), want.message());
  EXPECT_NE(got.message().find("row 5 of"), std::string::npos) << got.message();
  EXPECT_TRUE(fill.finish().ok());  // reported once
}

// More DoRA weights than the filler keeps checks for: the first unscalable one in fill order is
// reported, by the fill that found its checks full, and a later one by finish().
TEST_F(GpuLoraMerge, ManyDoraWeightsReportTheFirstUnscalableRowInFillOrder) {
  const DoraLinears d = dora_linears(300, {150, 280});
  const auto host_error = [&](int i) {
    h3::NamedTensors one = {d.base[static_cast<size_t>(i)]};
    return h3::merge_loras(one, d.stack->applications(), DType::kBF16);
  };
  const h3::WeightFiller fill = h3::lora_merging_filler(d.base, d.stack, DType::kBF16, stream_);
  const Tensor dst = must(arena_.alloc({8, 20}, DType::kBF16));
  std::vector<int> failed_at;
  std::vector<Status> errors;
  for (int i = 0; i < 300; ++i) {
    const Status s = fill({d.base[static_cast<size_t>(i)].first, {8, 20}, false}, dst);
    if (!s.ok()) {
      failed_at.push_back(i);
      errors.push_back(s);
    }
  }
  const Status last = fill.finish();
  ASSERT_EQ(failed_at.size(), 1u);
  EXPECT_GT(failed_at[0], 150);
  EXPECT_EQ(errors[0].message(), host_error(150).message());
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.message(), host_error(280).message());
}

}  // namespace
}  // namespace vortex
