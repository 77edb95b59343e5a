#pragma once

// solve(): best order found by heuristics and the exact capacity search, with
// the min-cut lower bounds as a certificate of optimality (design.md §3.2).

#include <cstdint>
#include <string>
#include <vector>

#include "core/schedule_problem.h"

namespace torch_replay::schedule {

struct SolveOptions {
  // Wall-clock budget for the whole call (bounds, heuristics and search).
  // The bounds and heuristics always complete; the search stops at it.
  double time_limit_s = 1.0;
  // Memoised failed states per capacity test before the search gives up.
  int64_t max_search_states = 2'000'000;
  // Number of randomised greedy restarts besides the fixed rules.
  int random_restarts = 8;
};

struct Solution {
  std::vector<int> order;    // best order found
  int64_t peak = 0;          // its peak
  int64_t initial_peak = 0;  // peak of the given unit order 0..n-1, or -1
                             // when that order is not topological
  int64_t event_cut = 0;     // the bounds (exact, see MinCutBounds)
  int64_t forward_trap = 0;
  int64_t reverse_trap = 0;
  int64_t joint_trap = 0;
  int64_t end_steps = 0;      // MinCutBounds::end_steps (no min cut)
  int64_t lower_bound = 0;    // best proven bound: min-cut or search
  bool certified = false;     // peak == max of the five bounds above
  bool optimal = false;       // peak == lower_bound
  int64_t min_cuts = 0;       // max-flow computations
  int64_t search_states = 0;  // capacity-search states expanded
  int capacity_tests = 0;     // decide() calls
  bool timed_out = false;     // the search stopped at the time limit
  double seconds = 0.0;
};

// Heuristic orders (greedy rules and the original order 0..n-1 when valid),
// the four min-cut bounds with early stop at the best peak, then, unless the
// best peak is already certified, a binary search on the capacity between
// the bound and the best peak (first probe at the bound). Never throws for a
// valid problem; a time limit <= 0 skips the search.
Solution solve(const Problem& problem, const SolveOptions& options);

}  // namespace torch_replay::schedule
