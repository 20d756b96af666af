#include "bench/timeline_json.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vortex::bench {

namespace {

long long median_of(std::vector<long long> d) {
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
  return d[d.size() / 2];
}

}  // namespace

nlohmann::json cta_summary_json(const std::vector<cuda::CtaSpan>& ctas) {
  using cuda::CtaMark;
  const auto at = [](int mark) { return static_cast<size_t>(mark); };
  const size_t start = at(static_cast<int>(CtaMark::kStart)), first = at(static_cast<int>(CtaMark::kFirstTile)),
               sweep = at(static_cast<int>(CtaMark::kSweepDone)), end = at(static_cast<int>(CtaMark::kEnd));
  std::map<int, std::vector<const cuda::CtaSpan*>> by_sm;
  std::vector<long long> prologue, sweeping, epilogue, total;
  long long kernel_start = 0, kernel_end = 0;
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
  long long busy_ns = 0;
  for (const cuda::CtaSpan* c : *last_sm) busy_ns += c->ns[end] - c->ns[start];
  out["ctas_per_sm"] = {{"fewest", fewest}, {"most", most}};
  out["median_cycles"] = {{"prologue (start -> first tile done)", median_of(prologue)},
                          {"sweep (first tile done -> last product landed)", median_of(sweeping)},
                          {"epilogue (-> end)", median_of(epilogue)},
                          {"total", median_of(total)}};
  if (!gaps.empty()) {
    out["same_sm_gap_cycles"] = {{"median", median_of(gaps)}, {"most", *std::max_element(gaps.begin(), gaps.end())}};
  }
  out["kernel_ns"] = kernel_end - kernel_start;
  out["last_sm"] = {{"ctas", last_sm->size()},
                    {"busy_ns", busy_ns},
                    {"span_ns", last_sm->back()->ns[end] - last_sm->front()->ns[start]}};
  return out;
}

nlohmann::json timeline_json(const cuda::KernelTimeline& t) {
  const int events = static_cast<int>(t.events.size());
  nlohmann::json out = {{"unit", "SM cycles (clock64); median over the consumer's 4 warps and key tiles 1..T-2"},
                        {"cta", "the middle query block of the middle head"},
                        {"tiles", t.tiles},
                        {"events", t.events}};
  if (!t.ctas.empty()) out["ctas"] = cta_summary_json(t.ctas);
  if (t.tiles < 4) return out;  // no tile with a next one before the masked last
  for (int consumer = 0; consumer < t.warps / 4; ++consumer) {
    nlohmann::json phases = nlohmann::json::array();
    for (int e = 0; e <= events; ++e) {
      std::vector<long long> d;
      for (int w = 4 * consumer; w < 4 * consumer + 4; ++w) {
        for (int tile = 1; tile + 1 <= t.tiles - 2; ++tile) {
          // e < events: mark e to the next mark; e == events: the round, first mark to first mark.
          const long long from = t.at(w, tile, e == events ? 0 : e);
          const long long to = e + 1 < events ? t.at(w, tile, e + 1) : t.at(w, tile + 1, 0);
          d.push_back(to - from);
        }
      }
      const std::string name =
          e == events ? "round" : t.events[e] + " -> " + (e + 1 < events ? t.events[e + 1] : t.events[0] + " (next tile)");
      phases.push_back({{"from_to", name}, {"cycles", median_of(std::move(d))}});
    }
    out["consumer" + std::to_string(consumer)] = phases;
  }
  return out;
}

}  // namespace vortex::bench
