#pragma once

// Helpers shared by the scheduling GoogleTests: seeded random problems and
// brute-force references that do not use the code under test.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/schedule_problem.h"

namespace torch_replay::schedule::testing {

// A random problem with `n` units: inputs, 0-2 buffers per unit read by
// random later units, random outputs and forward extra edges; sizes in
// [0, max_size] so that ties are common.
inline ProblemSpec random_spec(uint64_t seed, int n, int64_t max_size = 20) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  ProblemSpec spec;
  spec.num_units = n;
  auto add_buffer = [&](int producer) {
    spec.sizes.push_back(uniform(0, static_cast<int>(max_size)));
    spec.producer.push_back(producer);
    std::vector<int> consumers;
    const int reads = uniform(0, 3);
    for (int r = 0; r < reads && producer + 1 < n; ++r) {
      consumers.push_back(uniform(producer + 1, n - 1));
    }
    spec.consumers.push_back(consumers);
    if (uniform(0, 5) == 0) {
      spec.outputs.push_back(static_cast<int>(spec.sizes.size()) - 1);
    }
  };
  for (int i = uniform(0, 2); i > 0; --i) {
    add_buffer(-1);
  }
  for (int u = 0; u < n; ++u) {
    for (int i = uniform(0, 2); i > 0; --i) {
      add_buffer(u);
    }
  }
  for (int i = uniform(0, 2); i > 0 && n >= 2; --i) {
    const int a = uniform(0, n - 2);
    spec.extra_edges.emplace_back(a, uniform(a + 1, n - 1));
  }
  // Relabel units so that index order is not always topological.
  std::vector<int> perm(n);
  for (int u = 0; u < n; ++u) {
    perm[u] = u;
  }
  std::shuffle(perm.begin(), perm.end(), rng);
  for (auto& p : spec.producer) {
    if (p >= 0) {
      p = perm[p];
    }
  }
  for (auto& cs : spec.consumers) {
    for (auto& c : cs) {
      c = perm[c];
    }
  }
  for (auto& [a, b] : spec.extra_edges) {
    a = perm[a];
    b = perm[b];
  }
  return spec;
}

// Peak of an order by explicit live intervals (independent of Problem).
inline int64_t interval_peak(const ProblemSpec& spec, std::vector<int> order) {
  const int n = spec.num_units;
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) {
    pos[order[i]] = i;
  }
  std::vector<int64_t> step(n, 0);
  for (size_t b = 0; b < spec.sizes.size(); ++b) {
    const bool output =
        std::find(
            spec.outputs.begin(), spec.outputs.end(), static_cast<int>(b)) !=
        spec.outputs.end();
    const int first = spec.producer[b] < 0 ? 0 : pos[spec.producer[b]];
    int last = spec.producer[b] < 0 ? -1 : first;
    for (int c : spec.consumers[b]) {
      last = std::max(last, pos[c]);
    }
    if (output) {
      last = n - 1;
    }
    for (int i = first; i <= last; ++i) {
      step[i] += spec.sizes[b];
    }
  }
  int64_t best = 0;
  for (int64_t s : step) {
    best = std::max(best, s);
  }
  return best;
}

// Optimal peak by enumerating every topological order (n <= 8 or so).
inline int64_t brute_force_optimum(const ProblemSpec& spec) {
  const Problem problem(spec);
  const int n = spec.num_units;
  std::vector<int> order;
  std::vector<char> used(n, 0);
  int64_t best = std::numeric_limits<int64_t>::max();
  std::function<void()> rec = [&]() {
    if (static_cast<int>(order.size()) == n) {
      best = std::min(best, interval_peak(spec, order));
      return;
    }
    for (int u = 0; u < n; ++u) {
      if (used[u]) {
        continue;
      }
      bool ready = true;
      for (int p : problem.preds(u)) {
        ready = ready && used[p];
      }
      if (!ready) {
        continue;
      }
      used[u] = 1;
      order.push_back(u);
      rec();
      order.pop_back();
      used[u] = 0;
    }
  };
  rec();
  return n == 0 ? 0 : best;
}

}  // namespace torch_replay::schedule::testing
