// bench::timeline_json, the summary of an attention kernel's clock marks in the bench manifests:
// per consumer, the median cycles from each mark to the next and of the whole round, and how far apart
// its warps reach each mark; of its CTA records, where the CTAs' time goes outside the sweep and the clock
// they ran at; repeated launches; the launch count from the environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

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
    EXPECT_FALSE(phases[3].contains("other_consumer_in_this_phase"));
  }
  // The other consumer's warp on the same sub-partition marks 4 cycles later: consumer 0's a -> b
  // [0, 100) meets consumer 1's [4, 304) for 96 cycles, its b -> c [100, 400) meets [304, 404) for 96.
  const auto share = [&](const char* consumer, int phase) {
    return j.at(consumer)[phase]["other_consumer_in_this_phase"].get<double>();
  };
  EXPECT_DOUBLE_EQ(share("consumer0", 0), 0.96);
  EXPECT_DOUBLE_EQ(share("consumer1", 0), 96.0 / 300.0);
  EXPECT_DOUBLE_EQ(share("consumer0", 1), 96.0 / 300.0);
  EXPECT_DOUBLE_EQ(share("consumer1", 1), 0.96);
  EXPECT_DOUBLE_EQ(share("consumer0", 2), 596.0 / 600.0);
  // Warp w marks w cycles after its consumer's first warp: a spread of 3 at every mark, the fourth
  // warp always the last; the round has neither.
  for (const char* consumer : {"consumer0", "consumer1"}) {
    for (int phase = 0; phase < 3; ++phase) {
      EXPECT_EQ(j.at(consumer)[phase]["warp_spread_at_start"], 3) << consumer << " " << phase;
      EXPECT_EQ(j.at(consumer)[phase]["last_warp_share_at_start"], (std::vector<double>{0.0, 0.0, 0.0, 1.0}));
    }
    EXPECT_FALSE(j.at(consumer)[3].contains("warp_spread_at_start"));
  }
}

TEST(BenchTimelineJson, TooFewTilesGiveNoIntervals) {
  const nlohmann::json j = timeline_json(synthetic(3));
  EXPECT_EQ(j["tiles"], 3);
  EXPECT_FALSE(j.contains("consumer0"));
}

// A CTA on `sm` from `start` (cycles; ns = cycles / 2 + 5000): prologue 100, sweep 1,000,
// epilogue `epilogue` cycles.
cuda::CtaSpan span(int sm, long long start, long long epilogue) {
  cuda::CtaSpan c;
  c.sm = sm;
  const long long marks[cuda::kCtaMarks] = {start, start + 100, start + 1100, start + 1100 + epilogue};
  for (int m = 0; m < cuda::kCtaMarks; ++m) {
    c.cycles[m] = marks[m];
    c.ns[m] = marks[m] / 2 + 5000;
  }
  return c;
}

TEST(BenchTimelineJson, CtaSummary) {
  // SM 0 runs three CTAs with gaps of 50 and 70 cycles, SM 1 two with a gap of 10 and the latest end,
  // SM 2 one; one CTA has no end mark.
  std::vector<cuda::CtaSpan> ctas = {span(0, 1000, 200), span(1, 1000, 200), span(2, 1000, 300),
                                     span(0, 2350, 200), span(1, 2310, 3000), span(0, 3720, 200)};
  cuda::CtaSpan unfinished = span(2, 2400, 200);
  unfinished.ns[static_cast<int>(cuda::CtaMark::kEnd)] = 0;
  ctas.push_back(unfinished);

  cuda::KernelTimeline t;
  t.events = {"a"};
  t.warps = 8;
  t.tiles = 2;
  t.cycles.assign(16, 0);
  t.ctas = ctas;
  const nlohmann::json j = timeline_json(t).at("ctas");
  EXPECT_EQ(j["count"], 7);
  EXPECT_EQ(j["unrecorded"], 1);
  EXPECT_EQ(j["sms"], 3);
  EXPECT_EQ(j["ctas_per_sm"]["fewest"], 1);
  EXPECT_EQ(j["ctas_per_sm"]["most"], 3);
  const nlohmann::json& m = j["median_cycles"];
  EXPECT_EQ(m["prologue (start -> first tile done)"], 100);
  EXPECT_EQ(m["sweep (first tile done -> last product landed)"], 1000);
  EXPECT_EQ(m["epilogue (-> end)"], 200);  // of 200, 200, 300, 200, 3000, 200
  EXPECT_EQ(m["total"], 1300);
  EXPECT_EQ(j["same_sm_gap_cycles"]["median"], 50);  // of 50, 70 (SM 0) and 10 (SM 1)
  EXPECT_EQ(j["same_sm_gap_cycles"]["most"], 70);
  // First start 1000 cycles = 5500 ns; last end SM 1's second CTA, 2310 + 4100 = 6410 cycles =
  // 8205 ns (SM 0's last ends at 5020 cycles).
  EXPECT_EQ(j["kernel_ns"], 8205 - 5500);
  EXPECT_EQ(j["last_sm"]["ctas"], 2);
  EXPECT_EQ(j["last_sm"]["span_ns"], 8205 - 5500);
  EXPECT_EQ(j["last_sm"]["busy_ns"], (6150 - 5500) + (8205 - 6155));
  EXPECT_EQ(j["last_sm"]["busy_cycles"], 1300 + 4100);
  // ns = cycles / 2 + 5000 up to the halving's truncation: 2,000 MHz to within a few per mille.
  EXPECT_NEAR(j["clock_mhz"].get<double>(), 2000.0, 5.0);
}

TEST(BenchTimelineJson, RepeatedLaunchesListEachLaunchAndSummariseTheLast) {
  int calls = 0;
  auto launch = [&]() -> Result<cuda::KernelTimeline> {
    ++calls;
    cuda::KernelTimeline t = synthetic(6);
    // Each launch's one CTA runs 1,300 cycles; the second launch at half the first's clock.
    t.ctas = {span(0, 1000, 200)};
    t.cluster_ctas = 2;
    if (calls == 2) {
      for (int m = 0; m < cuda::kCtaMarks; ++m) t.ctas[0].ns[m] = t.ctas[0].cycles[m] + 5000;
    }
    return t;
  };
  const Result<nlohmann::json> j = repeated_timeline_json(2, launch);
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(j->at("launches").size(), 2u);
  EXPECT_NEAR(j->at("launches")[0]["clock_mhz"].get<double>(), 2000.0, 5.0);
  EXPECT_NEAR(j->at("launches")[1]["clock_mhz"].get<double>(), 1000.0, 1e-9);
  EXPECT_EQ(j->at("launches")[1]["last_sm_busy_cycles"], 1300);
  EXPECT_NEAR(j->at("ctas")["clock_mhz"].get<double>(), 1000.0, 1e-9);  // the last launch's summary
  EXPECT_TRUE(j->contains("consumer0"));
  EXPECT_EQ(j->at("cluster_ctas"), 2);

  const Result<nlohmann::json> once = repeated_timeline_json(1, launch);
  ASSERT_TRUE(once.ok());
  EXPECT_FALSE(once->contains("launches"));

  const Result<nlohmann::json> failed =
      repeated_timeline_json(3, []() -> Result<cuda::KernelTimeline> { return invalid_argument("no device"); });
  EXPECT_FALSE(failed.ok());
}

// `read` gives `unset` without the variable `name`, `value` for `text`, and an error naming the
// variable for each of `bad`.
void expect_env_int(const char* name, Result<int> (*read)(), int unset, const char* text, int value,
                    std::initializer_list<const char*> bad) {
  ::unsetenv(name);
  EXPECT_EQ(*read(), unset);
  ::setenv(name, text, 1);
  EXPECT_EQ(*read(), value);
  for (const char* b : bad) {
    ::setenv(name, b, 1);
    const Result<int> n = read();
    ASSERT_FALSE(n.ok()) << b;
    EXPECT_NE(n.status().message().find(name), std::string::npos);
  }
  ::unsetenv(name);
}

TEST(BenchTimelineJson, LaunchCountFromTheEnvironment) {
  expect_env_int("VORTEX_ATTENTION_TIMELINE", timeline_launches_from_env, 0, "12", 12, {"0", "1001", "x", "3x", "-2"});
}

TEST(BenchTimelineJson, ClusterSizeFromTheEnvironment) {
  expect_env_int("VORTEX_ATTENTION_TIMELINE_CLUSTER", timeline_cluster_from_env, 0, "1", 1, {"3", "-1", "two"});
}

TEST(BenchTimelineJson, NoCtaRecordsNoCtaSummary) {
  EXPECT_FALSE(timeline_json(synthetic(6)).contains("ctas"));
}

}  // namespace
}  // namespace vortex::bench
