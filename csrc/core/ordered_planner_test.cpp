#include "core/ordered_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace torch_replay {
namespace {

using Segments = std::vector<std::vector<PlannerOption>>;

// Note [Ordered layer peak]'s formula written term by term (no running sums).
int64_t formula_peak(
    const std::vector<PlannerOption>& chosen, const OrderedPeakTerms& t) {
  int64_t all_retained = 0;
  for (const PlannerOption& o : chosen) {
    all_retained += o.retained;
  }
  int64_t top = std::max(t.floor, t.head + all_retained);
  for (size_t i = 0; i < chosen.size(); ++i) {
    int64_t alive = chosen[i].transient;
    for (size_t j = 0; j < chosen.size(); ++j) {
      alive += j <= i ? chosen[j].retained : t.grads[j];
    }
    top = std::max(top, alive);
  }
  return t.persistent + top;
}

struct Best {
  bool feasible = false;
  double time = 0.0;
  int64_t peak = 0;
  int64_t min_budget = std::numeric_limits<int64_t>::max();
};

// Every choice: least time (summed in layer order), then lowest peak, among
// those within the budget; and the least peak of all.
Best brute_force(
    const Segments& segs, const OrderedPeakTerms& t, int64_t budget) {
  Best best;
  std::vector<size_t> idx(segs.size(), 0);
  while (true) {
    std::vector<PlannerOption> chosen;
    double time = 0.0;
    for (size_t s = 0; s < segs.size(); ++s) {
      chosen.push_back(segs[s][idx[s]]);
      time += chosen.back().time;
    }
    const int64_t peak = formula_peak(chosen, t);
    best.min_budget = std::min(best.min_budget, peak);
    if (peak <= budget && (!best.feasible || time < best.time ||
                           (time == best.time && peak < best.peak))) {
      best = {true, time, peak, best.min_budget};
    }
    size_t s = 0;
    while (s < segs.size() && ++idx[s] == segs[s].size()) {
      idx[s++] = 0;
    }
    if (s == segs.size()) {
      return best;
    }
  }
}

std::vector<PlannerOption> chosen_of(
    const Segments& segs, const PlannerResult& r) {
  std::vector<PlannerOption> chosen;
  for (size_t s = 0; s < segs.size(); ++s) {
    chosen.push_back(segs[s].at(r.choices.at(s)));
  }
  return chosen;
}

TEST(OrderedPlanner, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(11);
  auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  int infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = uniform(1, 6);
    Segments segs(n);
    OrderedPeakTerms t;
    for (int s = 0; s < n; ++s) {
      segs[s].push_back({uniform(5, 40), uniform(1, 9), 1.0});
      for (int k = uniform(1, 3); k > 0; --k) {
        // Quarter steps: exact sums, so time ties are real ties.
        segs[s].push_back(
            {uniform(0, 6), uniform(5, 50), uniform(4, 24) / 4.0});
      }
      t.grads.push_back(uniform(0, 12));
    }
    t.persistent = uniform(0, 20);
    t.floor = uniform(0, 30);
    t.head = uniform(0, 9);
    const int64_t smallest = brute_force(segs, t, -1).min_budget;
    for (int64_t budget : {smallest - 1, smallest, smallest + uniform(0, 60)}) {
      const Best want = brute_force(segs, t, budget);
      const PlannerResult got = plan_ordered(segs, t, budget);
      ASSERT_EQ(got.feasible, want.feasible) << trial;
      EXPECT_EQ(got.min_budget, smallest) << trial;
      ASSERT_EQ(got.frontier_sizes.size(), segs.size());
      if (!want.feasible) {
        EXPECT_TRUE(got.choices.empty());
        ++infeasible;
        continue;
      }
      EXPECT_EQ(got.time, want.time) << trial;
      EXPECT_EQ(got.peak, want.peak) << trial;
      const std::vector<PlannerOption> chosen = chosen_of(segs, got);
      EXPECT_EQ(formula_peak(chosen, t), got.peak) << trial;
      EXPECT_EQ(ordered_peak(chosen, t), got.peak) << trial;
      int64_t retained = 0;
      int64_t transient = 0;
      for (const PlannerOption& o : chosen) {
        retained += o.retained;
        transient = std::max(transient, o.transient);
      }
      EXPECT_EQ(got.retained, retained);
      EXPECT_EQ(got.transient, transient);
    }
  }
  EXPECT_GT(infeasible, 300);  // smallest - 1 never fits
}

TEST(OrderedPlanner, OrderedPeakIsTheFormula) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = static_cast<int>(rng() % 6);
    std::vector<PlannerOption> chosen;
    OrderedPeakTerms t;
    for (int i = 0; i < n; ++i) {
      chosen.push_back(
          {static_cast<int64_t>(rng() % 50),
           static_cast<int64_t>(rng() % 50),
           0.0});
      t.grads.push_back(static_cast<int64_t>(rng() % 20));
    }
    t.persistent = rng() % 9;
    t.floor = rng() % 80;
    t.head = rng() % 30;
    EXPECT_EQ(ordered_peak(chosen, t), formula_peak(chosen, t)) << trial;
  }
}

TEST(OrderedPlanner, InfeasibleBudgetCarriesMinBudget) {
  // Two layers; the later one's gradients (7) sit beside the earlier one's
  // backward. Least peak 10 + 38: layer 0 checkpointed (1 + 30 + 7), layer 1
  // either way; kept (21 + 2) is the faster.
  const Segments segs{
      {{20, 2, 1.0}, {1, 30, 3.0}}, {{20, 2, 1.0}, {1, 30, 3.0}}};
  OrderedPeakTerms t{{0, 7}, 10, 0, 0};
  PlannerResult r = plan_ordered(segs, t, 47);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.min_budget, 48);
  EXPECT_TRUE(r.choices.empty());
  r = plan_ordered(segs, t, 48);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.choices, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(r.peak, 48);
  EXPECT_EQ(r.time, 4.0);
  // Any budget below persistent is simply infeasible.
  EXPECT_FALSE(
      plan_ordered(segs, t, std::numeric_limits<int64_t>::min()).feasible);
  // The head's term can decide: 10 + 2 + 40 > 48.
  t.head = 40;
  r = plan_ordered(segs, t, 48);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.min_budget, 52);
}

TEST(OrderedPlanner, TiesGoToLowestPeakThenFirstPositions) {
  OrderedPeakTerms t{{0, 0}, 0, 0, 0};
  // Identical options: the first positions.
  Segments same{{{3, 3, 1.0}, {3, 3, 1.0}}, {{3, 3, 1.0}, {3, 3, 1.0}}};
  PlannerResult r = plan_ordered(same, t, 100);
  EXPECT_EQ(r.choices, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(r.frontier_sizes, (std::vector<int64_t>{1, 1}));
  // Equal times: the lower peak, even listed later.
  Segments peaks{{{9, 9, 1.0}, {1, 2, 1.0}}, {{0, 1, 1.0}}};
  r = plan_ordered(peaks, t, 100);
  EXPECT_EQ(r.choices, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(r.peak, 3);
  // Equal time and peak, and (0, 0) is first; but after layer 0 its state
  // (R 4, P 4, C 1) is dominated by (2, 4, 1) and dropped (Note [Ordered
  // layer peak]: the first positions among those the frontier kept).
  Segments kept{{{4, 0, 1.0}, {2, 2, 1.0}}, {{0, 0, 1.0}}};
  r = plan_ordered(kept, t, 100);
  EXPECT_EQ(r.peak, 4);
  EXPECT_EQ(r.choices, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(r.frontier_sizes, (std::vector<int64_t>{1, 1}));
}

TEST(OrderedPlanner, FrontierIsThePareto) {
  // One layer, so (R, P, C) = (r, r + t, c): (0, 9, 3) kept, (5, 5, 1) kept,
  // (5, 6, 1) and (7, 7, 2) dominated by it, (2, 7, 2) kept (less retained).
  const Segments segs{
      {{0, 9, 3.0}, {5, 0, 1.0}, {5, 1, 1.0}, {2, 5, 2.0}, {7, 0, 2.0}}};
  OrderedPeakTerms t{{0}, 0, 0, 0};
  const PlannerResult r = plan_ordered(segs, t, 100);
  EXPECT_EQ(r.frontier_sizes, (std::vector<int64_t>{3}));
  EXPECT_EQ(r.states_generated, 5);
  EXPECT_EQ(r.choices, (std::vector<int32_t>{1}));
}

TEST(OrderedPlanner, NoLayerHoldsTheFloorAndTheHead) {
  OrderedPeakTerms t{{}, 5, 3, 8};
  EXPECT_FALSE(plan_ordered({}, t, 12).feasible);
  const PlannerResult r = plan_ordered({}, t, 13);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.peak, 13);
  EXPECT_EQ(r.min_budget, 13);
}

TEST(OrderedPlanner, RejectsBadInput) {
  const Segments one{{{1, 1, 1.0}}};
  auto rejects = [](const Segments& s, const OrderedPeakTerms& t) {
    try {
      plan_ordered(s, t, 100);
    } catch (const ReplayException& e) {
      return e.kind() == ErrorKind::kInvalidArgument;
    }
    return false;
  };
  EXPECT_TRUE(rejects(one, {{}, 0, 0, 0}));           // no gradient size
  EXPECT_TRUE(rejects(one, {{-1}, 0, 0, 0}));         // negative gradients
  EXPECT_TRUE(rejects(one, {{0}, 0, -1, 0}));         // negative floor
  EXPECT_TRUE(rejects(Segments(1), {{0}, 0, 0, 0}));  // a layer without option
  EXPECT_TRUE(rejects({{{1, 1, -1.0}}}, {{0}, 0, 0, 0}));
  EXPECT_TRUE(
      rejects({{{int64_t{1} << 61, 1, 0.0}}}, {{int64_t{1} << 61}, 0, 0, 0}));
  EXPECT_FALSE(rejects(one, {{0}, 0, 0, 0}));
}

}  // namespace
}  // namespace torch_replay
