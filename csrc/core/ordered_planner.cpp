#include "core/ordered_planner.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

namespace torch_replay {
namespace {

constexpr int64_t kLimit = int64_t{1} << 62;

[[noreturn]] void invalid(const std::string& message) {
  throw ReplayException(ErrorKind::kInvalidArgument, message);
}

// Adds `bytes` (checked >= 0 and below 2^62) to a sum that must stay below
// 2^62, so that no sum of the peak's formula can overflow.
void add_bytes(int64_t& sum, int64_t bytes, const std::string& what) {
  if (bytes < 0 || bytes >= kLimit) {
    invalid("ordered planner: " + what + " must be >= 0 and below 2^62");
  }
  sum += bytes;
  if (sum >= kLimit) {
    invalid("ordered planner: the peak's terms can exceed 2^62 bytes");
  }
}

// Checks the preconditions of plan_ordered (ordered_peak passes its choice
// as one segment per layer).
void check_inputs(
    const std::vector<std::vector<PlannerOption>>& segments,
    const OrderedPeakTerms& terms) {
  if (terms.grads.size() != segments.size()) {
    invalid(
        "ordered planner: " + std::to_string(segments.size()) + " layers but " +
        std::to_string(terms.grads.size()) +
        " gradient sizes; give one per layer");
  }
  int64_t sum = 0;
  add_bytes(sum, terms.persistent, "persistent bytes");
  add_bytes(sum, terms.floor, "floor bytes");
  add_bytes(sum, terms.head, "head bytes");
  int64_t largest_transient = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const std::string layer = "layer " + std::to_string(s);
    const auto& opts = segments[s];
    if (opts.empty() || opts.size() >= (size_t{1} << 31)) {
      invalid("ordered planner: " + layer + " needs 1 to 2^31 - 1 options");
    }
    add_bytes(sum, terms.grads[s], layer + "'s gradient bytes");
    int64_t most = 0;
    for (const PlannerOption& o : opts) {
      if (!std::isfinite(o.time) || o.time < 0) {
        invalid("ordered planner: " + layer + " has a time not finite >= 0");
      }
      int64_t unused = 0;
      add_bytes(unused, o.transient, layer + "'s transient bytes");
      add_bytes(unused, o.retained, layer + "'s retained bytes");
      most = std::max(most, o.retained);
      largest_transient = std::max(largest_transient, o.transient);
    }
    add_bytes(sum, most, layer + "'s retained bytes");
  }
  add_bytes(sum, largest_transient, "the largest transient");
}

// A candidate state after a layer (Note [Ordered layer peak]): retained so
// far, peak so far (without persistent), time so far; the kept state of the
// previous layer it extends and the option taken.
struct Candidate {
  int64_t retained;
  int64_t peak;
  double time;
  uint32_t parent;
  uint32_t option;
};

// The (R, P) frontier without the budget, for min_budget: sorted, each pair
// kept when its P is below every kept one's.
void lean_frontier(std::vector<std::pair<int64_t, int64_t>>& pairs) {
  std::sort(pairs.begin(), pairs.end());
  size_t kept = 0;
  for (const auto& p : pairs) {
    if (kept == 0 || p.second < pairs[kept - 1].second) {
      pairs[kept++] = p;
    }
  }
  pairs.resize(kept);
}

// Marks in keep[] the candidates of Note [Ordered layer peak]'s frontier;
// `order` lists them sorted by (R, P, C, option positions).
void staircase_sweep(
    const std::vector<Candidate>& cand,
    const std::vector<uint32_t>& order,
    std::vector<char>& keep) {
  std::map<int64_t, double> steps;  // kept (P, C): P up, C strictly down
  for (uint32_t i : order) {
    const Candidate& c = cand[i];
    auto it = steps.upper_bound(c.peak);
    if (it != steps.begin() && std::prev(it)->second <= c.time) {
      continue;  // a kept state has R, P and C no larger
    }
    it = steps.lower_bound(c.peak);
    while (it != steps.end() && it->second >= c.time) {
      it = steps.erase(it);
    }
    steps.emplace_hint(it, c.peak, c.time);
    keep[i] = 1;
  }
}

}  // namespace

int64_t ordered_peak(
    const std::vector<PlannerOption>& chosen, const OrderedPeakTerms& terms) {
  std::vector<std::vector<PlannerOption>> layers;
  for (const PlannerOption& o : chosen) {
    layers.push_back({o});
  }
  check_inputs(layers, terms);
  int64_t after = 0;
  for (int64_t g : terms.grads) {
    after += g;
  }
  int64_t held = 0;
  int64_t top = terms.floor;
  for (size_t i = 0; i < chosen.size(); ++i) {
    after -= terms.grads[i];
    held += chosen[i].retained;
    top = std::max(top, held + chosen[i].transient + after);
  }
  return terms.persistent + std::max(top, held + terms.head);
}

PlannerResult plan_ordered(
    const std::vector<std::vector<PlannerOption>>& segments,
    const OrderedPeakTerms& terms,
    int64_t budget) {
  check_inputs(segments, terms);
  const size_t n = segments.size();
  const int64_t head = terms.head;
  // Every peak is >= 0, so any negative room is as infeasible as -1.
  const int64_t room =
      budget < terms.persistent ? -1 : budget - terms.persistent;
  int64_t after = 0;  // sum of grads[j] for j > i, at layer i
  for (int64_t g : terms.grads) {
    after += g;
  }

  PlannerResult result;
  result.time_upper_bound = std::numeric_limits<double>::infinity();
  std::vector<Candidate> frontier{{0, terms.floor, 0.0, 0, 0}};
  std::vector<uint32_t> rank{0};  // lexicographic rank of each kept path
  std::vector<std::vector<uint32_t>> parents(n);
  std::vector<std::vector<uint32_t>> options(n);
  std::vector<std::pair<int64_t, int64_t>> lean{{0, terms.floor}};
  std::vector<std::pair<int64_t, int64_t>> grown_lean;
  std::vector<Candidate> cand;
  std::vector<uint32_t> order;
  std::vector<char> keep;
  for (size_t s = 0; s < n; ++s) {
    const auto& opts = segments[s];
    after -= terms.grads[s];
    const bool last = s + 1 == n;
    cand.clear();
    for (const Candidate& st : frontier) {
      const auto p = static_cast<uint32_t>(&st - frontier.data());
      for (uint32_t k = 0; k < opts.size(); ++k) {
        const int64_t held = st.retained + opts[k].retained;
        const int64_t peak =
            std::max(st.peak, held + opts[k].transient + after);
        if (peak <= room && held + head <= room) {
          // After the last layer the head's term joins the peak.
          const int64_t top = last ? std::max(peak, held + head) : peak;
          cand.push_back({held, top, st.time + opts[k].time, p, k});
        }
      }
    }
    result.states_generated += static_cast<int64_t>(cand.size());
    if (cand.size() >= std::numeric_limits<uint32_t>::max()) {
      throw ReplayException(
          ErrorKind::kInternal,
          "ordered planner: the frontier outgrew 2^32 states at layer " +
              std::to_string(s));
    }
    order.resize(cand.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const Candidate& x = cand[a];
      const Candidate& y = cand[b];
      return std::tie(x.retained, x.peak, x.time, rank[x.parent], x.option) <
             std::tie(y.retained, y.peak, y.time, rank[y.parent], y.option);
    });
    keep.assign(cand.size(), 0);
    staircase_sweep(cand, order, keep);
    // The kept states in (R, P, C, path) order, and their paths' ranks.
    std::vector<uint32_t> old_rank = std::move(rank);
    frontier.clear();
    for (uint32_t i : order) {
      if (keep[i]) {
        frontier.push_back(cand[i]);
        parents[s].push_back(cand[i].parent);
        options[s].push_back(cand[i].option);
      }
    }
    std::vector<uint32_t> by_path(frontier.size());
    std::iota(by_path.begin(), by_path.end(), 0);
    std::sort(by_path.begin(), by_path.end(), [&](uint32_t a, uint32_t b) {
      return std::make_pair(old_rank[frontier[a].parent], frontier[a].option) <
             std::make_pair(old_rank[frontier[b].parent], frontier[b].option);
    });
    rank.assign(frontier.size(), 0);
    for (size_t i = 0; i < by_path.size(); ++i) {
      rank[by_path[i]] = static_cast<uint32_t>(i);
    }
    result.frontier_sizes.push_back(static_cast<int64_t>(frontier.size()));

    grown_lean.clear();
    for (const auto& [held, top] : lean) {
      for (const PlannerOption& o : opts) {
        grown_lean.emplace_back(
            held + o.retained,
            std::max(top, held + o.retained + o.transient + after));
      }
    }
    lean_frontier(grown_lean);
    std::swap(lean, grown_lean);
  }
  if (n == 0) {  // no layer: the head's term joins the floor here
    frontier[0].peak = std::max(terms.floor, head);
    if (frontier[0].peak > room) {
      frontier.clear();
    }
  }
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& [held, top] : lean) {
    least = std::min(least, std::max(top, held + head));
  }
  result.min_budget = terms.persistent + least;
  if (frontier.empty()) {
    return result;
  }
  // Least time, then lowest peak, then the first path.
  std::vector<uint32_t> finals(frontier.size());
  std::iota(finals.begin(), finals.end(), 0);
  uint32_t index = *std::min_element(
      finals.begin(), finals.end(), [&](uint32_t a, uint32_t b) {
        return std::tie(frontier[a].time, frontier[a].peak, rank[a]) <
               std::tie(frontier[b].time, frontier[b].peak, rank[b]);
      });
  result.feasible = true;
  result.time = frontier[index].time;
  result.peak = terms.persistent + frontier[index].peak;
  result.choices.assign(n, 0);
  for (size_t s = n; s-- > 0;) {
    const PlannerOption& o = segments[s][options[s][index]];
    result.choices[s] = static_cast<int32_t>(options[s][index]);
    result.retained += o.retained;
    result.transient = std::max(result.transient, o.transient);
    index = parents[s][index];
  }
  return result;
}

}  // namespace torch_replay
