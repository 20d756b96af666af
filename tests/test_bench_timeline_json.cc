// bench::timeline_json, the summary of an attention kernel's clock marks in the bench manifests:
// per consumer, the median cycles from each mark to the next and of the whole round.
#include <gtest/gtest.h>

#include <utility>

#include "bench/timeline_json.h"

namespace vortex::bench {
namespace {

// 8 warps, `tiles` tiles, marks a, b, c per tile t >= 1 at 1000·t (+ warp), then + 100 (+ 300 for
// the second consumer) and + 400; tile 0 unmarked.
cuda::KernelTimeline synthetic(int tiles) {
  cuda::KernelTimeline t;
  t.events = {"a", "b", "c"};
  t.warps = 8;
  t.tiles = tiles;
  t.cycles.assign(static_cast<size_t>(8 * tiles * 3), 0);
  for (int w = 0; w < 8; ++w) {
    for (int tile = 1; tile < tiles; ++tile) {
      const long long base = 1000LL * tile + w;
      long long* marks = &t.cycles[(static_cast<size_t>(w) * tiles + tile) * 3];
      marks[0] = base;
      marks[1] = base + (w < 4 ? 100 : 300);
      marks[2] = base + 400;
    }
  }
  return t;
}

TEST(BenchTimelineJson, MedianIntervalsPerConsumer) {
  const nlohmann::json j = timeline_json(synthetic(6));
  EXPECT_EQ(j["tiles"], 6);
  EXPECT_EQ(j["events"].size(), 3u);
  for (const auto& [consumer, first] : {std::pair{"consumer0", 100}, std::pair{"consumer1", 300}}) {
    const nlohmann::json& phases = j.at(consumer);
    ASSERT_EQ(phases.size(), 4u) << consumer;  // a→b, b→c, c→next a, the round
    EXPECT_EQ(phases[0]["from_to"], "a -> b");
    EXPECT_EQ(phases[0]["cycles"], first) << consumer;
    EXPECT_EQ(phases[1]["cycles"], 400 - first) << consumer;
    EXPECT_EQ(phases[2]["from_to"], "c -> a (next tile)");
    EXPECT_EQ(phases[2]["cycles"], 600) << consumer;
    EXPECT_EQ(phases[3]["from_to"], "round");
    EXPECT_EQ(phases[3]["cycles"], 1000) << consumer;
  }
}

TEST(BenchTimelineJson, TooFewTilesGiveNoIntervals) {
  const nlohmann::json j = timeline_json(synthetic(3));
  EXPECT_EQ(j["tiles"], 3);
  EXPECT_FALSE(j.contains("consumer0"));
}

}  // namespace
}  // namespace vortex::bench
