#pragma once

// The time bounds of the Pareto planner (pareto_planner.h, Note [Planner time
// bound]): lower convex hulls of each segment's (retained, time) options, the
// hull edges sorted by time per byte, and the LP lower bound on the time a
// completion of a partial plan adds. The greedy upper bound and the root LP
// bound (ParetoPlanner::greedy_upper_bound, root_lower_bound) are defined in
// planner_time_bound.cpp beside them. Internal to the planner's files; not a
// public header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/pareto_planner.h"

namespace torch_replay::planner_detail {

// The lower convex hull of the (retained, time) points of the options of one
// segment that `allowed` accepts: option indices by increasing retained and
// strictly decreasing time. Empty when no option is allowed.
template <typename Allowed>
std::vector<int32_t> lower_hull(
    const std::vector<PlannerOption>& opts, Allowed allowed) {
  std::vector<int32_t> order;
  for (size_t o = 0; o < opts.size(); ++o) {
    if (allowed(opts[o])) {
      order.push_back(static_cast<int32_t>(o));
    }
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (opts[a].retained != opts[b].retained) {
      return opts[a].retained < opts[b].retained;
    }
    if (opts[a].time != opts[b].time) {
      return opts[a].time < opts[b].time;
    }
    return a < b;
  });
  std::vector<int32_t> hull;
  for (int32_t o : order) {
    if (!hull.empty() && opts[o].time >= opts[hull.back()].time) {
      continue;  // no faster than a leaner option
    }
    while (hull.size() >= 2) {
      const PlannerOption& a = opts[hull[hull.size() - 2]];
      const PlannerOption& b = opts[hull.back()];
      const PlannerOption& p = opts[o];
      using LD = long double;
      const LD cross = LD(b.retained - a.retained) * (LD(p.time) - a.time) -
                       (LD(b.time) - a.time) * LD(p.retained - a.retained);
      if (cross > 0) {
        break;  // b lies strictly below the chord a-p
      }
      hull.pop_back();
    }
    hull.push_back(o);
  }
  return hull;
}

// One hull edge: moving segment `segment` from a faster hull vertex to the
// next leaner one saves `bytes` retained bytes for `time` more time.
struct HullEdge {
  int64_t bytes;
  double time;
  double per_byte;
  size_t segment;
  size_t rank;  // position along the segment's walk, fastest first
};

// Sorts edges by time per byte (ties: segment, then rank).
void sort_edges(std::vector<HullEdge>& edges);

// Appends the edges of one hull (indices by increasing retained).
void append_edges(
    const std::vector<PlannerOption>& opts,
    const std::vector<int32_t>& hull,
    size_t segment,
    std::vector<HullEdge>& edges);

// Fenwick tree over hull edges sorted by time per byte, for the LP bound of
// Note [Planner time bound].
class EdgeFenwick {
 public:
  explicit EdgeFenwick(const std::vector<HullEdge>& edges);

  void add(size_t pos, int64_t bytes, double time);

  // Least time to save `need` > 0 bytes with fractional edges, or infinity
  // when the active edges save less than that.
  double cost(int64_t need) const;

 private:
  std::vector<int64_t> bytes_;
  std::vector<double> time_;
  std::vector<double> per_byte_;
  size_t top_ = 1;
};

// Lower bounds on the time a completion adds, Note [Planner time bound].
// The transient of the final plan is split into pieces by levels
// T_0 < ... < T_{m-1} (transients of options, the last the largest that
// fits): a plan whose final transient lies in (T_{k-1}, T_k] uses only
// options with transient <= T_k and leaves at most room - T_{k-1} - 1 bytes
// for retained. Each piece has its own LP (hull edges of its options in a
// Fenwick tree); the bound is the least over the pieces a state can reach.
class SuffixTimeBound {
 public:
  SuffixTimeBound(
      const std::vector<std::vector<PlannerOption>>& segments,
      int64_t floor,
      int64_t room);

  // Drops segment s from every piece's LP. Precondition: segments are left
  // in order 0, 1, ...
  void leave(size_t s);

  // A lower bound on the time that segments >= s (every earlier one left)
  // add to a state with transient q and room_left bytes for the suffix's
  // retained plus the final transient. Returns early with a value <= stop
  // once it finds one.
  // Pass stop = NaN for the tightest bound.
  double bound(size_t s, int64_t room_left, int64_t q, double stop) const;

 private:
  struct Slot {
    size_t position;
    int64_t bytes;
    double time;
  };
  struct Piece {
    EdgeFenwick fenwick{{}};
    std::vector<std::vector<Slot>> slots;  // per segment
    std::vector<double> fast_time;         // suffix sums, fastest hull vertex
    std::vector<int64_t> fast_retained;
    size_t first_ok = 0;  // segments >= first_ok all have an allowed option
  };

  double piece_time(
      size_t k, size_t s, int64_t room_left, int64_t charge) const;

  std::vector<int64_t> levels_;
  std::vector<Piece> pieces_;
};

}  // namespace torch_replay::planner_detail
