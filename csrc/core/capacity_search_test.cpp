#include "core/capacity_search.h"

#include <gtest/gtest.h>

#include "core/exhaustive_schedule.h"
#include "core/schedule_solver.h"
#include "core/schedule_testing.h"

namespace torch_replay::schedule {
namespace {

TEST(ExhaustiveScheduleTest, MatchesEnumerationOfAllOrders) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const ProblemSpec spec = testing::random_spec(seed + 100, seed % 8);
    const Problem p(spec);
    const ExhaustiveResult r = solve_exhaustive(p);
    ASSERT_EQ(r.peak, testing::brute_force_optimum(spec)) << seed;
    ASSERT_EQ(p.peak(r.order), r.peak) << seed;
  }
}

TEST(ExhaustiveScheduleTest, RefusesLargeProblems) {
  ProblemSpec spec;
  spec.num_units = kMaxExhaustiveUnits + 1;
  EXPECT_THROW(solve_exhaustive(Problem(spec)), ReplayException);
}

TEST(CapacitySearchTest, DecideAgreesWithOptimum) {
  const auto far = Clock::now() + std::chrono::hours(1);
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Problem p(testing::random_spec(seed + 900, 1 + seed % 12));
    const int64_t opt = solve_exhaustive(p).peak;
    CapacitySearch search(p);
    std::vector<int> order;
    int64_t next = 0;
    ASSERT_EQ(
        search.decide(opt, far, 1 << 20, &order, &next), Decision::kFeasible)
        << seed;
    ASSERT_LE(p.peak(order), opt) << seed;
    if (opt > 0) {
      ASSERT_EQ(
          search.decide(opt - 1, far, 1 << 20, &order, &next),
          Decision::kInfeasible)
          << seed;
      // The failed search proves a bound above the capacity tested.
      ASSERT_GE(next, opt - 1 + 1) << seed;
      ASSERT_LE(next, opt) << seed;
    }
  }
}

TEST(CapacitySearchTest, GreedyOrdersAreValid) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const Problem p(testing::random_spec(seed, 1 + seed % 15));
    for (int rule = 0; rule < 6; ++rule) {
      EXPECT_TRUE(p.is_valid_order(greedy_order(p, rule), nullptr));
    }
  }
}

TEST(ScheduleSolverTest, SolveFindsTheOptimum) {
  SolveOptions options;
  options.time_limit_s = 10.0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const Problem p(testing::random_spec(seed + 4242, seed % 15, 40));
    const int64_t opt = solve_exhaustive(p).peak;
    const Solution s = solve(p, options);
    ASSERT_EQ(s.peak, opt) << seed;
    ASSERT_EQ(p.peak(s.order), s.peak) << seed;
    ASSERT_TRUE(s.optimal) << seed;
    ASSERT_EQ(s.lower_bound, opt) << seed;
    ASSERT_LE(s.joint_trap, opt) << seed;
    ASSERT_LE(s.end_steps, opt) << seed;
    ASSERT_EQ(s.certified, std::max(s.joint_trap, s.end_steps) == opt) << seed;
  }
}

TEST(ScheduleSolverTest, EmptyProblem) {
  ProblemSpec spec;
  spec.sizes = {5};
  spec.producer = {-1};
  spec.consumers = {{}};
  spec.outputs = {0};
  const Solution s = solve(Problem(spec), SolveOptions{});
  EXPECT_EQ(s.peak, 0);
  EXPECT_TRUE(s.order.empty());
  EXPECT_TRUE(s.certified);
}

}  // namespace
}  // namespace torch_replay::schedule
