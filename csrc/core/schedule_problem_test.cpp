#include "core/schedule_problem.h"

#include <gtest/gtest.h>

#include "core/schedule_testing.h"

namespace torch_replay::schedule {
namespace {

// A diamond with a graph input and an output:
//
//   in(4) -> [0] --a(10)--> [1] --c(3)--> [3] --out(1)
//              \                          ^
//               `--b(7)--> [2] --d(5)-----'
ProblemSpec diamond() {
  ProblemSpec spec;
  spec.num_units = 4;
  spec.sizes = {4, 10, 7, 3, 5, 1};
  spec.producer = {-1, 0, 0, 1, 2, 3};
  spec.consumers = {{0}, {1}, {2}, {3}, {3}, {}};
  spec.outputs = {5};
  return spec;
}

TEST(ScheduleProblemTest, DiamondPeakByHand) {
  const Problem p(diamond());
  // Step costs of 0,1,2,3: in+a+b = 21; a+b+c = 20; b+c+d = 15; c+d+out = 9.
  EXPECT_EQ(p.step_costs({0, 1, 2, 3}), (std::vector<int64_t>{21, 20, 15, 9}));
  EXPECT_EQ(p.peak({0, 1, 2, 3}), 21);
  // 0,2,1,3: 21; b+a+d = 22; a+d+c... a freed after 1: b gone, d + a + c.
  EXPECT_EQ(p.step_costs({0, 2, 1, 3}), (std::vector<int64_t>{21, 22, 18, 9}));
  EXPECT_EQ(p.initial_resident(), 4);
  EXPECT_EQ(p.out_bytes(0), 17);
}

TEST(ScheduleProblemTest, RejectsNonTopologicalOrders) {
  const Problem p(diamond());
  std::string why;
  EXPECT_FALSE(p.is_valid_order({1, 0, 2, 3}, &why));
  EXPECT_NE(why.find("predecessor"), std::string::npos);
  EXPECT_FALSE(p.is_valid_order({0, 1, 2}, &why));
  EXPECT_FALSE(p.is_valid_order({0, 1, 1, 3}, &why));
  EXPECT_FALSE(p.is_valid_order({0, 1, 2, 7}, &why));
  EXPECT_THROW(p.peak({3, 2, 1, 0}), ReplayException);
}

TEST(ScheduleProblemTest, RejectsBadInput) {
  auto expect_invalid = [](ProblemSpec spec) {
    try {
      Problem p(std::move(spec));
      ADD_FAILURE() << "expected ReplayException";
    } catch (const ReplayException& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
  };
  ProblemSpec s = diamond();
  s.sizes[1] = -1;
  expect_invalid(s);
  s = diamond();
  s.producer[1] = 9;
  expect_invalid(s);
  s = diamond();
  s.consumers[1] = {0};  // consumer == producer
  expect_invalid(s);
  s = diamond();
  s.outputs = {6};
  expect_invalid(s);
  s = diamond();
  s.extra_edges = {{3, 0}};  // cycle
  expect_invalid(s);
  s = diamond();
  s.extra_edges = {{2, 2}};
  expect_invalid(s);
  s = diamond();
  s.consumers.pop_back();
  expect_invalid(s);
}

TEST(ScheduleProblemTest, AncestorsAndDescendants) {
  const Problem p(diamond());
  EXPECT_TRUE(p.ancestors(3).contains(0));
  EXPECT_TRUE(p.descendants(0).contains(3));
  EXPECT_FALSE(p.comparable(1, 2));
  EXPECT_TRUE(p.comparable(1, 3));
}

// Peaks agree with an explicit live-interval simulation, and resident() with
// the step costs, on seeded random problems.
TEST(ScheduleProblemTest, RandomPeaksMatchIntervalSimulation) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    const ProblemSpec spec = testing::random_spec(seed, 1 + seed % 9);
    const Problem p(spec);
    std::vector<int> order = p.topological_order();
    EXPECT_EQ(p.peak(order), testing::interval_peak(spec, order)) << seed;
    UnitSet done(p.num_units());
    const auto steps = p.step_costs(order);
    for (size_t i = 0; i < order.size(); ++i) {
      ASSERT_EQ(steps[i], p.resident(done) + p.out_bytes(order[i])) << seed;
      const int64_t before = p.resident(done);
      const int64_t delta = p.resident_delta(done, order[i]);
      done.insert(order[i]);
      ASSERT_EQ(p.resident(done), before + delta) << seed;
    }
  }
}

}  // namespace
}  // namespace torch_replay::schedule
