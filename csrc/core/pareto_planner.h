#pragma once

// The joint preservation-aware planner (design.md §2.3): for each segment of
// a model choose one option (eager, whole snapshot, region journal, read-set,
// guard, ...) so that the summed time is minimal subject to
//
//   persistent + sum(retained) + max(transient) <= budget.
//
// Exact dynamic program over segments that keeps, after each segment, the
// full Pareto frontier of partial plans in (retained, max transient, time);
// nothing is truncated. See Note [Planner dominance] for why the frontier has
// three dimensions and Note [Planner tie-breaking] for which optimal plan is
// returned when several tie.
//
// Files: pareto_planner.cpp (input checks, the DP over segments and the walk
// back to the chosen plan), planner_dominance.{h,cpp} (which candidates of a
// layer survive), planner_time_bound.{h,cpp} (segment hulls, the greedy upper
// bound and the LP lower bound of Note [Planner time bound]).
//
// Note [Planner dominance]
// A partial plan over segments 0..i is summarised by its state (R, Q, C): the
// summed retained bytes R, the largest transient Q and the summed time C.
// Completing it with a suffix plan (R', Q', C') gives the final plan
// (R + R', max(Q, Q'), C + C') with peak P + R + R' + max(Q, Q'). State A may
// replace state B only if every completion of A is at least as good as the
// same completion of B; that holds when R_A <= R_B, Q_A <= Q_B and
// C_A <= C_B. Comparing the summed memory R + Q is NOT enough, because
// transient memory combines by max: if a later segment brings a transient
// Q' >= max(Q_A, Q_B), B's larger Q is hidden by the max while A's larger R
// still counts. Example (P = 0, budget 10):
//
//   segment 0:  a = (r 0, q 8, c 0)   R + Q = 8
//               b = (r 4, q 0, c 0)   R + Q = 4  <- "dominates" a on the sum
//   segment 1:  x = (r 0, q 8, c 0)   y = (r 0, q 0, c 10)
//
//   a+x: peak 0 + 8 = 8, time 0  (optimal)
//   b+x: peak 4 + 8 = 12 > 10;   b+y: peak 4, time 10
//
// Pruning a on the sum leaves only b, whose best completion takes time 10.
// PlannerDominance::kSummedMemory implements that unsafe rule so that tests
// can show it failing; it must not be used to plan.
//
// Exact reductions used (none loses an optimal plan):
//  * A state whose R + Q plus the least memory any completion must add
//    exceeds budget - persistent is dropped: R only grows and Q never falls.
//  * Q is raised to the largest of the suffix segments' smallest transients
//    ("transient floor"): every completion reaches that transient anyway, so
//    max(Q, Q') is unchanged, and states that differed only below the floor
//    merge.
//  * Dominance is tested with one sweep in Q order over a staircase of
//    (R, C): O(N log N) for N candidate states per segment.
//  * Branch and bound on time (see Note [Planner time bound]).
//
// Note [Planner time bound]
// With real-valued times the (R, C) frontier grows quickly (thousands of
// states after 64 segments under memory pressure), so the planner also
// drops states that provably cannot reach the optimal time:
//  * an upper bound U on the optimum comes from feasible plans built
//    greedily: for each of up to 64 caps T on the transient, options with
//    transient <= T, then every segment moves along its lower convex hull of
//    (retained, time) in order of least time per byte saved until
//    retained + T fits;
//  * a lower bound on the time any completion of a state (R, Q, C) adds is
//    the LP relaxation of the multiple-choice knapsack "least suffix time
//    with suffix retained <= budget - persistent - R - Q": suffix segments
//    start at their fastest hull vertex and pay for saved bytes along the
//    hull edges of all suffix segments, cheapest per byte first, the last
//    one fractionally. The edges are kept in a Fenwick tree sorted by
//    time per byte; leaving a segment zeroes its edges, so each bound costs
//    O(log E) for E edges.
// A pass with limit L drops a state when C + bound > L + slack, where slack
// (1e-9 of the summed largest times) covers floating-point rounding, so
// every plan of time <= L survives it; dominance only drops states whose
// completions are no better than a survivor's. Hence if the pass returns a
// plan of time <= L, that plan is the optimum, the same one Note [Planner
// tie-breaking] picks. The planner runs passes with L = LB + (U - LB) / 2^k
// for k = 6, 5, ..., 0 (LB the LP bound of the whole problem) and stops at
// the first that certifies its plan; L = U always does. The LP gap is small
// next to U - LB on large problems, so the early passes usually certify and
// their frontiers stay far smaller than with L = U.
//
// Note [Planner tie-breaking]
// Among plans of least total time (summed in segment order as doubles), the
// one of lowest peak is returned; among those, the lexicographically first
// sequence of option positions (compare segment 0 first, options by their
// position in the segment's list). Dominance keeps this rule: a state is only
// dropped in favour of one that is strictly better in R or C, or equal in R
// and C and lexicographically earlier. The rule is exact when the time sums
// are exact (integer or dyadic times); with arbitrary doubles the time and
// the peak are still the optimal ones, and only the choice between plans
// whose times differ by less than rounding can differ from the rule.

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace torch_replay {

// The cost of one option of one segment. Bytes are integers (no rounding in
// sums); time is in any unit, the same for all options.
struct PlannerOption {
  int64_t retained = 0;   // held from the forward until the backward
  int64_t transient = 0;  // held only while this segment is replayed
  double time = 0.0;      // added to the step time
};

enum class PlannerDominance {
  // Exact: full Pareto frontier of (retained, max transient, time).
  kRetainedTransientTime,
  // UNSAFE, for tests only: prunes on (retained + transient, time); see
  // Note [Planner dominance].
  kSummedMemory,
};

struct PlannerSettings {
  PlannerDominance dominance = PlannerDominance::kRetainedTransientTime;
  // Branch and bound on time, Note [Planner time bound]. Exact either way;
  // turning it off is for tests and measurements.
  bool time_bound = true;
};

struct PlannerResult {
  // False when no plan fits the budget (or, only with kSummedMemory, when the
  // unsafe pruning lost every feasible plan).
  bool feasible = false;
  // The chosen option index of each segment; empty when infeasible.
  std::vector<int32_t> choices;
  int64_t retained = 0;   // sum of retained bytes of the choices
  int64_t transient = 0;  // max of transient bytes of the choices
  int64_t peak = 0;       // persistent + retained + transient
  double time = 0.0;      // sum of times, added in segment order
  // The smallest budget for which a feasible plan exists.
  int64_t min_budget = 0;
  // Number of states kept after each segment (the Pareto frontier size).
  std::vector<int64_t> frontier_sizes;
  // Number of candidate states generated over all segments.
  int64_t states_generated = 0;
  // Candidates dropped by Note [Planner time bound].
  int64_t states_pruned_by_time = 0;
  // The greedy upper bound on the time (infinity when none was found or the
  // time bound was off).
  double time_upper_bound = 0.0;
  // DP runs made by the iterative deepening of Note [Planner time bound];
  // frontier_sizes are those of the last one.
  int rounds = 1;
};

class ParetoPlanner {
 public:
  // Preconditions (ReplayException(kInvalidArgument) otherwise): every
  // segment has at least one and fewer than 2^31 options; all bytes and
  // `persistent` are >= 0; times are finite and >= 0; persistent plus the
  // largest possible retained sum plus the largest transient is below 2^62.
  ParetoPlanner(
      std::vector<std::vector<PlannerOption>> segments, int64_t persistent);
  ParetoPlanner(const ParetoPlanner&) = delete;
  ParetoPlanner& operator=(const ParetoPlanner&) = delete;

  int64_t num_segments() const {
    return static_cast<int64_t>(segments_.size());
  }
  int64_t persistent() const {
    return persistent_;
  }

  // The smallest budget for which a feasible plan exists:
  // persistent + min over plans of (sum retained + max transient).
  int64_t min_budget() const {
    return min_budget_;
  }

  // Returns the least-time plan with persistent + retained + transient <=
  // budget, chosen by Note [Planner tie-breaking]. Any budget is accepted;
  // when budget < min_budget() the result is infeasible and carries
  // min_budget. Memory use is proportional to the sum of frontier sizes.
  PlannerResult solve(
      int64_t budget,
      const PlannerSettings& settings = PlannerSettings()) const;

  // The time of a feasible plan found greedily (Note [Planner time bound]),
  // or infinity when the greedy finds none. Any budget is accepted.
  double greedy_upper_bound(int64_t budget) const;

  // The LP lower bound of Note [Planner time bound] on the optimal time.
  // Precondition: budget >= min_budget().
  double root_lower_bound(int64_t budget) const;

 private:
  // One DP pass keeping every plan of time <= limit (no bound when limit is
  // infinite).
  PlannerResult run(
      int64_t budget, PlannerDominance dominance, double limit) const;

  std::vector<std::vector<PlannerOption>> segments_;
  int64_t persistent_ = 0;
  int64_t min_budget_ = 0;
  // suffix_min_retained_[i]: sum over segments j >= i of min retained.
  std::vector<int64_t> suffix_min_retained_;
  // suffix_transient_floor_[i]: max over segments j >= i of min transient.
  std::vector<int64_t> suffix_transient_floor_;
  // Lower convex hull of each segment's (retained, time) points: option
  // indices by increasing retained (so decreasing time). Fastest last.
  std::vector<std::vector<int32_t>> hulls_;
  // Sum over all segments of the largest option time (scale of the slack).
  double time_scale_ = 0.0;
};

}  // namespace torch_replay
