#pragma once

// Exact choice of recomputations under a cost budget (Note [Recomputation
// choice] in inductor_pass/stages/recompute.py). Each candidate i changes the
// level (live bytes plus transient) of every base position t by deltas[i][t]
// and adds an event, the level event_level[i] of its replay block just before
// position event_pos[i]. For a set C the peak is
//   max( max_t base[t] + sum_{i in C} deltas[i][t],
//        max_{i in C} event_level[i] + sum_{j in C, j != i}
//        deltas[j][event_pos[i]] ).
// For non-interacting (series-parallel) candidates this is the exact peak of
// the recomputed program, and minimising it under sum cost <= budget is a
// knapsack; it is solved exactly by depth-first branch and bound (bound: every
// undecided candidate's negative changes taken). At most one candidate per
// group is chosen.

#include <cstdint>
#include <vector>

namespace torch_replay::schedule {

constexpr int kMaxRecomputeCandidates = 30;

struct RecomputeChoiceInput {
  std::vector<int64_t> base;                 // level per base position
  std::vector<std::vector<int64_t>> deltas;  // per candidate, per position
  std::vector<int64_t> event_pos;            // per candidate
  std::vector<int64_t> event_level;          // per candidate
  std::vector<int64_t> costs;                // per candidate, >= 0
  std::vector<int64_t> groups;               // per candidate
  int64_t budget = 0;
};

struct RecomputeChoice {
  int64_t peak = 0;         // modelled peak of the chosen set
  int64_t cost = 0;         // its total cost
  std::vector<int> chosen;  // candidate indices, ascending
  int64_t nodes = 0;        // search nodes visited
};

// Least peak, then least cost. Throws ReplayException(kInvalidArgument) on
// inconsistent sizes, a position out of range, a negative cost or more than
// kMaxRecomputeCandidates candidates.
RecomputeChoice choose_recomputation(const RecomputeChoiceInput& input);

// Peak of one set under the same model (the reference of the tests).
int64_t recompute_set_peak(
    const RecomputeChoiceInput& input, const std::vector<int>& chosen);

}  // namespace torch_replay::schedule
