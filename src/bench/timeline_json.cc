#include "bench/timeline_json.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vortex::bench {

namespace {

template <typename T>
T median_of(std::vector<T> d) {
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
  return d[d.size() / 2];
}

// Mark e of (warp, tile) to the next mark, or for e == events the round (first mark to first mark).
std::pair<long long, long long> phase_interval(const cuda::KernelTimeline& t, int warp, int tile, int e) {
  const int events = static_cast<int>(t.events.size());
  const long long from = t.at(warp, tile, e == events ? 0 : e);
  const long long to = e + 1 < events ? t.at(warp, tile, e + 1) : t.at(warp, tile + 1, 0);
  return {from, to};
}

// The share of warp `mine`'s phase e in `tile` during which warp `theirs` (the other consumer's warp
// on the same SM sub-partition) was in its own phase e, of any of its tiles around that one.
// Whether the two consumers run their softmaxes at the same time (and share the exp2 unit) or
// alternate is this number for the softmax's phase: near 1 or near 0.
double same_phase_share(const cuda::KernelTimeline& t, int mine, int theirs, int tile, int e) {
  const auto [from, to] = phase_interval(t, mine, tile, e);
  if (to <= from) return 0.0;
  long long together = 0;
  for (int other = std::max(1, tile - 2); other <= std::min(t.tiles - 3, tile + 2); ++other) {
    const auto [a, b] = phase_interval(t, theirs, other, e);
    together += std::max(0LL, std::min(to, b) - std::max(from, a));
  }
  return static_cast<double>(together) / static_cast<double>(to - from);
}

// How far apart a consumer's 4 warps (one per SM sub-partition) reach mark e of `tile`: the
// latest's mark minus the earliest's, and which of the 4 is the latest. A product is a warpgroup
// instruction, so at every issue the earlier warps wait for the latest one.
std::pair<long long, int> warp_spread(const cuda::KernelTimeline& t, int consumer, int tile, int e) {
  long long earliest = t.at(4 * consumer, tile, e), latest = earliest;
  int last = 0;
  for (int w = 1; w < 4; ++w) {
    const long long mark = t.at(4 * consumer + w, tile, e);
    earliest = std::min(earliest, mark);
    if (mark > latest) latest = mark, last = w;
  }
  return {latest - earliest, last};
}

}  // namespace

nlohmann::json cta_summary_json(const std::vector<cuda::CtaSpan>& ctas) {
  using cuda::CtaMark;
  const auto at = [](int mark) { return static_cast<size_t>(mark); };
  const size_t start = at(static_cast<int>(CtaMark::kStart)), first = at(static_cast<int>(CtaMark::kFirstTile)),
               sweep = at(static_cast<int>(CtaMark::kSweepDone)), end = at(static_cast<int>(CtaMark::kEnd));
  std::map<int, std::vector<const cuda::CtaSpan*>> by_sm;
  std::vector<long long> prologue, sweeping, epilogue, total;
  long long kernel_start = 0, kernel_end = 0, cta_cycles = 0, cta_ns = 0;
  int unrecorded = 0;
  for (const cuda::CtaSpan& c : ctas) {
    bool recorded = true;
    for (int m = 0; m < cuda::kCtaMarks; ++m) recorded = recorded && c.ns[m] > 0 && c.cycles[m] > 0;
    if (!recorded) {
      ++unrecorded;
      continue;
    }
    by_sm[c.sm].push_back(&c);
    prologue.push_back(c.cycles[first] - c.cycles[start]);
    sweeping.push_back(c.cycles[sweep] - c.cycles[first]);
    epilogue.push_back(c.cycles[end] - c.cycles[sweep]);
    total.push_back(c.cycles[end] - c.cycles[start]);
    cta_cycles += c.cycles[end] - c.cycles[start];
    cta_ns += c.ns[end] - c.ns[start];
    kernel_start = kernel_start == 0 ? c.ns[start] : std::min(kernel_start, c.ns[start]);
    kernel_end = std::max(kernel_end, c.ns[end]);
  }
  nlohmann::json out = {{"count", ctas.size()}, {"unrecorded", unrecorded}, {"sms", by_sm.size()}};
  if (by_sm.empty()) return out;
  size_t fewest = ctas.size(), most = 0;
  std::vector<long long> gaps;
  const std::vector<const cuda::CtaSpan*>* last_sm = nullptr;
  for (auto& [sm, list] : by_sm) {
    std::sort(list.begin(), list.end(),
              [&](const cuda::CtaSpan* a, const cuda::CtaSpan* b) { return a->cycles[start] < b->cycles[start]; });
    for (size_t i = 1; i < list.size(); ++i) gaps.push_back(list[i]->cycles[start] - list[i - 1]->cycles[end]);
    fewest = std::min(fewest, list.size());
    most = std::max(most, list.size());
    if (last_sm == nullptr || list.back()->ns[end] > last_sm->back()->ns[end]) last_sm = &list;
  }
  long long busy_ns = 0, busy_cycles = 0;
  for (const cuda::CtaSpan* c : *last_sm) {
    busy_ns += c->ns[end] - c->ns[start];
    busy_cycles += c->cycles[end] - c->cycles[start];
  }
  out["ctas_per_sm"] = {{"fewest", fewest}, {"most", most}};
  out["median_cycles"] = {{"prologue (start -> first tile done)", median_of(prologue)},
                          {"sweep (first tile done -> last product landed)", median_of(sweeping)},
                          {"epilogue (-> end)", median_of(epilogue)},
                          {"total", median_of(total)}};
  if (!gaps.empty()) {
    out["same_sm_gap_cycles"] = {{"median", median_of(gaps)}, {"most", *std::max_element(gaps.begin(), gaps.end())}};
  }
  out["kernel_ns"] = kernel_end - kernel_start;
  // The SM clock the CTAs ran at, from their own clocks: what the power controller granted, which
  // the driver's sampled clock can overstate.
  if (cta_ns > 0) out["clock_mhz"] = 1000.0 * static_cast<double>(cta_cycles) / static_cast<double>(cta_ns);
  out["last_sm"] = {{"ctas", last_sm->size()},
                    {"busy_ns", busy_ns},
                    {"busy_cycles", busy_cycles},
                    {"span_ns", last_sm->back()->ns[end] - last_sm->front()->ns[start]}};
  return out;
}

nlohmann::json timeline_json(const cuda::KernelTimeline& t) {
  const int events = static_cast<int>(t.events.size());
  nlohmann::json out = {{"unit", "SM cycles (clock64); median over the consumer's 4 warps and key tiles 1..T-2"},
                        {"cta", "the middle query block of the middle head"},
                        {"tiles", t.tiles},
                        {"events", t.events},
                        {"cluster_ctas", t.cluster_ctas}};
  if (!t.ctas.empty()) out["ctas"] = cta_summary_json(t.ctas);
  if (t.tiles < 4) return out;  // no tile with a next one before the masked last
  const int consumers = t.warps / 4;
  for (int consumer = 0; consumer < consumers; ++consumer) {
    nlohmann::json phases = nlohmann::json::array();
    for (int e = 0; e <= events; ++e) {
      std::vector<long long> d;
      std::vector<double> together;
      for (int w = 4 * consumer; w < 4 * consumer + 4; ++w) {
        for (int tile = 1; tile + 1 <= t.tiles - 2; ++tile) {
          const auto [from, to] = phase_interval(t, w, tile, e);
          d.push_back(to - from);
          // Warp w % 4 of every consumer runs on sub-partition w % 4: compared with the next consumer's.
          if (consumers >= 2 && e < events) {
            together.push_back(same_phase_share(t, w, (w + 4) % t.warps, tile, e));
          }
        }
      }
      const std::string name =
          e == events ? "round" : t.events[e] + " -> " + (e + 1 < events ? t.events[e + 1] : t.events[0] + " (next tile)");
      nlohmann::json phase = {{"from_to", name}, {"cycles", median_of(std::move(d))}};
      if (!together.empty()) phase["other_consumer_in_this_phase"] = median_of(std::move(together));
      if (e < events) {
        std::vector<long long> spread;
        std::vector<double> last_share(4, 0.0);
        for (int tile = 1; tile + 1 <= t.tiles - 2; ++tile) {
          const auto [cycles, last] = warp_spread(t, consumer, tile, e);
          spread.push_back(cycles);
          last_share[static_cast<size_t>(last)] += 1.0;
        }
        for (double& share : last_share) share /= static_cast<double>(spread.size());
        phase["warp_spread_at_start"] = median_of(std::move(spread));
        phase["last_warp_share_at_start"] = last_share;
      }
      phases.push_back(std::move(phase));
    }
    out["consumer" + std::to_string(consumer)] = phases;
  }
  return out;
}

namespace {

// The integer in environment variable `name`: `unset` when unset or empty, else lo .. hi.
Result<int> env_int(const char* name, int unset, long lo, long hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return unset;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    return invalid_argument(std::string(name) + ": '" + v + "' (expected " + what + ")");
  }
  return static_cast<int>(n);
}

}  // namespace

Result<int> timeline_launches_from_env() {
  return env_int("VORTEX_ATTENTION_TIMELINE", 0, 1, 1000, "a launch count, 1 to 1000");
}

Result<int> timeline_cluster_from_env() {
  return env_int("VORTEX_ATTENTION_TIMELINE_CLUSTER", 0, 0, 2, "0 for the size-based choice, 1 or 2 CTAs");
}

Result<nlohmann::json> repeated_timeline_json(int launches,
                                              const std::function<Result<cuda::KernelTimeline>()>& launch) {
  nlohmann::json per_launch = nlohmann::json::array();
  cuda::KernelTimeline last;
  for (int i = 0; i < launches; ++i) {
    VORTEX_ASSIGN_OR_RETURN(last, launch());
    if (last.ctas.empty()) continue;
    const nlohmann::json ctas = cta_summary_json(last.ctas);
    if (!ctas.contains("clock_mhz")) continue;
    per_launch.push_back({{"kernel_ns", ctas["kernel_ns"]},
                          {"clock_mhz", ctas["clock_mhz"]},
                          {"last_sm_busy_cycles", ctas["last_sm"]["busy_cycles"]}});
  }
  nlohmann::json out = timeline_json(last);
  if (launches > 1 && !per_launch.empty()) out["launches"] = per_launch;
  return out;
}

}  // namespace vortex::bench
