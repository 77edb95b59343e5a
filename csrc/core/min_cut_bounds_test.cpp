#include "core/min_cut_bounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/exhaustive_schedule.h"
#include "core/schedule_testing.h"

namespace torch_replay::schedule {
namespace {

// E(u | A, B) by enumerating every subset of units (n <= 12).
int64_t brute_event(
    const Problem& p,
    int u,
    const std::vector<int>& done,
    const std::vector<int>& not_done) {
  const int n = p.num_units();
  int64_t best = kInfeasible;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    UnitSet s(n);
    for (int v = 0; v < n; ++v) {
      if ((mask >> v) & 1u) {
        s.insert(v);
      }
    }
    bool ok = !s.contains(u) && p.ancestors(u).is_subset_of(s);
    for (int v = 0; v < n && ok; ++v) {
      if (s.contains(v)) {
        ok = p.ancestors(v).is_subset_of(s);  // downset
      }
    }
    for (int a : done) {
      ok = ok && s.contains(a);
    }
    for (int b : not_done) {
      ok = ok && !s.contains(b);
    }
    if (ok) {
      best = std::min(best, p.resident(s) + p.out_bytes(u));
    }
  }
  return best;
}

struct BruteBounds {
  int64_t ec = 0, f = 0, r = 0, j = 0;
};

// The four bounds straight from their definitions.
BruteBounds brute_bounds(const Problem& p) {
  const int n = p.num_units();
  BruteBounds b;
  for (int u = 0; u < n; ++u) {
    b.ec = std::max(b.ec, brute_event(p, u, {}, {}));
  }
  b.f = b.r = b.j = b.ec;
  for (int u = 0; u < n; ++u) {
    for (int v = u + 1; v < n; ++v) {
      if (p.comparable(u, v)) {
        continue;
      }
      const int64_t d_uv = brute_event(p, u, {v}, {});
      const int64_t d_vu = brute_event(p, v, {u}, {});
      const int64_t n_uv = brute_event(p, u, {}, {v});
      const int64_t n_vu = brute_event(p, v, {}, {u});
      b.f = std::max(b.f, std::min(d_uv, d_vu));
      b.r = std::max(b.r, std::min(n_uv, n_vu));
      b.j = std::max(b.j, std::min(std::max(n_uv, d_vu), std::max(n_vu, d_uv)));
    }
  }
  return b;
}

// The optimal peak (exhaustive) and the four bounds of a hand-made problem.
struct Expected {
  int64_t opt, event, forward, reverse, joint;
};

void expect_bounds(const ProblemSpec& spec, const Expected& e) {
  const Problem p(spec);
  MinCutBounds bounds(p);
  EXPECT_EQ(solve_exhaustive(p).peak, e.opt);
  EXPECT_EQ(bounds.event_cut(), e.event);
  EXPECT_EQ(bounds.forward_trap(), e.forward);
  EXPECT_EQ(bounds.reverse_trap(), e.reverse);
  EXPECT_EQ(bounds.joint_trap(), e.joint);
}

ProblemSpec five_units(
    std::vector<int64_t> sizes,
    std::vector<int> producer,
    std::vector<std::vector<int>> consumers) {
  ProblemSpec spec;
  spec.num_units = 5;
  spec.sizes = std::move(sizes);
  spec.producer = std::move(producer);
  spec.consumers = std::move(consumers);
  return spec;
}

// Two hills joined at the end:
//
//   [0] --10--> [1] --1--.
//                         v
//                        [4]
//                         ^
//   [2] --10--> [3] --1--'
//
// Each of 1 and 3 alone needs 10 + 1 (event cut 11), but whichever of them
// runs second also holds the other's 1: the forward trap finds 12 = OPT. The
// reverse trap cannot see it (whichever runs first is cheap).
TEST(MinCutBoundsTest, TwoHillsForwardTrap) {
  expect_bounds(
      five_units({10, 1, 10, 1}, {0, 1, 2, 3}, {{1}, {4}, {3}, {4}}),
      {/*opt*/ 12, /*event*/ 11, /*forward*/ 12, /*reverse*/ 11, /*joint*/ 12});
}

// The same graph reversed: a fork whose two small buffers both stay live
// until their consumers run.
//
//        .--1--> [1] --10--> [2]
//   [0] -|
//        `--1--> [3] --10--> [4]
//
// Whichever of 1 and 3 runs first still holds the other's 1 (reverse trap
// 12 = OPT); run second, it is cheap (forward trap 11).
TEST(MinCutBoundsTest, ForkReverseTrap) {
  expect_bounds(
      five_units({1, 1, 10, 10}, {0, 0, 1, 3}, {{1}, {3}, {2}, {4}}),
      {/*opt*/ 12, /*event*/ 11, /*forward*/ 11, /*reverse*/ 12, /*joint*/ 12});
}

TEST(MinCutBoundsTest, EventMatchesBruteForce) {
  for (uint64_t seed = 0; seed < 150; ++seed) {
    const int n = 1 + seed % 9;
    const Problem p(testing::random_spec(seed, n));
    EventOracle oracle(p);
    std::mt19937 rng(seed);
    for (int u = 0; u < n; ++u) {
      std::vector<int> done, not_done;
      for (int v = 0; v < n; ++v) {
        if (v != u && rng() % 4 == 0) {
          (rng() % 2 ? done : not_done).push_back(v);
        }
      }
      UnitSet smallest, largest;
      const int64_t got = oracle.event(u, done, not_done, &smallest, &largest);
      ASSERT_EQ(got, brute_event(p, u, done, not_done)) << seed << " " << u;
      if (got != kInfeasible) {
        // Both reported downsets are minimisers and nested.
        ASSERT_EQ(p.resident(smallest) + p.out_bytes(u), got);
        ASSERT_EQ(p.resident(largest) + p.out_bytes(u), got);
        ASSERT_TRUE(smallest.is_subset_of(largest));
      }
    }
  }
}

// The pruned pair loops compute exactly the bounds of the definitions, the
// bounds are ordered as claimed, and none exceeds the optimum.
TEST(MinCutBoundsTest, RandomBoundsAreExactAndSound) {
  int f_beats_r = 0, r_beats_f = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const int n = 2 + seed % 9;
    const Problem p(testing::random_spec(seed * 7 + 1, n));
    const BruteBounds want = brute_bounds(p);
    MinCutBounds bounds(p);
    ASSERT_EQ(bounds.event_cut(), want.ec) << seed;
    ASSERT_EQ(bounds.forward_trap(), want.f) << seed;
    ASSERT_EQ(bounds.reverse_trap(), want.r) << seed;
    ASSERT_EQ(bounds.joint_trap(), want.j) << seed;
    const int64_t opt = solve_exhaustive(p).peak;
    ASSERT_LE(want.j, opt) << seed;
    ASSERT_GE(want.j, std::max(want.f, want.r)) << seed;
    f_beats_r += want.f > want.r;
    r_beats_f += want.r > want.f;
  }
  // Incomparable: each wins somewhere.
  EXPECT_GT(f_beats_r, 0);
  EXPECT_GT(r_beats_f, 0);
}

// Independent sources whose outputs all stay live: every pair bound sees
// two of them, the last step sees all four.
//
//   [0] -> out 5   [1] -> out 5   [2] -> out 5   [3] -> out 5
TEST(MinCutBoundsTest, EndStepsSeeAccumulatedOutputs) {
  ProblemSpec spec;
  spec.num_units = 4;
  spec.sizes = {5, 5, 5, 5};
  spec.producer = {0, 1, 2, 3};
  spec.consumers = {{}, {}, {}, {}};
  spec.outputs = {0, 1, 2, 3};
  const Problem p(spec);
  MinCutBounds bounds(p);
  EXPECT_EQ(solve_exhaustive(p).peak, 20);
  EXPECT_EQ(bounds.joint_trap(), 10);
  EXPECT_EQ(bounds.end_steps(), 20);
}

TEST(MinCutBoundsTest, EndStepsAreSound) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Problem p(testing::random_spec(seed + 777, seed % 12));
    EXPECT_LE(MinCutBounds(p).end_steps(), solve_exhaustive(p).peak) << seed;
  }
}

TEST(MinCutBoundsTest, EarlyStopIsExactAtAFeasiblePeak) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const Problem p(testing::random_spec(seed + 5000, 2 + seed % 10));
    const int64_t opt = solve_exhaustive(p).peak;
    MinCutBounds full(p);
    MinCutBounds stopped(p);
    const int64_t f = full.forward_trap();
    const int64_t r = full.reverse_trap();
    EXPECT_EQ(stopped.forward_trap(opt), std::min(f, opt));
    EXPECT_EQ(stopped.reverse_trap(opt), std::min(r, opt));
    // A later call without stop recomputes the full value.
    EXPECT_EQ(stopped.forward_trap(), f);
  }
}

}  // namespace
}  // namespace torch_replay::schedule
