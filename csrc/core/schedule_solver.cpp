#include "core/schedule_solver.h"

#include <algorithm>
#include <chrono>

#include "core/capacity_search.h"
#include "core/min_cut_bounds.h"

namespace torch_replay::schedule {

Solution solve(const Problem& problem, const SolveOptions& options) {
  const auto start = Clock::now();
  const auto deadline =
      start +
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::max(0.0, options.time_limit_s)));
  const int n = problem.num_units();
  Solution sol;
  bool have_order = false;
  auto consider = [&](const std::vector<int>& order) {
    const int64_t peak = problem.peak(order);
    if (!have_order || peak < sol.peak) {
      sol.order = order;
      sol.peak = peak;
      have_order = true;
    }
  };
  std::vector<int> identity(n);
  for (int u = 0; u < n; ++u) {
    identity[u] = u;
  }
  sol.initial_peak = -1;
  if (problem.is_valid_order(identity, nullptr)) {
    sol.initial_peak = problem.peak(identity);
    consider(identity);
  }
  consider(problem.topological_order());
  for (int rule = 0; rule < 3 + options.random_restarts; ++rule) {
    consider(greedy_order(problem, rule));
  }

  MinCutBounds bounds(problem);
  sol.event_cut = bounds.event_cut();
  sol.forward_trap = bounds.forward_trap(sol.peak);
  sol.reverse_trap = bounds.reverse_trap(sol.peak);
  sol.joint_trap = bounds.joint_trap(sol.peak);
  const int64_t certificate = std::max(
      {sol.event_cut, sol.forward_trap, sol.reverse_trap, sol.joint_trap});
  sol.lower_bound = certificate;

  int64_t lo = sol.lower_bound;
  int64_t hi = sol.peak;
  if (lo < hi && options.time_limit_s > 0) {
    CapacitySearch search(problem);
    bool first = true;
    while (lo < hi) {
      const int64_t capacity = first ? lo : lo + (hi - 1 - lo) / 2;
      first = false;
      std::vector<int> order;
      int64_t next = 0;
      ++sol.capacity_tests;
      const Decision d = search.decide(
          capacity, deadline, options.max_search_states, &order, &next);
      if (d == Decision::kUnknown) {
        sol.timed_out = true;
        break;
      }
      if (d == Decision::kFeasible) {
        consider(order);
        hi = sol.peak;
      } else {
        lo = std::max(capacity + 1, next);
      }
    }
    sol.search_states = search.states_expanded();
    sol.min_cuts += search.num_min_cuts();
    sol.lower_bound = std::min(std::max(sol.lower_bound, lo), sol.peak);
  }
  sol.min_cuts += bounds.num_min_cuts();
  sol.certified = sol.peak == certificate;
  sol.optimal = sol.peak == sol.lower_bound;
  sol.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sol;
}

}  // namespace torch_replay::schedule
