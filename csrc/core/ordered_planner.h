#pragma once

// The exact planner of a layer plan with the layers' order and gradients in
// its peak (torch_replay/_planning/layer_order.py is its Python API). Same
// option model as the joint planner (pareto_planner.h: PlannerOption,
// PlannerResult), a different peak.
//
// Note [Ordered layer peak]
// A training step's backward visits the layers last to first. While layer i
// runs its backward (its re-run included, when checkpointed), what is alive is
//
//  * what every earlier layer j <= i keeps from the forward: its `retained`
//    bytes (activations when kept; its input and preserved state when
//    checkpointed);
//  * layer i's `transient` bytes (its backward's temporaries and, measured
//    with gradients cleared as the calibration does, the gradients it
//    creates);
//  * the gradients of every later layer j > i, created by their backwards
//    already: grads[j] bytes each (0 when the step holds every gradient
//    throughout: they are then persistent bytes);
//  * the persistent bytes (parameters, buffers, optimizer state, what the
//    model keeps outside its layers through their backward).
//
// Before the last layer's backward, the head's backward runs beside every
// layer's retained bytes: `head` more bytes (the logits, their gradient, the
// loss's temporaries). So the peak of a choice of options is
//
//   persistent + max(floor, head + sum_j retained_j,
//                    max_i (sum_{j<=i} retained_j + transient_i
//                           + sum_{j>i} grads_j))
//
// where `floor` is what the step holds after the layers (every gradient). A
// layer checkpointed with the journal pays its own log: the layers' declared
// states are their own (disjoint), so their logs are separate (a shared log
// would be counted once per layer here, an over-count). The forward needs no
// term of its own: while layer i runs its forward, sum_{j<i} retained_j plus
// its temporaries is alive, at most the backward's figure (a calibrated
// `transient` is the larger of the forward's and the backward's).
//
// plan_ordered minimises the summed time (added in layer order, as doubles)
// under peak <= budget exactly by a dynamic program over the layers in program
// order whose states are the Pareto frontier of (retained so far R, peak so
// far P, time so far C): the constraint at layer i depends on the past only
// through R (and so does the head's term), and a state no better in all three
// than another can never lead to a better plan. A candidate is generated only
// when its P and R + head fit budget - persistent (R and P only grow); after
// the last layer P takes the head's term. The frontier of a layer: the
// candidates sorted by (R, P, C, option positions, layer 0 first); a candidate
// is kept unless a kept one has P and C no larger (every kept one has R no
// larger). That is one sweep over a staircase of the kept (P, C) (P
// increasing, C decreasing; the query is the step of largest P <= the
// candidate's), O(N log N) for N candidates, against the O(N * K) of testing
// every kept state (K kept). Among the final states of least time the one of
// lowest peak is returned, then the first option positions among those the
// frontier kept (an equally good plan with more retained bytes at some layer
// can have been dropped for a later one). min_budget is persistent plus the
// least final peak over a (R, P) frontier computed without the budget.

#include <cstdint>
#include <vector>

#include "core/pareto_planner.h"

namespace torch_replay {

// The model of Note [Ordered layer peak] besides the options.
struct OrderedPeakTerms {
  // grads[i]: the gradient bytes layer i's backward creates.
  std::vector<int64_t> grads;
  int64_t persistent = 0;  // held through the whole step
  int64_t floor = 0;       // held after the layers' backward
  int64_t head = 0;        // beside every retained byte before the backward
};

// The peak of Note [Ordered layer peak] of `chosen` (one option per layer,
// in program order). ReplayException(kInvalidArgument) when the sizes
// differ or a byte count is negative or too large (see plan_ordered).
int64_t ordered_peak(
    const std::vector<PlannerOption>& chosen, const OrderedPeakTerms& terms);

// The least-time choice with ordered_peak <= budget (Note [Ordered layer
// peak]). `peak` is that ordered peak, `retained` the chosen options' sum and
// `transient` their largest; `time_upper_bound` is infinity (no time bound is
// used), `states_pruned_by_time` 0 and `rounds` 1. When no choice fits the
// result is infeasible and carries min_budget.
// Preconditions (ReplayException(kInvalidArgument) otherwise): one entry of
// terms.grads per segment; every segment has at least one and fewer than
// 2^31 options; bytes are >= 0 and every sum of the peak's formula is below
// 2^62; times are finite and >= 0.
PlannerResult plan_ordered(
    const std::vector<std::vector<PlannerOption>>& segments,
    const OrderedPeakTerms& terms,
    int64_t budget);

}  // namespace torch_replay
