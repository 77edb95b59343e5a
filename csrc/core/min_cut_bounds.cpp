#include "core/min_cut_bounds.h"

#include <algorithm>
#include <tuple>

// Boost 1.74's edge iterators trip -Wmaybe-uninitialized under -O3.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/boykov_kolmogorov_max_flow.hpp>
#pragma GCC diagnostic pop

namespace torch_replay::schedule {

// See Note [Conditional event minimum] for the network.
struct EventOracle::Network {
  using Traits =
      boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using Edge = Traits::edge_descriptor;
  using Graph = boost::adjacency_list<
      boost::vecS,
      boost::vecS,
      boost::directedS,
      boost::property<
          boost::vertex_color_t,
          boost::default_color_type,
          boost::property<
              boost::vertex_distance_t,
              long,
              boost::property<boost::vertex_predecessor_t, Edge>>>,
      boost::property<
          boost::edge_capacity_t,
          int64_t,
          boost::property<
              boost::edge_residual_capacity_t,
              int64_t,
              boost::property<boost::edge_reverse_t, Edge>>>>;

  Graph g;
  int source = 0;
  int sink = 1;
  int64_t inf = 0;
  int64_t sum_y = 0;
  std::vector<Edge> from_source;  // s -> x_v, capacity 0 unless forced in
  std::vector<Edge> to_sink;      // x_v -> t, capacity resbytes(v)
  std::vector<int64_t> base_to_sink;

  static int x(int v) {
    return v + 2;
  }

  Edge add(int a, int b, int64_t cap) {
    auto cap_map = boost::get(boost::edge_capacity, g);
    auto rev_map = boost::get(boost::edge_reverse, g);
    Edge e = boost::add_edge(a, b, g).first;
    Edge r = boost::add_edge(b, a, g).first;
    cap_map[e] = cap;
    cap_map[r] = 0;
    rev_map[e] = r;
    rev_map[r] = e;
    return e;
  }
};

EventOracle::EventOracle(const Problem& problem)
    : problem_(problem), net_(std::make_unique<Network>()) {
  const int n = problem.num_units();
  Network& net = *net_;
  std::vector<int> y_of(problem.num_buffers(), -1);
  int next = n + 2;
  int64_t finite = 1;
  for (int b = 0; b < problem.num_buffers(); ++b) {
    if (!problem.is_output(b) && !problem.consumers(b).empty()) {
      y_of[b] = next++;
      finite += problem.size(b);
    }
  }
  net.g = Network::Graph(next);
  net.base_to_sink.assign(n, 0);
  for (int v = 0; v < n; ++v) {
    for (int b : problem.produced(v)) {
      if (problem.is_resident_kind(b)) {
        net.base_to_sink[v] += problem.size(b);
      }
    }
    finite += net.base_to_sink[v];
  }
  // Larger than any finite cut, so a minimum cut never uses an infinite arc.
  net.inf = finite;
  for (int v = 0; v < n; ++v) {
    net.from_source.push_back(net.add(net.source, Network::x(v), 0));
    net.to_sink.push_back(
        net.add(Network::x(v), net.sink, net.base_to_sink[v]));
    for (int w : problem.preds(v)) {
      net.add(Network::x(v), Network::x(w), net.inf);
    }
  }
  for (int b = 0; b < problem.num_buffers(); ++b) {
    if (y_of[b] < 0) {
      continue;
    }
    net.add(net.source, y_of[b], problem.size(b));
    net.sum_y += problem.size(b);
    for (int c : problem.consumers(b)) {
      net.add(y_of[b], Network::x(c), net.inf);
    }
  }
}

EventOracle::~EventOracle() = default;

int64_t EventOracle::solve(
    const std::vector<int>& force_in,
    const std::vector<int>& force_out,
    UnitSet* smallest,
    UnitSet* largest) {
  Network& net = *net_;
  auto cap = boost::get(boost::edge_capacity, net.g);
  auto res = boost::get(boost::edge_residual_capacity, net.g);
  auto rev = boost::get(boost::edge_reverse, net.g);
  for (int v : force_in) {
    cap[net.from_source[v]] = net.inf;
  }
  for (int v : force_out) {
    cap[net.to_sink[v]] = net.inf;
  }
  const int64_t flow =
      boost::boykov_kolmogorov_max_flow(net.g, net.source, net.sink);
  ++num_min_cuts_;
  for (int v : force_in) {
    cap[net.from_source[v]] = 0;
  }
  for (int v : force_out) {
    cap[net.to_sink[v]] = net.base_to_sink[v];
  }
  if (flow >= net.inf) {
    throw ReplayException(
        ErrorKind::kInternal,
        "min-cut network is infeasible although the feasibility pre-check "
        "passed");
  }
  const int n = problem_.num_units();
  const int nv = static_cast<int>(boost::num_vertices(net.g));
  // The vertices reached from `start` along edges with residual capacity: out
  // of s forward (an edge's own residual), or into t backward (its reverse's).
  auto residual_reach = [&](int start, bool towards_sink) {
    std::vector<char> seen(nv, 0);
    std::vector<int> stack = {start};
    seen[start] = 1;
    while (!stack.empty()) {
      int a = stack.back();
      stack.pop_back();
      for (auto [it, end] = boost::out_edges(a, net.g); it != end; ++it) {
        int b = static_cast<int>(boost::target(*it, net.g));
        const auto left = towards_sink ? res[rev[*it]] : res[*it];
        if (!seen[b] && left > 0) {
          seen[b] = 1;
          stack.push_back(b);
        }
      }
    }
    return seen;
  };
  auto units_where = [&](const std::vector<char>& seen, char reached) {
    UnitSet out(n);
    for (int v = 0; v < n; ++v) {
      if (seen[Network::x(v)] == reached) {
        out.insert(v);
      }
    }
    return out;
  };
  if (smallest != nullptr) {
    // Vertices reachable from s in the residual graph.
    *smallest = units_where(residual_reach(net.source, false), 1);
  }
  if (largest != nullptr) {
    // Vertices that reach t in the residual graph are on the sink side of
    // every minimum cut; all others form the largest source side.
    *largest = units_where(residual_reach(net.sink, true), 0);
  }
  return problem_.initial_resident() + flow - net.sum_y;
}

int64_t EventOracle::event(
    int u,
    const std::vector<int>& done,
    const std::vector<int>& not_done,
    UnitSet* smallest,
    UnitSet* largest) {
  const int n = problem_.num_units();
  UnitSet in = problem_.ancestors(u);
  UnitSet out = problem_.descendants(u);
  out.insert(u);
  for (int a : done) {
    in |= problem_.ancestors(a);
    in.insert(a);
  }
  for (int b : not_done) {
    out |= problem_.descendants(b);
    out.insert(b);
  }
  if (in.intersects(out)) {
    return kInfeasible;
  }
  std::vector<int> force_in(problem_.preds(u));
  force_in.insert(force_in.end(), done.begin(), done.end());
  std::vector<int> force_out = {u};
  force_out.insert(force_out.end(), not_done.begin(), not_done.end());
  (void)n;
  return solve(force_in, force_out, smallest, largest) + problem_.out_bytes(u);
}

int64_t EventOracle::min_resident_superset(
    const UnitSet& base, UnitSet* smallest) {
  return solve(base.elements(), {}, smallest, nullptr);
}

MinCutBounds::MinCutBounds(const Problem& problem)
    : problem_(problem), oracle_(problem), n_(problem.num_units()) {}

void MinCutBounds::ensure_events() {
  if (events_ready_) {
    return;
  }
  event_.resize(n_);
  smallest_.resize(n_);
  largest_.resize(n_);
  for (int u = 0; u < n_; ++u) {
    event_[u] = oracle_.event(u, {}, {}, &smallest_[u], &largest_[u]);
  }
  const size_t nn = static_cast<size_t>(n_) * n_;
  for (int k = 0; k < 2; ++k) {
    upper_[k].assign(nn, -1);
    exact_[k].assign(nn, 0);
  }
  events_ready_ = true;
}

int64_t MinCutBounds::event(int u) {
  ensure_events();
  return event_[u];
}

int64_t MinCutBounds::event_cut() {
  ensure_events();
  int64_t best = 0;
  for (int64_t e : event_) {
    best = std::max(best, e);
  }
  return best;
}

int64_t MinCutBounds::end_steps() const {
  if (n_ == 0) {
    return 0;
  }
  int64_t last = kInfeasible;
  int64_t first = kInfeasible;
  UnitSet all(n_);
  for (int u = 0; u < n_; ++u) {
    all.insert(u);
  }
  const UnitSet none(n_);
  for (int u = 0; u < n_; ++u) {
    if (problem_.succs(u).empty()) {
      UnitSet others = all;
      others.erase(u);
      last = std::min(last, problem_.resident(others) + problem_.out_bytes(u));
    }
    if (problem_.preds(u).empty()) {
      first = std::min(first, problem_.resident(none) + problem_.out_bytes(u));
    }
  }
  return std::max(first, last);
}

int64_t MinCutBounds::upper(Kind kind, int u, int v) {
  const size_t i = static_cast<size_t>(u) * n_ + v;
  int64_t& ub = upper_[kind][i];
  if (ub >= 0) {
    return ub;
  }
  // A downset admissible for the conditioned event: the largest (smallest)
  // unconditioned minimiser with v's ancestors added (descendants removed).
  UnitSet w;
  if (kind == kDone) {
    if (largest_[u].contains(v)) {
      exact_[kind][i] = 1;
      return ub = event_[u];
    }
    w = largest_[u];
    w |= problem_.ancestors(v);
    w.insert(v);
  } else {
    if (!smallest_[u].contains(v)) {
      exact_[kind][i] = 1;
      return ub = event_[u];
    }
    w = smallest_[u];
    w.subtract(problem_.descendants(v));
    w.erase(v);
  }
  ub = problem_.resident(w) + problem_.out_bytes(u);
  if (ub == event_[u]) {
    exact_[kind][i] = 1;
  }
  return ub;
}

void MinCutBounds::add_witness(int u, const UnitSet& w, int64_t value) {
  int64_t* done = &upper_[kDone][static_cast<size_t>(u) * n_];
  int64_t* not_done = &upper_[kNotDone][static_cast<size_t>(u) * n_];
  for (int v = 0; v < n_; ++v) {
    // Only initialised entries are tightened; upper() initialises lazily.
    int64_t& ub = w.contains(v) ? done[v] : not_done[v];
    if (ub > value) {
      ub = value;
    }
  }
}

int64_t MinCutBounds::exact(Kind kind, int u, int v) {
  const size_t i = static_cast<size_t>(u) * n_ + v;
  upper(kind, u, v);
  if (exact_[kind][i]) {
    return upper_[kind][i];
  }
  UnitSet smallest, largest;
  std::vector<int> cond = {v};
  const std::vector<int> none;
  const int64_t value = oracle_.event(
      u,
      kind == kDone ? cond : none,
      kind == kNotDone ? cond : none,
      &smallest,
      &largest);
  if (value == kInfeasible) {
    throw ReplayException(
        ErrorKind::kInternal,
        "conditional event of an incomparable pair is infeasible");
  }
  upper_[kind][i] = value;
  exact_[kind][i] = 1;
  add_witness(u, smallest, value);
  add_witness(u, largest, value);
  return value;
}

int64_t MinCutBounds::trap(Kind kind, int64_t stop_at) {
  int64_t cur = event_cut();
  if (cur >= stop_at) {
    return cur;
  }
  std::vector<std::tuple<int64_t, int, int>> pairs;
  for (int u = 0; u < n_; ++u) {
    for (int v = u + 1; v < n_; ++v) {
      if (problem_.comparable(u, v)) {
        continue;
      }
      const int64_t a = upper(kind, u, v);
      if (a <= cur) {
        continue;
      }
      const int64_t b = upper(kind, v, u);
      if (b <= cur) {
        continue;
      }
      pairs.emplace_back(std::min(a, b), u, v);
    }
  }
  std::sort(pairs.begin(), pairs.end(), [](const auto& p, const auto& q) {
    return std::get<0>(p) > std::get<0>(q);
  });
  for (auto [initial, u, v] : pairs) {
    if (initial <= cur) {
      break;
    }
    int64_t a = upper(kind, u, v);
    int64_t b = upper(kind, v, u);
    if (a <= cur || b <= cur) {
      continue;
    }
    // The side with the smaller upper bound is likelier to fail the test.
    if (b < a) {
      std::swap(u, v);
    }
    const int64_t first = exact(kind, u, v);
    if (first <= cur) {
      continue;
    }
    const int64_t second = exact(kind, v, u);
    cur = std::max(cur, std::min(first, second));
    if (cur >= stop_at) {
      return cur;
    }
  }
  return cur;
}

int64_t MinCutBounds::forward_trap(int64_t stop_at) {
  return cached_trap(kDone, stop_at);
}

int64_t MinCutBounds::reverse_trap(int64_t stop_at) {
  return cached_trap(kNotDone, stop_at);
}

int64_t MinCutBounds::cached_trap(Kind kind, int64_t stop_at) {
  ensure_events();
  // A cached value serves when it was exact (no stop), reaches this stop, or
  // ended below its own stop (so it is exact too).
  if (trap_value_[kind] >= 0 &&
      (trap_stop_[kind] == kNoStop || trap_value_[kind] >= stop_at ||
       trap_value_[kind] < trap_stop_[kind])) {
    return trap_value_[kind];
  }
  trap_value_[kind] = trap(kind, stop_at);
  trap_stop_[kind] = stop_at;
  return trap_value_[kind];
}

bool MinCutBounds::max_exceeds(
    Kind k1,
    int u1,
    int v1,
    Kind k2,
    int u2,
    int v2,
    int64_t cur,
    int64_t* value) {
  const bool check1 = upper(k1, u1, v1) > cur;
  const bool check2 = upper(k2, u2, v2) > cur;
  int64_t best = cur;
  if (check1) {
    best = std::max(best, exact(k1, u1, v1));
  }
  if (check2) {
    best = std::max(best, exact(k2, u2, v2));
  }
  *value = best;
  return best > cur;
}

int64_t MinCutBounds::joint_trap(int64_t stop_at) {
  int64_t cur = std::max(forward_trap(stop_at), reverse_trap(stop_at));
  if (cur >= stop_at) {
    return cur;
  }
  // Pair {u, v}: if u runs first, u's step excludes v (kNotDone) and v's
  // step includes u (kDone); symmetrically if v runs first.
  auto pair_upper = [&](int u, int v) {
    const int64_t u_first = std::max(upper(kNotDone, u, v), upper(kDone, v, u));
    const int64_t v_first = std::max(upper(kNotDone, v, u), upper(kDone, u, v));
    return std::min(u_first, v_first);
  };
  std::vector<std::tuple<int64_t, int, int>> pairs;
  for (int u = 0; u < n_; ++u) {
    for (int v = u + 1; v < n_; ++v) {
      if (problem_.comparable(u, v)) {
        continue;
      }
      const int64_t ub = pair_upper(u, v);
      if (ub > cur) {
        pairs.emplace_back(ub, u, v);
      }
    }
  }
  std::sort(pairs.begin(), pairs.end(), [](const auto& p, const auto& q) {
    return std::get<0>(p) > std::get<0>(q);
  });
  for (auto [initial, u, v] : pairs) {
    if (initial <= cur) {
      break;
    }
    if (pair_upper(u, v) <= cur) {
      continue;
    }
    int64_t u_first = 0;
    int64_t v_first = 0;
    if (!max_exceeds(kNotDone, u, v, kDone, v, u, cur, &u_first)) {
      continue;
    }
    if (!max_exceeds(kNotDone, v, u, kDone, u, v, cur, &v_first)) {
      continue;
    }
    cur = std::max(cur, std::min(u_first, v_first));
    if (cur >= stop_at) {
      return cur;
    }
  }
  return cur;
}

}  // namespace torch_replay::schedule
