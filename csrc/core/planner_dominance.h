#pragma once

// The dominance sweeps of the Pareto planner's DP (pareto_planner.h, Note
// [Planner dominance] and Note [Planner tie-breaking]): which candidate
// partial plans of one segment survive. Internal to the planner's files
// (pareto_planner, planner_dominance); not a public header.

#include <cstdint>
#include <vector>

namespace torch_replay::planner_detail {

// A partial plan after some segment. `parent` is the index of the state it
// extends in the previous layer; `option` the option taken for this segment.
struct State {
  int64_t retained;
  int64_t transient;
  double time;
  uint32_t parent;
  uint32_t option;
};

// Marks in keep[] the candidates that no other candidate dominates in
// (retained, transient, time), with the tie rule of Note [Planner
// tie-breaking]: a dominator must be strictly better in retained or time, or
// equal in both and earlier in index. `cand` is in the lexicographic order of
// the candidates' option sequences; keep[] is zeroed and of cand's size.
void pareto_sweep(const std::vector<State>& cand, std::vector<char>& keep);

// The unsafe rule of Note [Planner dominance]: (retained + transient, time).
// For tests only (PlannerDominance::kSummedMemory).
void summed_memory_sweep(
    const std::vector<State>& cand, std::vector<char>& keep);

}  // namespace torch_replay::planner_detail
