#include "core/planner_time_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/pareto_planner.h"

namespace torch_replay::planner_detail {
namespace {

using Segments = std::vector<std::vector<PlannerOption>>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Options from small ranges (frequent ties and collinear points); integer or
// dyadic times, so that every sum and cross product below is exact.
std::vector<PlannerOption> random_options(std::mt19937_64& rng, int max_k) {
  const int k = std::uniform_int_distribution<int>(1, max_k)(rng);
  const int64_t range = std::uniform_int_distribution<int>(0, 1)(rng) ? 4 : 16;
  std::uniform_int_distribution<int64_t> bytes(0, range);
  std::uniform_int_distribution<int> ticks(0, 32);
  const bool dyadic = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
  std::vector<PlannerOption> opts;
  for (int o = 0; o < k; ++o) {
    PlannerOption opt;
    opt.retained = bytes(rng);
    opt.transient = bytes(rng);
    opt.time = dyadic ? ticks(rng) / 8.0 : ticks(rng) % 9;
    opts.push_back(opt);
  }
  return opts;
}

Segments random_segments(std::mt19937_64& rng, int max_n, int max_k) {
  Segments segs(std::uniform_int_distribution<int>(1, max_n)(rng));
  for (auto& seg : segs) {
    seg = random_options(rng, max_k);
  }
  return segs;
}

// ---------------------------------------------------------------- lower_hull

// The hull by its definition: an allowed option is a vertex when no other
// allowed option is at least as lean and as fast (the earlier index wins a
// tie of both), and it lies strictly below every chord between two allowed
// options on either side of it in retained. Vertices by increasing retained.
std::vector<int32_t> brute_force_hull(
    const std::vector<PlannerOption>& opts, const std::vector<char>& allowed) {
  std::vector<int32_t> hull;
  const int n = static_cast<int>(opts.size());
  for (int o = 0; o < n; ++o) {
    if (!allowed[o]) {
      continue;
    }
    const PlannerOption& p = opts[o];
    bool vertex = true;
    for (int j = 0; j < n && vertex; ++j) {
      const PlannerOption& q = opts[j];
      if (j != o && allowed[j] && q.retained <= p.retained &&
          q.time <= p.time &&
          (q.retained < p.retained || q.time < p.time || j < o)) {
        vertex = false;
      }
    }
    for (int a = 0; a < n && vertex; ++a) {
      for (int b = 0; b < n && vertex; ++b) {
        const PlannerOption& pa = opts[a];
        const PlannerOption& pb = opts[b];
        if (!allowed[a] || !allowed[b] || pa.retained >= p.retained ||
            pb.retained <= p.retained) {
          continue;
        }
        // p on or above the chord a-b (exact: small integers, dyadic times).
        const double lhs =
            (p.time - pa.time) * double(pb.retained - pa.retained);
        const double rhs =
            (pb.time - pa.time) * double(p.retained - pa.retained);
        if (lhs >= rhs) {
          vertex = false;
        }
      }
    }
    if (vertex) {
      hull.push_back(o);
    }
  }
  std::sort(hull.begin(), hull.end(), [&](int32_t a, int32_t b) {
    return opts[a].retained < opts[b].retained;
  });
  return hull;
}

TEST(PlannerTimeBoundTest, LowerHullMatchesBruteForce) {
  std::mt19937_64 rng(6100);
  for (int instance = 0; instance < 600; ++instance) {
    const std::vector<PlannerOption> opts = random_options(rng, 8);
    // Allowed: transient <= cap, as the planner asks (a cap below every
    // transient allows none).
    const int64_t cap = std::uniform_int_distribution<int64_t>(-1, 16)(rng);
    std::vector<char> allowed(opts.size());
    for (size_t o = 0; o < opts.size(); ++o) {
      allowed[o] = opts[o].transient <= cap;
    }
    const std::vector<int32_t> got = lower_hull(
        opts, [cap](const PlannerOption& o) { return o.transient <= cap; });
    ASSERT_EQ(got, brute_force_hull(opts, allowed)) << "instance " << instance;
    for (size_t k = 1; k < got.size(); ++k) {
      ASSERT_LT(opts[got[k - 1]].retained, opts[got[k]].retained);
      ASSERT_GT(opts[got[k - 1]].time, opts[got[k]].time);
    }
  }
}

// ----------------------------------------------------- edges and the Fenwick

// Least time to save `need` bytes with fractional edges (the LP relaxation
// of choosing edges), by its definition: take edges cheapest per byte first,
// the last one in part. Infinity when all of them save less than `need`.
double brute_force_cost(
    const std::vector<HullEdge>& edges,
    const std::vector<char>& active,
    int64_t need) {
  std::vector<size_t> order;
  for (size_t e = 0; e < edges.size(); ++e) {
    if (active[e]) {
      order.push_back(e);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return edges[a].time * double(edges[b].bytes) <
           edges[b].time * double(edges[a].bytes);
  });
  double time = 0.0;
  for (size_t e : order) {
    if (need <= edges[e].bytes) {
      return time + double(need) * edges[e].time / double(edges[e].bytes);
    }
    need -= edges[e].bytes;
    time += edges[e].time;
  }
  return kInf;
}

bool near(double got, double want) {
  if (std::isinf(want) || std::isinf(got)) {
    return got == want;
  }
  return std::abs(got - want) <= 1e-9 * (1.0 + std::abs(want));
}

TEST(PlannerTimeBoundTest, EdgesAndFenwickCostMatchBruteForce) {
  std::mt19937_64 rng(6200);
  for (int instance = 0; instance < 300; ++instance) {
    const Segments segs = random_segments(rng, 5, 6);
    std::vector<HullEdge> edges;
    for (size_t s = 0; s < segs.size(); ++s) {
      const auto hull =
          lower_hull(segs[s], [](const PlannerOption&) { return true; });
      append_edges(segs[s], hull, s, edges);
      // Each edge joins consecutive hull vertices, fastest first.
      const size_t first = edges.size() - (hull.size() - 1);
      for (size_t k = 0; k + 1 < hull.size(); ++k) {
        const HullEdge& e = edges[first + k];
        const PlannerOption& fast = segs[s][hull[hull.size() - 1 - k]];
        const PlannerOption& lean = segs[s][hull[hull.size() - 2 - k]];
        ASSERT_EQ(e.bytes, fast.retained - lean.retained);
        ASSERT_EQ(e.time, lean.time - fast.time);
        ASSERT_EQ(e.segment, s);
        ASSERT_EQ(e.rank, k);
      }
    }
    sort_edges(edges);
    for (size_t e = 1; e < edges.size(); ++e) {
      ASSERT_LE(edges[e - 1].per_byte, edges[e].per_byte);
    }
    EdgeFenwick fenwick(edges);
    std::vector<char> active(edges.size(), 1);
    int64_t total = 0;
    for (const HullEdge& e : edges) {
      total += e.bytes;
    }
    // All active, then after dropping edges one by one in random order (as
    // leaving segments does).
    std::vector<size_t> drop(edges.size());
    for (size_t e = 0; e < drop.size(); ++e) {
      drop[e] = e;
    }
    std::shuffle(drop.begin(), drop.end(), rng);
    for (size_t round = 0; round <= drop.size(); ++round) {
      for (int64_t need = 1; need <= total + 1; ++need) {
        ASSERT_TRUE(
            near(fenwick.cost(need), brute_force_cost(edges, active, need)))
            << "instance " << instance << " round " << round << " need " << need
            << ": " << fenwick.cost(need) << " vs "
            << brute_force_cost(edges, active, need);
      }
      if (round < drop.size()) {
        const size_t e = drop[round];
        fenwick.add(e, -edges[e].bytes, -edges[e].time);
        active[e] = 0;
      }
    }
  }
}

// Calls visit(retained, transient, time) for every choice of one option per
// segment >= s: their summed retained, largest transient and time (summed in
// segment order, as the planner sums).
template <typename Visit>
void for_each_plan(const Segments& segs, size_t s, Visit visit) {
  std::vector<size_t> idx(segs.size(), 0);
  while (true) {
    int64_t r = 0;
    int64_t t = 0;
    double c = 0.0;
    for (size_t i = s; i < segs.size(); ++i) {
      const PlannerOption& o = segs[i][idx[i]];
      r += o.retained;
      t = std::max(t, o.transient);
      c += o.time;
    }
    visit(r, t, c);
    size_t i = s;
    while (i < segs.size() && ++idx[i] == segs[i].size()) {
      idx[i++] = 0;
    }
    if (i == segs.size()) {
      return;
    }
  }
}

// ---------------------------------------------------------- SuffixTimeBound

// The least time segments >= s add to a state with transient q and
// room_left bytes for their retained plus the final transient: every
// completion enumerated. Infinity when none fits.
double brute_force_completion(
    const Segments& segs, size_t s, int64_t room_left, int64_t q) {
  double best = kInf;
  for_each_plan(segs, s, [&](int64_t r, int64_t t, double c) {
    if (r + std::max(t, q) <= room_left) {
      best = std::min(best, c);
    }
  });
  return best;
}

TEST(PlannerTimeBoundTest, SuffixBoundNeverExceedsBruteForce) {
  std::mt19937_64 rng(6300);
  int64_t exact = 0;
  for (int instance = 0; instance < 300; ++instance) {
    const Segments segs = random_segments(rng, 4, 4);
    // The planner's floor: the largest of the segments' least transients.
    int64_t floor = 0;
    int64_t fast_retained = 0;
    double fastest = 0.0;
    int64_t max_transient = 0;
    for (const auto& seg : segs) {
      int64_t least = std::numeric_limits<int64_t>::max();
      for (const PlannerOption& o : seg) {
        least = std::min(least, o.transient);
        max_transient = std::max(max_transient, o.transient);
      }
      floor = std::max(floor, least);
    }
    const int64_t room =
        std::uniform_int_distribution<int64_t>(floor, floor + 40)(rng);
    SuffixTimeBound bound(segs, floor, room);
    // A state's transient, as the planner makes them: an option's transient
    // within the room, raised to the floor.
    std::set<int64_t> transients;
    for (const auto& seg : segs) {
      for (const PlannerOption& o : seg) {
        if (o.transient <= room) {
          transients.insert(std::max(floor, o.transient));
        }
      }
    }
    for (size_t s = 0; s <= segs.size(); ++s) {
      for (int64_t q : transients) {
        for (int64_t left = 0; left <= room; left += 1 + left / 8) {
          const double want = brute_force_completion(segs, s, left, q);
          const double got =
              bound.bound(s, left, q, std::numeric_limits<double>::quiet_NaN());
          ASSERT_LE(got, want + 1e-9 * (1.0 + want))
              << "instance " << instance << " s " << s << " left " << left
              << " q " << q;
          exact += got == want;
          // With a stop, the answer is <= stop exactly when the tightest
          // bound is.
          const double stop = std::isinf(want) ? 5.0 : want - 0.5;
          ASSERT_EQ(bound.bound(s, left, q, stop) <= stop, got <= stop)
              << "instance " << instance;
        }
      }
      // With room for every segment's fastest option, the bound is the
      // optimum: the sum of the suffix's least times.
      fastest = 0.0;
      fast_retained = 0;
      for (size_t i = s; i < segs.size(); ++i) {
        double t = kInf;
        int64_t r = 0;
        for (const PlannerOption& o : segs[i]) {
          t = std::min(t, o.time);
          r = std::max(r, o.retained);
        }
        fastest += t;
        fast_retained += r;
      }
      if (fast_retained + max_transient <= room) {
        const double got = bound.bound(
            s, room, floor, std::numeric_limits<double>::quiet_NaN());
        ASSERT_EQ(got, brute_force_completion(segs, s, room, floor));
        ASSERT_EQ(got, fastest) << "instance " << instance << " s " << s;
      }
      if (s < segs.size()) {
        bound.leave(s);
      }
    }
  }
  EXPECT_GT(exact, 0);
}

// --------------------------------------- the planner's greedy and root bounds

// Every plan's time that fits the budget, and the least of them.
std::set<double> feasible_times(
    const Segments& segs, int64_t persistent, int64_t budget) {
  std::set<double> times;
  for_each_plan(segs, 0, [&](int64_t r, int64_t t, double c) {
    if (persistent + r + t <= budget) {
      times.insert(c);
    }
  });
  return times;
}

TEST(PlannerTimeBoundTest, GreedyAndRootBoundsBracketTheBruteForceOptimum) {
  std::mt19937_64 rng(6400);
  int greedy_optimal = 0;
  for (int instance = 0; instance < 400; ++instance) {
    const Segments segs = random_segments(rng, 5, 4);
    const int64_t persistent =
        std::uniform_int_distribution<int64_t>(0, 3)(rng);
    const ParetoPlanner planner(segs, persistent);
    const int64_t budget = std::uniform_int_distribution<int64_t>(
        planner.min_budget() - 2, planner.min_budget() + 40)(rng);
    const std::set<double> times = feasible_times(segs, persistent, budget);
    const double upper = planner.greedy_upper_bound(budget);
    if (times.empty()) {
      ASSERT_EQ(upper, kInf) << "instance " << instance;
      continue;
    }
    const double optimum = *times.begin();
    // The greedy's time is that of a plan that fits (or none was found).
    if (upper != kInf) {
      ASSERT_EQ(times.count(upper), 1u) << "instance " << instance;
      greedy_optimal += upper == optimum;
    }
    const double lower = planner.root_lower_bound(budget);
    ASSERT_LE(lower, optimum + 1e-9 * (1.0 + optimum))
        << "instance " << instance;
  }
  EXPECT_GT(greedy_optimal, 0);
}

}  // namespace
}  // namespace torch_replay::planner_detail
