#include "core/schedule_problem.h"

#include <algorithm>
#include <queue>

namespace torch_replay::schedule {

namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw ReplayException(ErrorKind::kInvalidArgument, message);
}

void sort_unique(std::vector<int>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

int UnitSet::count() const {
  int c = 0;
  for (uint64_t w : words_) {
    c += __builtin_popcountll(w);
  }
  return c;
}

bool UnitSet::empty() const {
  for (uint64_t w : words_) {
    if (w != 0) {
      return false;
    }
  }
  return true;
}

bool UnitSet::intersects(const UnitSet& other) const {
  for (size_t i = 0; i < words_.size(); ++i) {
    if (words_[i] & other.words_[i]) {
      return true;
    }
  }
  return false;
}

bool UnitSet::is_subset_of(const UnitSet& other) const {
  for (size_t i = 0; i < words_.size(); ++i) {
    if (words_[i] & ~other.words_[i]) {
      return false;
    }
  }
  return true;
}

UnitSet& UnitSet::operator|=(const UnitSet& other) {
  for (size_t i = 0; i < words_.size(); ++i) {
    words_[i] |= other.words_[i];
  }
  return *this;
}

UnitSet& UnitSet::operator&=(const UnitSet& other) {
  for (size_t i = 0; i < words_.size(); ++i) {
    words_[i] &= other.words_[i];
  }
  return *this;
}

UnitSet& UnitSet::subtract(const UnitSet& other) {
  for (size_t i = 0; i < words_.size(); ++i) {
    words_[i] &= ~other.words_[i];
  }
  return *this;
}

std::vector<int> UnitSet::elements() const {
  std::vector<int> out;
  for_each([&](int u) { out.push_back(u); });
  return out;
}

size_t UnitSetHash::operator()(const UnitSet& s) const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t w : s.words()) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return static_cast<size_t>(h ^ (h >> 33));
}

Problem::Problem(ProblemSpec spec) : num_units_(spec.num_units) {
  const int n = num_units_;
  if (n < 0) {
    invalid("num_units must be >= 0, got " + std::to_string(n));
  }
  const size_t m = spec.sizes.size();
  if (spec.producer.size() != m || spec.consumers.size() != m) {
    invalid(
        "sizes, producer and consumers must have one entry per buffer (got " +
        std::to_string(m) + ", " + std::to_string(spec.producer.size()) + ", " +
        std::to_string(spec.consumers.size()) + ")");
  }
  sizes_ = std::move(spec.sizes);
  producer_ = std::move(spec.producer);
  consumers_ = std::move(spec.consumers);
  is_output_.assign(m, 0);
  produced_.assign(n, {});
  consumed_.assign(n, {});
  preds_.assign(n, {});
  succs_.assign(n, {});
  out_bytes_.assign(n, 0);

  constexpr int64_t kMaxTotal = int64_t{1} << 60;
  for (size_t b = 0; b < m; ++b) {
    const std::string name = "buffer " + std::to_string(b);
    if (sizes_[b] < 0) {
      invalid(name + " has negative size " + std::to_string(sizes_[b]));
    }
    if (sizes_[b] > kMaxTotal - total_bytes_) {
      invalid("buffer sizes sum to more than 2^60 bytes");
    }
    total_bytes_ += sizes_[b];
    const int p = producer_[b];
    if (p < -1 || p >= n) {
      invalid(
          name + " has producer " + std::to_string(p) +
          "; use -1 for a graph input or a unit index in [0, " +
          std::to_string(n) + ")");
    }
    sort_unique(consumers_[b]);
    for (int c : consumers_[b]) {
      if (c < 0 || c >= n) {
        invalid(
            name + " has consumer " + std::to_string(c) + " outside [0, " +
            std::to_string(n) + ")");
      }
      if (c == p) {
        invalid(
            name + " lists its producer (unit " + std::to_string(p) +
            ") as a consumer; a unit's own outputs are live during its step "
            "anyway, remove it from consumers");
      }
      consumed_[c].push_back(static_cast<int>(b));
      if (p >= 0) {
        succs_[p].push_back(c);
        preds_[c].push_back(p);
      }
    }
    if (p >= 0) {
      produced_[p].push_back(static_cast<int>(b));
      out_bytes_[p] += sizes_[b];
    }
  }
  for (int b : spec.outputs) {
    if (b < 0 || static_cast<size_t>(b) >= m) {
      invalid(
          "output " + std::to_string(b) + " is not a buffer index in [0, " +
          std::to_string(m) + ")");
    }
    is_output_[b] = 1;
  }
  for (auto [u, v] : spec.extra_edges) {
    if (u < 0 || u >= n || v < 0 || v >= n) {
      invalid(
          "extra edge (" + std::to_string(u) + ", " + std::to_string(v) +
          ") has a unit outside [0, " + std::to_string(n) + ")");
    }
    if (u == v) {
      invalid(
          "extra edge (" + std::to_string(u) + ", " + std::to_string(v) +
          ") is a self-loop");
    }
    succs_[u].push_back(v);
    preds_[v].push_back(u);
  }
  for (int u = 0; u < n; ++u) {
    sort_unique(preds_[u]);
    sort_unique(succs_[u]);
  }
  for (size_t b = 0; b < m; ++b) {
    if (producer_[b] < 0 && is_resident_kind(static_cast<int>(b))) {
      initial_resident_ += sizes_[b];
    }
  }

  // Kahn's algorithm, smallest ready index first.
  std::vector<int> indeg(n);
  for (int u = 0; u < n; ++u) {
    indeg[u] = static_cast<int>(preds_[u].size());
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int u = 0; u < n; ++u) {
    if (indeg[u] == 0) {
      ready.push(u);
    }
  }
  while (!ready.empty()) {
    int u = ready.top();
    ready.pop();
    topo_.push_back(u);
    for (int v : succs_[u]) {
      if (--indeg[v] == 0) {
        ready.push(v);
      }
    }
  }
  if (static_cast<int>(topo_.size()) != n) {
    std::string cyc;
    for (int u = 0; u < n && cyc.size() < 60; ++u) {
      if (indeg[u] > 0) {
        cyc += (cyc.empty() ? "" : ", ") + std::to_string(u);
      }
    }
    invalid(
        "the precedences (producer -> consumer and extra_edges) have a cycle "
        "through units {" +
        cyc + ", ...}");
  }
  ancestors_.assign(n, UnitSet(n));
  descendants_.assign(n, UnitSet(n));
  for (int u : topo_) {
    for (int p : preds_[u]) {
      ancestors_[u] |= ancestors_[p];
      ancestors_[u].insert(p);
    }
  }
  for (auto it = topo_.rbegin(); it != topo_.rend(); ++it) {
    int u = *it;
    for (int s : succs_[u]) {
      descendants_[u] |= descendants_[s];
      descendants_[u].insert(s);
    }
  }
}

int64_t Problem::resident(const UnitSet& executed) const {
  int64_t total = 0;
  for (int b = 0; b < num_buffers(); ++b) {
    const int p = producer_[b];
    if (p >= 0 && !executed.contains(p)) {
      continue;
    }
    if (is_output_[b]) {
      total += sizes_[b];
      continue;
    }
    for (int c : consumers_[b]) {
      if (!executed.contains(c)) {
        total += sizes_[b];
        break;
      }
    }
  }
  return total;
}

int64_t Problem::resident_delta(const UnitSet& executed, int u) const {
  int64_t delta = 0;
  for (int b : produced_[u]) {
    if (is_resident_kind(b)) {
      delta += sizes_[b];
    }
  }
  for (int b : consumed_[u]) {
    if (is_output_[b]) {
      continue;
    }
    bool last = true;
    for (int c : consumers_[b]) {
      if (c != u && !executed.contains(c)) {
        last = false;
        break;
      }
    }
    if (last) {
      delta -= sizes_[b];
    }
  }
  return delta;
}

bool Problem::is_valid_order(
    const std::vector<int>& order, std::string* why) const {
  auto fail = [&](const std::string& message) {
    if (why != nullptr) {
      *why = message;
    }
    return false;
  };
  if (static_cast<int>(order.size()) != num_units_) {
    return fail(
        "order has " + std::to_string(order.size()) + " units, expected " +
        std::to_string(num_units_) + " (each unit exactly once)");
  }
  std::vector<int> position(num_units_, -1);
  for (int i = 0; i < num_units_; ++i) {
    const int u = order[i];
    if (u < 0 || u >= num_units_) {
      return fail("order contains " + std::to_string(u) + ", not a unit");
    }
    if (position[u] >= 0) {
      return fail("order contains unit " + std::to_string(u) + " twice");
    }
    position[u] = i;
  }
  for (int u = 0; u < num_units_; ++u) {
    for (int p : preds_[u]) {
      if (position[p] > position[u]) {
        return fail(
            "order is not topological: unit " + std::to_string(u) +
            " runs before its predecessor " + std::to_string(p));
      }
    }
  }
  return true;
}

std::vector<int64_t> Problem::step_costs(const std::vector<int>& order) const {
  std::string why;
  if (!is_valid_order(order, &why)) {
    invalid(why);
  }
  std::vector<int> remaining(num_buffers());
  for (int b = 0; b < num_buffers(); ++b) {
    remaining[b] = static_cast<int>(consumers_[b].size());
  }
  std::vector<int64_t> steps;
  steps.reserve(order.size());
  int64_t live = initial_resident_;
  for (int u : order) {
    steps.push_back(live + out_bytes_[u]);
    for (int b : produced_[u]) {
      if (is_resident_kind(b)) {
        live += sizes_[b];
      }
    }
    for (int b : consumed_[u]) {
      if (--remaining[b] == 0 && !is_output_[b]) {
        live -= sizes_[b];
      }
    }
  }
  return steps;
}

int64_t Problem::peak(const std::vector<int>& order) const {
  int64_t best = 0;
  for (int64_t s : step_costs(order)) {
    best = std::max(best, s);
  }
  return best;
}

}  // namespace torch_replay::schedule
