#include "bench/timeline_json.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace vortex::bench {

nlohmann::json timeline_json(const cuda::KernelTimeline& t) {
  const int events = static_cast<int>(t.events.size());
  const auto median = [](std::vector<long long> d) {
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    return d[d.size() / 2];
  };
  nlohmann::json out = {{"unit", "SM cycles (clock64); median over the consumer's 4 warps and key tiles 1..T-2"},
                        {"cta", "the middle query block of the middle head"},
                        {"tiles", t.tiles},
                        {"events", t.events}};
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
      phases.push_back({{"from_to", name}, {"cycles", median(std::move(d))}});
    }
    out["consumer" + std::to_string(consumer)] = phases;
  }
  return out;
}

}  // namespace vortex::bench
