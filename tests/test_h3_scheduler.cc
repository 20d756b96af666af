#include <gtest/gtest.h>

#include "formats/safetensors.h"
#include "sampling/h3_scheduler.h"

namespace vortex {
namespace {

std::string golden(const std::string& rel) { return std::string(VORTEX_SOURCE_DIR) + "/tests/golden/" + rel; }

TEST(H3Scheduler, SigmaGridsEqualTheReferenceBitForBit) {
  auto file = SafetensorsFile::open(golden("schedule.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  for (int steps : {2, 8, 12, 30, 50}) {
    for (int shift : {12, 3}) {
      const std::string key = "steps" + std::to_string(steps) + ".shift" + std::to_string(shift);
      auto sigmas = sampling::sigma_grid(steps, static_cast<float>(shift));
      ASSERT_TRUE(sigmas.ok());
      auto ref = file->get("sigmas." + key);
      ASSERT_TRUE(ref.ok());
      ASSERT_EQ(static_cast<int64_t>(sigmas->size()), ref->numel()) << key;
      for (int64_t i = 0; i < ref->numel(); ++i) {
        EXPECT_EQ((*sigmas)[i], ref->data_as<float>()[i]) << key << " sigma " << i;
      }
      auto ref_t = file->get("timesteps." + key);
      ASSERT_TRUE(ref_t.ok());
      const auto t = sampling::timesteps_from_sigmas(*sigmas);
      ASSERT_EQ(static_cast<int64_t>(t.size()), ref_t->numel());
      for (int64_t i = 0; i < ref_t->numel(); ++i) EXPECT_EQ(t[i], ref_t->data_as<float>()[i]) << key << " t " << i;
    }
  }
}

TEST(H3Scheduler, RejectsBadArguments) {
  EXPECT_FALSE(sampling::sigma_grid(1, 12.0f).ok());
  EXPECT_FALSE(sampling::sigma_grid(0, 12.0f).ok());
  EXPECT_FALSE(sampling::sigma_grid(8, 0.0f).ok());
  Tensor a = Tensor::zeros({2, 3}, DType::kF32), b = Tensor::zeros({3, 2}, DType::kF32);
  EXPECT_FALSE(sampling::euler_step(a, b, 0.5f, 0.5f, 0.25f).ok());
}

TEST(H3Scheduler, EulerStepLandsOnTheDenoisedEstimateAtSigmaZero) {
  Tensor x = Tensor::from_f32({1.0f, -2.0f}, {1, 2});
  Tensor v = Tensor::from_f32({0.5f, 4.0f}, {1, 2});
  // t = 0.75 -> sigma 0.25; x0 = x + 0.25 v; sigma_next = 0 -> x_next = x0.
  ASSERT_TRUE(sampling::euler_step(x, v, 0.75f, 0.25f, 0.0f).ok());
  EXPECT_EQ(x.data_as<float>()[0], 1.125f);
  EXPECT_EQ(x.data_as<float>()[1], -1.0f);
}

}  // namespace
}  // namespace vortex
