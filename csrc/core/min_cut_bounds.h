#pragma once

// Lower bounds on the optimal peak of a Problem (design.md §3.2), each from
// minimum cuts computed with Boost.Graph's boykov_kolmogorov_max_flow.
//
// Note [Conditional event minimum]
// E(u | A, B) is the least cost(S, u) (see Note [Schedule memory model]) over
// downsets S that contain the ancestors of u and every unit of A (with their
// ancestors) and exclude u, its descendants, every unit of B and their
// descendants. With x_v = [v in S] and y_b = [every consumer of b is in S]
// (only for non-output buffers with consumers),
//
//   cost(S, u) = initial_resident + out(u)
//              + sum_v x_v * resbytes(v) - sum_b y_b * size(b)
//
// subject to x_v -> x_w for every precedence w -> v and y_b -> x_c for every
// consumer c of b; resbytes(v) counts v's buffers that are outputs or have
// consumers. Minimising a linear function over the closed sets of these
// implications is a minimum-weight closure problem (Picard 1976), i.e. one
// s-t minimum cut: x_v -> t with capacity resbytes(v), s -> y_b with
// capacity size(b), infinite arcs for the implications, infinite s -> x_a /
// x_b -> t arcs for the fixed variables. The source side of a minimum cut is a
// minimising downset; the residual graph gives the smallest and the largest
// one (minimisers form a lattice).
//
// Every schedule runs u from some admissible S, so
//   event cut     EC = max_u E(u | {}, {})
// and for a pair {u, v} (whichever runs second does so with the other done;
// whichever runs first does so with the other not done)
//   forward trap  F = max(EC, max_{u,v} min(E(u|{v},{}), E(v|{u},{})))
//   reverse trap  R = max(EC, max_{u,v} min(E(u|{},{v}), E(v|{},{u})))
//   joint trap    J = max(EC, max_{u,v} min(max(E(u|{},{v}), E(v|{u},{})),
//                                           max(E(v|{},{u}), E(u|{v},{}))))
// (if u runs first, u's step excludes v and v's step includes u). Every pair
// value is at least the events of comparable pairs, so F, R >= EC, and
// J >= max(F, R). docs/lower_bounds.md has the full argument.

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/schedule_problem.h"

namespace torch_replay::schedule {

constexpr int64_t kInfeasible = std::numeric_limits<int64_t>::max();
constexpr int64_t kNoStop = std::numeric_limits<int64_t>::max();

// Evaluates E(u | A, B) and related closure problems with one max-flow each.
// Non-copyable: owns the flow network. Keeps a reference to the problem,
// which must outlive it.
class EventOracle {
 public:
  explicit EventOracle(const Problem& problem);
  ~EventOracle();
  EventOracle(const EventOracle&) = delete;
  EventOracle& operator=(const EventOracle&) = delete;

  // E(u | done, not_done) of Note [Conditional event minimum], or kInfeasible
  // when no downset is admissible. When non-null, `smallest` / `largest`
  // receive the smallest / largest minimising downset (left unchanged when
  // infeasible). Preconditions: 0 <= u < num_units, all listed units valid.
  int64_t event(
      int u,
      const std::vector<int>& done,
      const std::vector<int>& not_done,
      UnitSet* smallest = nullptr,
      UnitSet* largest = nullptr);

  // min res(T) over downsets T containing `base` (a downset, not checked);
  // `smallest` receives the smallest minimiser when non-null.
  int64_t min_resident_superset(const UnitSet& base, UnitSet* smallest);

  // Number of max-flow computations so far.
  int64_t num_min_cuts() const {
    return num_min_cuts_;
  }

 private:
  struct Network;
  int64_t solve(
      const std::vector<int>& force_in,
      const std::vector<int>& force_out,
      UnitSet* smallest,
      UnitSet* largest);

  const Problem& problem_;
  std::unique_ptr<Network> net_;
  int64_t num_min_cuts_ = 0;
};

// The event-cut, forward-trap, reverse-trap and joint-trap bounds of Note
// [Conditional event minimum], sharing one cache of conditional minima. Each
// trap needs O(n^2) minimum cuts in the worst case; upper bounds from known
// minimising downsets skip most pairs (see docs/lower_bounds.md). Memory is
// O(n^2). Non-copyable; the problem must outlive it.
class MinCutBounds {
 public:
  explicit MinCutBounds(const Problem& problem);
  MinCutBounds(const MinCutBounds&) = delete;
  MinCutBounds& operator=(const MinCutBounds&) = delete;

  // E(u | {}, {}). Precondition: 0 <= u < num_units.
  int64_t event(int u);
  // max_u event(u); 0 when there are no units.
  int64_t event_cut();
  // The trap bounds. Each stops early, returning a value >= stop_at, as soon
  // as its running maximum reaches stop_at; with stop_at = the peak of some
  // order the result is then exact (no bound exceeds a feasible peak).
  int64_t forward_trap(int64_t stop_at = kNoStop);
  int64_t reverse_trap(int64_t stop_at = kNoStop);
  int64_t joint_trap(int64_t stop_at = kNoStop);

  // The first and the last step of every schedule: the last unit is a sink
  // run with every other unit done, the first a source run from {}, so
  //   end_steps = max(min_{sink u} cost(V - {u}, u),
  //                   min_{source u} cost({}, u)).
  // No minimum cut; catches outputs accumulating over independent branches,
  // which no pair bound sees. 0 without units.
  int64_t end_steps() const;

  int64_t num_min_cuts() const {
    return oracle_.num_min_cuts();
  }

 private:
  enum Kind { kDone = 0, kNotDone = 1 };
  void ensure_events();
  // Upper bound / exact value of E(u | {v}, {}) (kDone) or E(u | {}, {v})
  // (kNotDone) for an incomparable pair.
  int64_t upper(Kind kind, int u, int v);
  int64_t exact(Kind kind, int u, int v);
  // Records that downset w (admissible for u) costs `value` at u's step.
  void add_witness(int u, const UnitSet& w, int64_t value);
  // True when max(E(k1,u1,v1), E(k2,u2,v2)) > cur; then *value is that max.
  bool max_exceeds(
      Kind k1,
      int u1,
      int v1,
      Kind k2,
      int u2,
      int v2,
      int64_t cur,
      int64_t* value);
  int64_t trap(Kind kind, int64_t stop_at);
  // trap(kind, stop_at), or its cached value when that one still answers.
  int64_t cached_trap(Kind kind, int64_t stop_at);

  const Problem& problem_;
  EventOracle oracle_;
  int n_;
  bool events_ready_ = false;
  std::vector<int64_t> event_;
  std::vector<UnitSet> smallest_, largest_;
  // [kind][u * n + v]; -1 = not yet initialised.
  std::vector<int64_t> upper_[2];
  std::vector<char> exact_[2];
  int64_t trap_value_[2] = {-1, -1};
  int64_t trap_stop_[2] = {0, 0};
};

}  // namespace torch_replay::schedule
