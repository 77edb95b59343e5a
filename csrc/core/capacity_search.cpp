#include "core/capacity_search.h"

#include <algorithm>
#include <limits>
#include <random>
#include <tuple>

namespace torch_replay::schedule {

namespace {

// How the resident bytes change when u runs: its resident outputs appear, and
// the inputs of which it is the last consumer still to run (`remaining`) are
// freed.
int64_t resident_change(
    const Problem& problem, const std::vector<int>& remaining, int u) {
  int64_t d = 0;
  for (int b : problem.produced(u)) {
    if (problem.is_resident_kind(b)) {
      d += problem.size(b);
    }
  }
  for (int b : problem.consumed(u)) {
    if (remaining[b] == 1 && !problem.is_output(b)) {
      d -= problem.size(b);
    }
  }
  return d;
}

}  // namespace

CapacitySearch::CapacitySearch(const Problem& problem)
    : problem_(problem), oracle_(problem), n_(problem.num_units()) {
  // See Note [Capacity search dominance]: buffer b is forced live at w's step
  // when it is produced before w and (b is an output or a consumer of b is w
  // or a descendant of w).
  const int m = problem.num_buffers();
  std::vector<UnitSet> keeps_alive(m, UnitSet(n_));  // units w as above
  for (int b = 0; b < m; ++b) {
    if (problem.is_output(b)) {
      for (int w = 0; w < n_; ++w) {
        keeps_alive[b].insert(w);
      }
      continue;
    }
    for (int c : problem.consumers(b)) {
      keeps_alive[b] |= problem.ancestors(c);
      keeps_alive[b].insert(c);
    }
  }
  static_forced_.assign(n_, 0);
  dynamic_mask_.assign(m, UnitSet(n_));
  for (int w = 0; w < n_; ++w) {
    static_forced_[w] = problem.out_bytes(w);
  }
  for (int b = 0; b < m; ++b) {
    const int p = problem.producer(b);
    UnitSet statically = keeps_alive[b];
    if (p >= 0) {
      statically &= problem.descendants(p);
      dynamic_mask_[b] = keeps_alive[b];
      dynamic_mask_[b].subtract(problem.descendants(p));
      dynamic_mask_[b].erase(p);
    }
    statically.for_each([&](int w) { static_forced_[w] += problem.size(b); });
  }
}

int64_t CapacitySearch::delta(int u) const {
  return resident_change(problem_, remaining_consumers_, u);
}

void CapacitySearch::apply(int u) {
  res_ += delta(u);
  done_.insert(u);
  path_.push_back(u);
  for (int s : problem_.succs(u)) {
    --missing_preds_[s];
  }
  for (int b : problem_.consumed(u)) {
    --remaining_consumers_[b];
  }
}

void CapacitySearch::undo(int u) {
  for (int b : problem_.consumed(u)) {
    ++remaining_consumers_[b];
  }
  for (int s : problem_.succs(u)) {
    ++missing_preds_[s];
  }
  path_.pop_back();
  done_.erase(u);
  res_ -= delta(u);
}

int64_t CapacitySearch::forced_bound() const {
  std::vector<int64_t> acc(static_forced_);
  for (int b = 0; b < problem_.num_buffers(); ++b) {
    const int p = problem_.producer(b);
    const bool resident =
        p >= 0 && done_.contains(p) &&
        (problem_.is_output(b) || remaining_consumers_[b] > 0);
    if (!resident) {
      continue;
    }
    const int64_t size = problem_.size(b);
    dynamic_mask_[b].for_each([&](int w) { acc[w] += size; });
  }
  int64_t best = 0;
  for (int w = 0; w < n_; ++w) {
    if (!done_.contains(w)) {
      best = std::max(best, acc[w]);
    }
  }
  return best;
}

bool CapacitySearch::dfs() {
  if ((++states_expanded_ & 255) == 0 && Clock::now() > deadline_) {
    throw GiveUp{};
  }
  // 1. Free steps (Note [Capacity search dominance]).
  std::vector<int> closed;
  auto undo_closed = [&]() {
    for (auto it = closed.rbegin(); it != closed.rend(); ++it) {
      undo(*it);
    }
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int u = 0; u < n_; ++u) {
      if (done_.contains(u) || missing_preds_[u] != 0) {
        continue;
      }
      const int64_t cost = res_ + problem_.out_bytes(u);
      if (delta(u) > 0) {
        continue;
      }
      if (cost > capacity_) {
        reject(cost);
        continue;
      }
      apply(u);
      closed.push_back(u);
      progress = true;
    }
  }
  if (static_cast<int>(path_.size()) == n_) {
    return true;  // keeps the path; the caller reads it
  }
  if (failed_.count(done_) != 0) {
    undo_closed();
    return false;
  }
  auto fail = [&]() {
    failed_.insert(done_);
    if (static_cast<int64_t>(failed_.size()) > max_states_) {
      throw GiveUp{};
    }
    undo_closed();
    return false;
  };
  // 2. Liveness bound.
  const int64_t forced = forced_bound();
  if (forced > capacity_) {
    reject(forced);
    return fail();
  }
  // 3. Min-cut packet: greedy walk to the smallest res-minimising superset.
  UnitSet target;
  const int64_t target_res = oracle_.min_resident_superset(done_, &target);
  if (target != done_ && target_res <= res_) {
    std::vector<int> packet;
    bool reached = true;
    while (done_ != target) {
      int pick = -1;
      int64_t pick_cost = 0;
      int64_t pick_delta = 0;
      target.for_each([&](int u) {
        if (done_.contains(u) || missing_preds_[u] != 0) {
          return;
        }
        const int64_t cost = res_ + problem_.out_bytes(u);
        const int64_t d = delta(u);
        if (pick < 0 || std::tie(cost, d) < std::tie(pick_cost, pick_delta)) {
          pick = u;
          pick_cost = cost;
          pick_delta = d;
        }
      });
      if (pick < 0 || pick_cost > capacity_) {
        if (pick >= 0) {
          reject(pick_cost);
        }
        reached = false;
        break;
      }
      apply(pick);
      packet.push_back(pick);
    }
    if (reached) {
      if (dfs()) {
        return true;
      }
    }
    for (auto it = packet.rbegin(); it != packet.rend(); ++it) {
      undo(*it);
    }
    if (reached) {
      return fail();  // the jump was dominant, so S fails as well
    }
  }
  // 4. Branch on every ready unit, most freeing first.
  std::vector<std::tuple<int64_t, int64_t, int>> ready;
  for (int u = 0; u < n_; ++u) {
    if (done_.contains(u) || missing_preds_[u] != 0) {
      continue;
    }
    const int64_t cost = res_ + problem_.out_bytes(u);
    if (cost > capacity_) {
      reject(cost);
      continue;
    }
    ready.emplace_back(delta(u), cost, u);
  }
  std::sort(ready.begin(), ready.end());
  for (auto [d, cost, u] : ready) {
    (void)d;
    (void)cost;
    apply(u);
    if (dfs()) {
      return true;
    }
    undo(u);
  }
  return fail();
}

Decision CapacitySearch::decide(
    int64_t capacity,
    Clock::time_point deadline,
    int64_t max_states,
    std::vector<int>* order,
    int64_t* next_capacity) {
  capacity_ = capacity;
  next_ = std::numeric_limits<int64_t>::max();
  res_ = problem_.initial_resident();
  done_ = UnitSet(n_);
  path_.clear();
  missing_preds_.assign(n_, 0);
  for (int u = 0; u < n_; ++u) {
    missing_preds_[u] = static_cast<int>(problem_.preds(u).size());
  }
  remaining_consumers_.assign(problem_.num_buffers(), 0);
  for (int b = 0; b < problem_.num_buffers(); ++b) {
    remaining_consumers_[b] = static_cast<int>(problem_.consumers(b).size());
  }
  failed_.clear();
  deadline_ = deadline;
  max_states_ = max_states;
  bool found = false;
  try {
    found = dfs();
  } catch (const GiveUp&) {
    failed_.clear();
    return Decision::kUnknown;
  }
  failed_.clear();
  if (found) {
    *order = path_;
    return Decision::kFeasible;
  }
  *next_capacity = next_;
  return Decision::kInfeasible;
}

std::vector<int> greedy_order(const Problem& problem, int rule) {
  const int n = problem.num_units();
  std::mt19937_64 rng(static_cast<uint64_t>(rule) * 0x9e3779b97f4a7c15ull);
  std::vector<int> missing(n);
  for (int u = 0; u < n; ++u) {
    missing[u] = static_cast<int>(problem.preds(u).size());
  }
  std::vector<int> remaining(problem.num_buffers());
  for (int b = 0; b < problem.num_buffers(); ++b) {
    remaining[b] = static_cast<int>(problem.consumers(b).size());
  }
  std::vector<char> done(n, 0);
  std::vector<int> order;
  int64_t res = problem.initial_resident();
  int last = -1;
  while (static_cast<int>(order.size()) < n) {
    int pick = -1;
    std::tuple<int64_t, int64_t, int64_t, int> best;
    for (int u = 0; u < n; ++u) {
      if (done[u] || missing[u] != 0) {
        continue;
      }
      const int64_t d = resident_change(problem, remaining, u);
      const int64_t cost = res + problem.out_bytes(u);
      std::tuple<int64_t, int64_t, int64_t, int> key;
      if (rule == 0) {
        key = {cost, d, 0, u};
      } else if (rule == 1) {
        key = {d, cost, 0, u};
      } else if (rule == 2) {
        const auto& s = last >= 0 ? problem.succs(last) : problem.succs(u);
        const bool follows =
            last >= 0 && std::binary_search(s.begin(), s.end(), u);
        key = {follows ? 0 : 1, d, cost, u};
      } else {
        // Noise of up to ~1/8 of the step cost makes near-ties random.
        const int64_t noise =
            static_cast<int64_t>(rng() % static_cast<uint64_t>(cost / 8 + 1));
        key = {cost + noise, d, static_cast<int64_t>(rng() % 1024), u};
      }
      if (pick < 0 || key < best) {
        pick = u;
        best = key;
      }
    }
    res += resident_change(problem, remaining, pick);
    for (int b : problem.consumed(pick)) {
      --remaining[b];
    }
    for (int s : problem.succs(pick)) {
      --missing[s];
    }
    done[pick] = 1;
    order.push_back(pick);
    last = pick;
  }
  return order;
}

}  // namespace torch_replay::schedule
