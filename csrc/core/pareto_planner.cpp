#include "core/pareto_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "core/planner_dominance.h"
#include "core/planner_time_bound.h"

namespace torch_replay {
namespace {

using planner_detail::lower_hull;
using planner_detail::pareto_sweep;
using planner_detail::State;
using planner_detail::SuffixTimeBound;
using planner_detail::summed_memory_sweep;

constexpr int64_t kMaxTotalBytes = int64_t{1} << 62;

[[noreturn]] void invalid(const std::string& message) {
  throw ReplayException(ErrorKind::kInvalidArgument, message);
}

// One kept layer of the DP: just enough to walk the chosen plan back.
struct Layer {
  std::vector<uint32_t> parent;
  std::vector<uint32_t> option;
};

// persistent + min over plans of (sum retained + max transient): for each
// threshold T among the transients, T plus the least retained of each
// segment among its options with transient <= T.
int64_t compute_min_budget(
    const std::vector<std::vector<PlannerOption>>& segments,
    int64_t persistent) {
  struct Event {
    int64_t transient;
    int64_t retained;
    size_t segment;
  };
  std::vector<Event> events;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (const PlannerOption& o : segments[s]) {
      events.push_back({o.transient, o.retained, s});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.transient < b.transient;
  });
  constexpr int64_t kNone = -1;
  std::vector<int64_t> best(segments.size(), kNone);
  size_t missing = segments.size();
  int64_t sum = 0;
  int64_t answer = std::numeric_limits<int64_t>::max();
  if (segments.empty()) {
    return persistent;
  }
  for (size_t i = 0; i < events.size();) {
    const int64_t t = events[i].transient;
    for (; i < events.size() && events[i].transient == t; ++i) {
      const Event& e = events[i];
      if (best[e.segment] == kNone) {
        best[e.segment] = e.retained;
        sum += e.retained;
        --missing;
      } else if (e.retained < best[e.segment]) {
        sum -= best[e.segment] - e.retained;
        best[e.segment] = e.retained;
      }
    }
    if (missing == 0) {
      answer = std::min(answer, t + sum);
    }
  }
  return persistent + answer;
}

}  // namespace

ParetoPlanner::ParetoPlanner(
    std::vector<std::vector<PlannerOption>> segments, int64_t persistent)
    : segments_(std::move(segments)), persistent_(persistent) {
  if (persistent_ < 0) {
    invalid("planner: persistent bytes must be >= 0");
  }
  const size_t n = segments_.size();
  int64_t max_retained_sum = 0;
  int64_t max_transient = 0;
  for (size_t s = 0; s < n; ++s) {
    const auto& opts = segments_[s];
    const std::string where = "planner: segment " + std::to_string(s);
    if (opts.empty()) {
      invalid(where + " has no option; give each segment at least one");
    }
    if (opts.size() >= (size_t{1} << 31)) {
      invalid(where + " has too many options");
    }
    int64_t seg_max_retained = 0;
    for (size_t o = 0; o < opts.size(); ++o) {
      const PlannerOption& opt = opts[o];
      const std::string at = where + " option " + std::to_string(o);
      if (opt.retained < 0 || opt.transient < 0) {
        invalid(at + ": retained and transient bytes must be >= 0");
      }
      if (!std::isfinite(opt.time) || opt.time < 0) {
        invalid(at + ": time must be finite and >= 0");
      }
      if (opt.retained >= kMaxTotalBytes || opt.transient >= kMaxTotalBytes) {
        invalid(at + ": byte counts must be below 2^62");
      }
      seg_max_retained = std::max(seg_max_retained, opt.retained);
      max_transient = std::max(max_transient, opt.transient);
    }
    max_retained_sum += seg_max_retained;
    if (max_retained_sum >= kMaxTotalBytes) {
      invalid("planner: the summed retained bytes can exceed 2^62");
    }
  }
  if (persistent_ >= kMaxTotalBytes - max_retained_sum - max_transient) {
    invalid("planner: persistent + retained + transient can exceed 2^62");
  }
  suffix_min_retained_.assign(n + 1, 0);
  suffix_transient_floor_.assign(n + 1, 0);
  for (size_t s = n; s-- > 0;) {
    int64_t min_r = std::numeric_limits<int64_t>::max();
    int64_t min_q = std::numeric_limits<int64_t>::max();
    for (const PlannerOption& o : segments_[s]) {
      min_r = std::min(min_r, o.retained);
      min_q = std::min(min_q, o.transient);
    }
    suffix_min_retained_[s] = suffix_min_retained_[s + 1] + min_r;
    suffix_transient_floor_[s] =
        std::max(suffix_transient_floor_[s + 1], min_q);
  }
  min_budget_ = compute_min_budget(segments_, persistent_);
  hulls_.resize(n);
  for (size_t s = 0; s < n; ++s) {
    hulls_[s] =
        lower_hull(segments_[s], [](const PlannerOption&) { return true; });
    double max_time = 0.0;
    for (const PlannerOption& o : segments_[s]) {
      max_time = std::max(max_time, o.time);
    }
    time_scale_ += max_time;
  }
}

PlannerResult ParetoPlanner::solve(
    int64_t budget, const PlannerSettings& settings) const {
  const double inf = std::numeric_limits<double>::infinity();
  if (budget < min_budget_ || !settings.time_bound) {
    PlannerResult result = run(budget, settings.dominance, inf);
    result.time_upper_bound = inf;
    return result;
  }
  // Note [Planner time bound], iterative deepening: a run with limit L keeps
  // every plan of time <= L, so a plan it returns with time <= L is the
  // optimum (and the one Note [Planner tie-breaking] picks). Limits grow
  // geometrically from the LP bound of the whole problem to the greedy
  // upper bound U, which always succeeds.
  const double upper = greedy_upper_bound(budget);
  const double lower = root_lower_bound(budget);
  int64_t generated = 0;
  int64_t pruned = 0;
  int rounds = 0;
  constexpr int kRounds = 6;
  for (int k = std::isfinite(upper) ? 0 : kRounds; k <= kRounds; ++k) {
    double limit = upper;
    if (k < kRounds) {
      limit = lower + (upper - lower) * std::ldexp(1.0, k - kRounds);
      if (!(limit < upper)) {
        continue;
      }
    }
    PlannerResult result = run(budget, settings.dominance, limit);
    ++rounds;
    generated += result.states_generated;
    pruned += result.states_pruned_by_time;
    if (k == kRounds || (result.feasible && result.time <= limit)) {
      result.states_generated = generated;
      result.states_pruned_by_time = pruned;
      result.time_upper_bound = upper;
      result.rounds = rounds;
      return result;
    }
  }
  throw ReplayException(
      ErrorKind::kInternal, "planner: the final round did not run");
}

PlannerResult ParetoPlanner::run(
    int64_t budget, PlannerDominance dominance, double limit) const {
  PlannerResult result;
  result.min_budget = min_budget_;
  const size_t n = segments_.size();
  if (budget < min_budget_) {
    return result;
  }
  // The memory left for retained + transient; >= 0 since budget >=
  // min_budget >= persistent.
  const int64_t room = budget - persistent_;

  const bool bound = std::isfinite(limit);
  limit += 1e-9 * time_scale_;  // rounding slack, Note [Planner time bound]
  std::unique_ptr<SuffixTimeBound> time_bound;
  if (bound) {
    time_bound = std::make_unique<SuffixTimeBound>(
        segments_, suffix_transient_floor_[0], room);
  }

  std::vector<State> frontier{{0, 0, 0.0, 0, 0}};
  std::vector<Layer> layers(n);
  std::vector<State> cand;
  std::vector<char> keep;
  for (size_t s = 0; s < n; ++s) {
    const auto& opts = segments_[s];
    const int64_t floor = suffix_transient_floor_[s + 1];
    const int64_t rest = suffix_min_retained_[s + 1];
    if (bound) {
      time_bound->leave(s);
    }
    cand.clear();
    for (size_t p = 0; p < frontier.size(); ++p) {
      const State& st = frontier[p];
      for (size_t o = 0; o < opts.size(); ++o) {
        const PlannerOption& opt = opts[o];
        const int64_t r = st.retained + opt.retained;
        const int64_t q = std::max({st.transient, opt.transient, floor});
        if (r + q + rest > room) {
          continue;  // no completion fits (Note [Planner dominance])
        }
        const double c = st.time + opt.time;
        if (bound) {
          // Least time any completion adds.
          const double allowance = limit - c;
          if (time_bound->bound(s + 1, room - r, q, allowance) > allowance) {
            ++result.states_pruned_by_time;
            continue;
          }
        }
        cand.push_back(
            {r, q, c, static_cast<uint32_t>(p), static_cast<uint32_t>(o)});
      }
    }
    result.states_generated += static_cast<int64_t>(cand.size());
    if (cand.size() > std::numeric_limits<uint32_t>::max()) {
      throw ReplayException(
          ErrorKind::kInternal,
          "planner: the Pareto frontier outgrew 2^32 states at segment " +
              std::to_string(s));
    }
    keep.assign(cand.size(), 0);
    if (dominance == PlannerDominance::kSummedMemory) {
      summed_memory_sweep(cand, keep);
    } else {
      pareto_sweep(cand, keep);
    }
    frontier.clear();
    Layer& layer = layers[s];
    for (size_t i = 0; i < cand.size(); ++i) {
      if (keep[i]) {
        layer.parent.push_back(cand[i].parent);
        layer.option.push_back(cand[i].option);
        frontier.push_back(cand[i]);
      }
    }
    result.frontier_sizes.push_back(static_cast<int64_t>(frontier.size()));
    if (frontier.empty()) {
      // Only reachable with the unsafe kSummedMemory rule (the greedy plan
      // of time <= U always survives the exact rule).
      return result;
    }
  }
  // Every surviving state fits (the suffix bounds are 0 after the last
  // segment). Pick by Note [Planner tie-breaking]: time, peak, index.
  size_t best = 0;
  for (size_t i = 1; i < frontier.size(); ++i) {
    const State& a = frontier[i];
    const State& b = frontier[best];
    if (a.time < b.time || (a.time == b.time && a.retained + a.transient <
                                                    b.retained + b.transient)) {
      best = i;
    }
  }
  const State& chosen = frontier[best];
  result.feasible = true;
  result.retained = chosen.retained;
  result.transient = chosen.transient;
  result.peak = persistent_ + chosen.retained + chosen.transient;
  result.time = chosen.time;
  result.choices.assign(n, 0);
  uint32_t index = static_cast<uint32_t>(best);
  for (size_t s = n; s-- > 0;) {
    result.choices[s] = static_cast<int32_t>(layers[s].option[index]);
    index = layers[s].parent[index];
  }
  return result;
}

}  // namespace torch_replay
