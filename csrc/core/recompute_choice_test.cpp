#include "core/recompute_choice.h"

#include <gtest/gtest.h>

#include <random>

#include "core/status.h"

namespace torch_replay::schedule {
namespace {

// Series-parallel skips: candidate i frees `size` bytes over (p, q) and its
// replay block at q holds `extra` bytes above the level there.
RecomputeChoiceInput random_input(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  RecomputeChoiceInput in;
  const int t = static_cast<int>(pick(4, 16));
  for (int k = 0; k < t; ++k) {
    in.base.push_back(pick(10, 100));
  }
  const int n = static_cast<int>(pick(0, 9));
  for (int i = 0; i < n; ++i) {
    const int p = static_cast<int>(pick(0, t - 3));
    const int q = static_cast<int>(pick(p + 2, t - 1));
    const int64_t size = pick(1, 40);
    std::vector<int64_t> d(t, 0);
    for (int k = p + 1; k < q; ++k) {
      d[k] = -size;
    }
    in.deltas.push_back(d);
    in.event_pos.push_back(q);
    in.event_level.push_back(in.base[q] + pick(-10, 30));
    in.costs.push_back(pick(0, 10));
    in.groups.push_back(pick(0, n));  // some candidates share a group
  }
  in.budget = pick(0, 25);
  return in;
}

TEST(RecomputeChoiceTest, MatchesEnumerationOfAllSubsets) {
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const RecomputeChoiceInput in = random_input(seed);
    const int n = static_cast<int>(in.deltas.size());
    int64_t best = recompute_set_peak(in, {});
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      std::vector<int> set;
      int64_t cost = 0;
      bool ok = true;
      for (int i = 0; i < n; ++i) {
        if (mask & (1u << i)) {
          for (int j : set) {
            ok = ok && in.groups[j] != in.groups[i];
          }
          set.push_back(i);
          cost += in.costs[i];
        }
      }
      if (ok && cost <= in.budget) {
        best = std::min(best, recompute_set_peak(in, set));
      }
    }
    const RecomputeChoice r = choose_recomputation(in);
    ASSERT_EQ(r.peak, best) << seed;
    ASSERT_EQ(recompute_set_peak(in, r.chosen), r.peak) << seed;
    int64_t cost = 0;
    for (int i : r.chosen) {
      cost += in.costs[i];
    }
    ASSERT_EQ(cost, r.cost) << seed;
    ASSERT_LE(cost, in.budget) << seed;
  }
}

TEST(RecomputeChoiceTest, RejectsInconsistentInput) {
  RecomputeChoiceInput in;
  in.base = {1, 2, 3};
  in.deltas = {{0, -1}};
  in.event_pos = {2};
  in.event_level = {3};
  in.costs = {0};
  in.groups = {0};
  EXPECT_THROW(choose_recomputation(in), ReplayException);
  in.deltas = {{0, -1, 0}};
  in.event_pos = {3};
  EXPECT_THROW(choose_recomputation(in), ReplayException);
  in.event_pos = {2};
  in.costs = {-1};
  EXPECT_THROW(choose_recomputation(in), ReplayException);
}

}  // namespace
}  // namespace torch_replay::schedule
