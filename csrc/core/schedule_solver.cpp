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
  sol.end_steps = bounds.end_steps();
  const int64_t certificate = std::max(
      {sol.event_cut,
       sol.forward_trap,
       sol.reverse_trap,
       sol.joint_trap,
       sol.end_steps});
  sol.lower_bound = certificate;

  // Binary search on the capacity. `lo` is proven (every failed test proves
  // a bound); `probe_lo` also moves above tests that ran out of their time
  // share, so that the remaining time goes to capacities that are likelier
  // to be decided. The first probe, at the bound, gets a quarter of the
  // budget, later ones half of what is left.
  int64_t lo = sol.lower_bound;
  int64_t probe_lo = lo;
  int64_t hi = sol.peak;
  if (lo < hi && options.time_limit_s > 0) {
    CapacitySearch search(problem);
    bool first = true;
    while (probe_lo < hi) {
      const auto now = Clock::now();
      if (now >= deadline) {
        sol.timed_out = true;
        break;
      }
      const auto share = (deadline - now) / (first ? 4 : 2);
      const auto probe_deadline =
          share < std::chrono::milliseconds(1) ? deadline : now + share;
      const int64_t capacity =
          first ? probe_lo : probe_lo + (hi - 1 - probe_lo) / 2;
      first = false;
      std::vector<int> order;
      int64_t next = 0;
      ++sol.capacity_tests;
      const Decision d = search.decide(
          capacity, probe_deadline, options.max_search_states, &order, &next);
      if (d == Decision::kUnknown) {
        sol.timed_out = true;
        probe_lo = capacity + 1;
      } else if (d == Decision::kFeasible) {
        consider(order);
        hi = sol.peak;
      } else {
        lo = std::max(lo, std::max(capacity + 1, next));
        probe_lo = std::max(probe_lo, lo);
      }
    }
    if (lo >= hi) {
      sol.timed_out = false;
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
