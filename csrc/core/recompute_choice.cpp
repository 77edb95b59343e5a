#include "core/recompute_choice.h"

#include <algorithm>
#include <string>

#include "core/status.h"

namespace torch_replay::schedule {
namespace {

void check(const RecomputeChoiceInput& in) {
  const size_t n = in.deltas.size();
  const size_t t = in.base.size();
  auto bad = [](const std::string& what) {
    throw ReplayException(
        ErrorKind::kInvalidArgument, "choose_recomputation: " + what);
  };
  if (n > static_cast<size_t>(kMaxRecomputeCandidates)) {
    bad("at most " + std::to_string(kMaxRecomputeCandidates) +
        " candidates, got " + std::to_string(n));
  }
  if (in.event_pos.size() != n || in.event_level.size() != n ||
      in.costs.size() != n || in.groups.size() != n) {
    bad("event_pos, event_level, costs and groups need one entry per "
        "candidate");
  }
  for (size_t i = 0; i < n; ++i) {
    if (in.deltas[i].size() != t) {
      bad("deltas[" + std::to_string(i) + "] has " +
          std::to_string(in.deltas[i].size()) + " positions, base has " +
          std::to_string(t));
    }
    if (in.event_pos[i] < 0 || in.event_pos[i] >= static_cast<int64_t>(t)) {
      bad("event_pos[" + std::to_string(i) + "] out of range");
    }
    if (in.costs[i] < 0) {
      bad("costs[" + std::to_string(i) + "] is negative");
    }
  }
}

struct Search {
  const RecomputeChoiceInput& in;
  std::vector<int> order;  // candidates, most saving first
  std::vector<std::vector<int64_t>>
      neg;                   // neg[m][t]: sum of negatives of order[m..]
  std::vector<int64_t> sum;  // sum of chosen deltas
  std::vector<int> chosen;
  RecomputeChoice best;

  int64_t level(const std::vector<int64_t>* extra) const {
    const size_t t = in.base.size();
    int64_t pk = 0;
    for (size_t k = 0; k < t; ++k) {
      pk = std::max(pk, in.base[k] + sum[k] + (extra ? (*extra)[k] : 0));
    }
    for (int i : chosen) {
      const int64_t q = in.event_pos[i];
      pk = std::max(
          pk,
          in.event_level[i] + sum[q] - in.deltas[i][q] +
              (extra ? (*extra)[q] : 0));
    }
    return pk;
  }

  void dfs(size_t m, int64_t cost) {
    ++best.nodes;
    if (m == order.size()) {
      const int64_t pk = level(nullptr);
      if (pk < best.peak || (pk == best.peak && cost < best.cost)) {
        best.peak = pk;
        best.cost = cost;
        best.chosen = chosen;
      }
      return;
    }
    if (level(&neg[m]) > best.peak) {
      return;  // even every remaining saving is not enough
    }
    const int i = order[m];
    bool taken = false;
    for (int j : chosen) {
      taken = taken || in.groups[j] == in.groups[i];
    }
    if (!taken && cost + in.costs[i] <= in.budget) {
      chosen.push_back(i);
      for (size_t k = 0; k < sum.size(); ++k) {
        sum[k] += in.deltas[i][k];
      }
      dfs(m + 1, cost + in.costs[i]);
      for (size_t k = 0; k < sum.size(); ++k) {
        sum[k] -= in.deltas[i][k];
      }
      chosen.pop_back();
    }
    dfs(m + 1, cost);
  }
};

}  // namespace

int64_t recompute_set_peak(
    const RecomputeChoiceInput& input, const std::vector<int>& chosen) {
  check(input);
  Search s{
      input, {}, {}, std::vector<int64_t>(input.base.size(), 0), chosen, {}};
  for (int i : chosen) {
    if (i < 0 || i >= static_cast<int>(input.deltas.size())) {
      throw ReplayException(
          ErrorKind::kInvalidArgument,
          "recompute_set_peak: candidate " + std::to_string(i) +
              " out of range");
    }
    for (size_t k = 0; k < s.sum.size(); ++k) {
      s.sum[k] += input.deltas[i][k];
    }
  }
  return s.level(nullptr);
}

RecomputeChoice choose_recomputation(const RecomputeChoiceInput& input) {
  check(input);
  const size_t n = input.deltas.size();
  const size_t t = input.base.size();
  Search s{input, {}, {}, std::vector<int64_t>(t, 0), {}, {}};
  s.order.resize(n);
  std::vector<int64_t> most(n, 0);
  for (size_t i = 0; i < n; ++i) {
    s.order[i] = static_cast<int>(i);
    for (int64_t d : input.deltas[i]) {
      most[i] = std::min(most[i], d);
    }
  }
  std::stable_sort(s.order.begin(), s.order.end(), [&](int a, int b) {
    return most[a] < most[b];
  });
  s.neg.assign(n + 1, std::vector<int64_t>(t, 0));
  for (size_t m = n; m-- > 0;) {
    const int i = s.order[m];
    for (size_t k = 0; k < t; ++k) {
      s.neg[m][k] = s.neg[m + 1][k] + std::min<int64_t>(0, input.deltas[i][k]);
    }
  }
  s.best.peak = s.level(nullptr);
  s.best.cost = 0;
  s.dfs(0, 0);
  std::sort(s.best.chosen.begin(), s.best.chosen.end());
  return s.best;
}

}  // namespace torch_replay::schedule
