#pragma once

// Exact capacity search (design.md §3.2): does an order with peak <= C
// exist? Depth-first over ideal orders (chains of downsets) with dominance
// closures, a per-state liveness bound and memoised failures.
//
// Note [Capacity search dominance]
// Two moves never lose a schedule that fits in C (proofs in
// docs/lower_bounds.md, "Exact capacity search"):
//  1. Free step: a ready unit u with res(S) + out(u) <= C and
//     res(S + {u}) <= res(S) may run at once. Moving u to the front of any
//     completion only lowers the resident bytes of the states before u's old
//     position (u frees at least as much later as now).
//  2. Min-cut packet: let T be the smallest downset minimising res over the
//     downsets containing S (one minimum cut, EventOracle::
//     min_resident_superset). If T \ S can be run from S within C, jump to
//     T. By submodularity of res, res(T + X) <= res(X) for every downset
//     X >= S, so any completion from S, replayed from T without T's units,
//     still fits.
// A state is pruned when some unit w that has not run is forced to see more
// than C bytes at its own step: its outputs, plus every buffer produced
// before w (in S or an ancestor of w) that an output or a consumer at or
// after w keeps alive.
//
// Every rejection records its cost (> C); when the search fails, the
// smallest recorded cost is a proven lower bound of the optimum (the search
// at any smaller capacity would take exactly the same decisions).

#include <chrono>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "core/min_cut_bounds.h"
#include "core/schedule_problem.h"

namespace torch_replay::schedule {

using Clock = std::chrono::steady_clock;

enum class Decision { kFeasible, kInfeasible, kUnknown };

// Non-copyable: owns the min-cut oracle and the search buffers. The problem
// must outlive it.
class CapacitySearch {
 public:
  explicit CapacitySearch(const Problem& problem);
  CapacitySearch(const CapacitySearch&) = delete;
  CapacitySearch& operator=(const CapacitySearch&) = delete;

  // Decides whether an order with peak <= capacity exists, giving up
  // (kUnknown) at `deadline` or after `max_states` memoised failures.
  // kFeasible: *order receives such an order. kInfeasible: *next_capacity
  // receives a value > capacity that is a lower bound of the optimal peak.
  // Preconditions: order and next_capacity are non-null.
  Decision decide(
      int64_t capacity,
      Clock::time_point deadline,
      int64_t max_states,
      std::vector<int>* order,
      int64_t* next_capacity);

  // States expanded over all decide() calls.
  int64_t states_expanded() const {
    return states_expanded_;
  }
  int64_t num_min_cuts() const {
    return oracle_.num_min_cuts();
  }

 private:
  struct GiveUp {};
  bool dfs();
  void apply(int u);
  void undo(int u);
  int64_t delta(int u) const;
  int64_t forced_bound() const;
  void reject(int64_t cost) {
    if (cost < next_) {
      next_ = cost;
    }
  }

  const Problem& problem_;
  EventOracle oracle_;
  int n_;
  std::vector<int64_t> static_forced_;  // per unit, independent of S
  std::vector<UnitSet> dynamic_mask_;   // per buffer
  // Search state.
  int64_t capacity_ = 0;
  int64_t next_ = 0;
  int64_t res_ = 0;
  UnitSet done_;
  std::vector<int> path_;
  std::vector<int> missing_preds_;
  std::vector<int> remaining_consumers_;
  std::unordered_set<UnitSet, UnitSetHash> failed_;
  Clock::time_point deadline_;
  int64_t max_states_ = 0;
  int64_t states_expanded_ = 0;
};

// Greedy list schedules used as upper bounds. rule 0: least step cost, then
// most freed; rule 1: most freed, then least step cost; rule 2: successors
// of the last unit first (depth-first), then most freed; rule >= 3: rule 0
// with ties and near-ties broken by a random generator seeded with `rule`.
std::vector<int> greedy_order(const Problem& problem, int rule);

}  // namespace torch_replay::schedule
