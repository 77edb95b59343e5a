#pragma once

// Exact optimum of small Problems by dynamic programming over downsets: the
// reference the bounds and the capacity search are tested against.

#include <cstdint>
#include <vector>

#include "core/schedule_problem.h"

namespace torch_replay::schedule {

constexpr int kMaxExhaustiveUnits = 22;

struct ExhaustiveResult {
  int64_t peak = 0;          // optimal peak (0 without units)
  std::vector<int> order;    // an order achieving it
  int64_t num_downsets = 0;  // downsets reached by the DP
};

// Minimum peak over all topological orders, by DP over the 2^n bitmasks:
// best(S + {u}) = min over u of max(best(S), res(S) + out(u)). Time
// O(2^n (n + m)), memory 9 * 2^n bytes. Throws
// ReplayException(kInvalidArgument) when problem.num_units() >
// kMaxExhaustiveUnits.
ExhaustiveResult solve_exhaustive(const Problem& problem);

}  // namespace torch_replay::schedule
