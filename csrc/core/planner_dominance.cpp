#include "core/planner_dominance.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>

namespace torch_replay::planner_detail {
namespace {

// Sort key of a candidate for the dominance sweep. `index` is its position
// among the layer's candidates, which is the lexicographic order of its
// option sequence (candidates are generated parent by parent in the previous
// layer's order, options in list order).
struct SweepKey {
  int64_t transient;
  int64_t retained;
  double time;
  uint32_t index;
};

// The candidates' keys in sweep order: by transient, retained, time, index.
// `summed`: keyed by retained + transient alone (transient 0), the unsafe
// rule's memory.
std::vector<SweepKey> sorted_keys(const std::vector<State>& cand, bool summed) {
  std::vector<SweepKey> keys(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) {
    const State& c = cand[i];
    keys[i] = {
        summed ? 0 : c.transient,
        summed ? c.retained + c.transient : c.retained,
        c.time,
        static_cast<uint32_t>(i)};
  }
  std::sort(keys.begin(), keys.end(), [](const SweepKey& a, const SweepKey& b) {
    if (a.transient != b.transient) {
      return a.transient < b.transient;
    }
    if (a.retained != b.retained) {
      return a.retained < b.retained;
    }
    if (a.time != b.time) {
      return a.time < b.time;
    }
    return a.index < b.index;
  });
  return keys;
}

}  // namespace

void pareto_sweep(const std::vector<State>& cand, std::vector<char>& keep) {
  const std::vector<SweepKey> keys = sorted_keys(cand, /*summed=*/false);
  // Staircase of the kept states seen so far (all with transient <= the
  // current one): retained -> (least time, earliest index with exactly that
  // retained and time). Times strictly decrease as retained grows, so the
  // entry with the largest retained <= r holds the least time among all
  // states with retained <= r.
  struct Step {
    double time;
    uint32_t first_index;
  };
  std::map<int64_t, Step> stairs;
  for (const SweepKey& k : keys) {
    auto it = stairs.upper_bound(k.retained);
    bool dominated = false;
    if (it != stairs.begin()) {
      auto prev = std::prev(it);
      const Step& s = prev->second;
      if (s.time < k.time) {
        dominated = true;
      } else if (s.time == k.time) {
        dominated = prev->first < k.retained || s.first_index < k.index;
      }
      if (!dominated && s.time == k.time) {
        // Same (retained, time) as a kept state with a smaller transient but
        // a later index: keep it, and let it stand for that point.
        prev->second.first_index = k.index;
        keep[k.index] = 1;
        continue;
      }
      if (!dominated && prev->first == k.retained) {
        // Strictly faster at the same retained: replaces the step.
        stairs.erase(prev);
      }
    }
    if (dominated) {
      continue;
    }
    keep[k.index] = 1;
    auto ins = stairs.emplace_hint(it, k.retained, Step{k.time, k.index});
    // Remove the steps this state makes redundant: larger retained, no
    // smaller time.
    auto next = std::next(ins);
    while (next != stairs.end() && next->second.time >= k.time) {
      next = stairs.erase(next);
    }
  }
}

// The unsafe rule of Note [Planner dominance]: (retained + transient, time).
void summed_memory_sweep(
    const std::vector<State>& cand, std::vector<char>& keep) {
  const std::vector<SweepKey> keys = sorted_keys(cand, /*summed=*/true);
  double best = std::numeric_limits<double>::infinity();
  for (const SweepKey& k : keys) {
    if (k.time < best) {
      best = k.time;
      keep[k.index] = 1;
    }
  }
}

}  // namespace torch_replay::planner_detail
