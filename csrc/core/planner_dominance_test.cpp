#include "core/planner_dominance.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace torch_replay::planner_detail {
namespace {

// Note [Planner dominance] and Note [Planner tie-breaking] written directly:
// candidate j dominates candidate i when it is no worse in every kept
// dimension and strictly better in retained or time, or equal in both and
// earlier in index. A candidate survives when no other one dominates it
// (O(N^2), no sorting, no staircase).
std::vector<char> brute_force_pareto(const std::vector<State>& cand) {
  std::vector<char> keep(cand.size(), 1);
  for (size_t i = 0; i < cand.size(); ++i) {
    for (size_t j = 0; j < cand.size() && keep[i]; ++j) {
      const State& a = cand[j];
      const State& b = cand[i];
      if (j == i || a.retained > b.retained || a.transient > b.transient ||
          a.time > b.time) {
        continue;
      }
      if (a.retained < b.retained || a.time < b.time || j < i) {
        keep[i] = 0;
      }
    }
  }
  return keep;
}

// The unsafe rule, written directly: j dominates i when its summed memory
// and its time are no larger, and it is strictly better in one of them or
// equal in both and earlier in index.
std::vector<char> brute_force_summed(const std::vector<State>& cand) {
  std::vector<char> keep(cand.size(), 1);
  for (size_t i = 0; i < cand.size(); ++i) {
    const int64_t mi = cand[i].retained + cand[i].transient;
    for (size_t j = 0; j < cand.size() && keep[i]; ++j) {
      const int64_t mj = cand[j].retained + cand[j].transient;
      if (j == i || mj > mi || cand[j].time > cand[i].time) {
        continue;
      }
      if (mj < mi || cand[j].time < cand[i].time || j < i) {
        keep[i] = 0;
      }
    }
  }
  return keep;
}

// Candidates from small ranges, so that equal coordinates (the ties the rule
// is about) are frequent; `time_kind` 0: small integers, 1: dyadic
// fractions, 2: arbitrary doubles.
std::vector<State> random_candidates(std::mt19937_64& rng, int time_kind) {
  const int n = std::uniform_int_distribution<int>(0, 9)(rng);
  const int64_t range = std::uniform_int_distribution<int>(0, 1)(rng) ? 3 : 12;
  std::uniform_int_distribution<int64_t> bytes(0, range);
  std::uniform_int_distribution<int> small_time(0, 4);
  std::uniform_int_distribution<int> dyadic(0, 64);
  std::uniform_real_distribution<double> real_time(0.0, 4.0);
  std::vector<State> cand;
  for (int i = 0; i < n; ++i) {
    State s{};
    s.retained = bytes(rng);
    s.transient = bytes(rng);
    s.time = time_kind == 0   ? small_time(rng)
             : time_kind == 1 ? dyadic(rng) / 16.0
                              : real_time(rng);
    s.parent = static_cast<uint32_t>(i);
    s.option = 0;
    cand.push_back(s);
  }
  // Some exact duplicates of earlier candidates (equal in every dimension:
  // only the earlier one may survive).
  const int dups =
      cand.empty() ? 0 : std::uniform_int_distribution<int>(0, 2)(rng);
  for (int d = 0; d < dups; ++d) {
    const size_t from =
        std::uniform_int_distribution<size_t>(0, cand.size() - 1)(rng);
    cand.push_back(cand[from]);
  }
  return cand;
}

// Expects `sweep` to keep what `brute_force` keeps of 3 kinds of times x 300
// random instances (seeded from `seed`), stopping at the first that differs;
// returns how many candidates the instances dropped.
int64_t expect_sweep_matches(
    uint64_t seed,
    void (*sweep)(const std::vector<State>&, std::vector<char>&),
    std::vector<char> (*brute_force)(const std::vector<State>&)) {
  int instance = 0;
  int64_t dropped = 0;
  for (int time_kind = 0; time_kind < 3; ++time_kind) {
    std::mt19937_64 rng(seed + time_kind);
    for (int k = 0; k < 300; ++k, ++instance) {
      const std::vector<State> cand = random_candidates(rng, time_kind);
      std::vector<char> keep(cand.size(), 0);
      sweep(cand, keep);
      const std::vector<char> want = brute_force(cand);
      EXPECT_EQ(keep, want) << "instance " << instance;
      if (keep != want) {
        return dropped;
      }
      for (char c : want) {
        dropped += c == 0;
      }
    }
  }
  return dropped;
}

TEST(PlannerDominanceTest, ParetoSweepMatchesBruteForce) {
  const int64_t dropped =
      expect_sweep_matches(4100, pareto_sweep, brute_force_pareto);
  EXPECT_GT(dropped, 0);  // (the instances do exercise dominance)
}

TEST(PlannerDominanceTest, SummedMemorySweepMatchesBruteForce) {
  expect_sweep_matches(5200, summed_memory_sweep, brute_force_summed);
}

TEST(PlannerDominanceTest, EveryCandidateOfATinyGridMatchesBruteForce) {
  // All 3^3 (retained, transient, time) points, in two index orders: every
  // tie the rule names occurs.
  std::vector<State> cand;
  for (int r = 0; r < 3; ++r) {
    for (int q = 0; q < 3; ++q) {
      for (int t = 0; t < 3; ++t) {
        cand.push_back(State{r, q, static_cast<double>(t), 0, 0});
      }
    }
  }
  for (int order = 0; order < 2; ++order) {
    std::vector<char> keep(cand.size(), 0);
    pareto_sweep(cand, keep);
    EXPECT_EQ(keep, brute_force_pareto(cand)) << "order " << order;
    std::vector<char> summed(cand.size(), 0);
    summed_memory_sweep(cand, summed);
    EXPECT_EQ(summed, brute_force_summed(cand)) << "order " << order;
    cand.insert(cand.end(), cand.rbegin(), cand.rend());  // (duplicates too)
  }
}

TEST(PlannerDominanceTest, SummedMemoryDropsWhatParetoKeeps) {
  // Note [Planner dominance]'s example: b = (4, 0, 0) "dominates" a =
  // (0, 8, 0) on the sum, but not in (retained, transient, time).
  const std::vector<State> cand = {{0, 8, 0.0, 0, 0}, {4, 0, 0.0, 0, 1}};
  std::vector<char> pareto(2, 0);
  std::vector<char> summed(2, 0);
  pareto_sweep(cand, pareto);
  summed_memory_sweep(cand, summed);
  EXPECT_EQ(pareto, (std::vector<char>{1, 1}));
  EXPECT_EQ(summed, (std::vector<char>{0, 1}));
}

}  // namespace
}  // namespace torch_replay::planner_detail
