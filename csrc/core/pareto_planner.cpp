#include "core/pareto_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace torch_replay {
namespace {

constexpr int64_t kMaxTotalBytes = int64_t{1} << 62;

[[noreturn]] void invalid(const std::string& message) {
  throw ReplayException(ErrorKind::kInvalidArgument, message);
}

// A partial plan after some segment. `parent` is the index of the state it
// extends in the previous layer; `option` the option taken for this segment.
struct State {
  int64_t retained;
  int64_t transient;
  double time;
  uint32_t parent;
  uint32_t option;
};

// One kept layer of the DP: just enough to walk the chosen plan back.
struct Layer {
  std::vector<uint32_t> parent;
  std::vector<uint32_t> option;
};

// Sort key of a candidate for the dominance sweep. `index` is its position
// among the layer's candidates, which is the lexicographic order of its
// option sequence (candidates are generated parent by parent in the previous
// layer's order, options in list order).
struct SweepKey {
  int64_t transient;
  int64_t retained;
  double time;
  uint32_t index;
};

// Marks in keep[] the candidates that no other candidate dominates in
// (retained, transient, time), with the tie rule of Note [Planner
// tie-breaking]: a dominator must be strictly better in retained or time, or
// equal in both and earlier in index.
void pareto_sweep(const std::vector<State>& cand, std::vector<char>& keep) {
  std::vector<SweepKey> keys(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) {
    keys[i] = {
        cand[i].transient,
        cand[i].retained,
        cand[i].time,
        static_cast<uint32_t>(i)};
  }
  std::sort(keys.begin(), keys.end(), [](const SweepKey& a, const SweepKey& b) {
    if (a.transient != b.transient) {
      return a.transient < b.transient;
    }
    if (a.retained != b.retained) {
      return a.retained < b.retained;
    }
    if (a.time != b.time) {
      return a.time < b.time;
    }
    return a.index < b.index;
  });
  // Staircase of the kept states seen so far (all with transient <= the
  // current one): retained -> (least time, earliest index with exactly that
  // retained and time). Times strictly decrease as retained grows, so the
  // entry with the largest retained <= r holds the least time among all
  // states with retained <= r.
  struct Step {
    double time;
    uint32_t first_index;
  };
  std::map<int64_t, Step> stairs;
  for (const SweepKey& k : keys) {
    auto it = stairs.upper_bound(k.retained);
    bool dominated = false;
    if (it != stairs.begin()) {
      auto prev = std::prev(it);
      const Step& s = prev->second;
      if (s.time < k.time) {
        dominated = true;
      } else if (s.time == k.time) {
        dominated = prev->first < k.retained || s.first_index < k.index;
      }
      if (!dominated && s.time == k.time) {
        // Same (retained, time) as a kept state with a smaller transient but
        // a later index: keep it, and let it stand for that point.
        prev->second.first_index = k.index;
        keep[k.index] = 1;
        continue;
      }
      if (!dominated && prev->first == k.retained) {
        // Strictly faster at the same retained: replaces the step.
        stairs.erase(prev);
      }
    }
    if (dominated) {
      continue;
    }
    keep[k.index] = 1;
    auto ins = stairs.emplace_hint(it, k.retained, Step{k.time, k.index});
    // Remove the steps this state makes redundant: larger retained, no
    // smaller time.
    auto next = std::next(ins);
    while (next != stairs.end() && next->second.time >= k.time) {
      next = stairs.erase(next);
    }
  }
}

// The unsafe rule of Note [Planner dominance]: (retained + transient, time).
void summed_memory_sweep(
    const std::vector<State>& cand, std::vector<char>& keep) {
  std::vector<SweepKey> keys(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) {
    keys[i] = {
        0,
        cand[i].retained + cand[i].transient,
        cand[i].time,
        static_cast<uint32_t>(i)};
  }
  std::sort(keys.begin(), keys.end(), [](const SweepKey& a, const SweepKey& b) {
    if (a.retained != b.retained) {
      return a.retained < b.retained;
    }
    if (a.time != b.time) {
      return a.time < b.time;
    }
    return a.index < b.index;
  });
  double best = std::numeric_limits<double>::infinity();
  for (const SweepKey& k : keys) {
    if (k.time < best) {
      best = k.time;
      keep[k.index] = 1;
    }
  }
}

// persistent + min over plans of (sum retained + max transient): for each
// threshold T among the transients, T plus the least retained of each
// segment among its options with transient <= T.
int64_t compute_min_budget(
    const std::vector<std::vector<PlannerOption>>& segments,
    int64_t persistent) {
  struct Event {
    int64_t transient;
    int64_t retained;
    size_t segment;
  };
  std::vector<Event> events;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (const PlannerOption& o : segments[s]) {
      events.push_back({o.transient, o.retained, s});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.transient < b.transient;
  });
  constexpr int64_t kNone = -1;
  std::vector<int64_t> best(segments.size(), kNone);
  size_t missing = segments.size();
  int64_t sum = 0;
  int64_t answer = std::numeric_limits<int64_t>::max();
  if (segments.empty()) {
    return persistent;
  }
  for (size_t i = 0; i < events.size();) {
    const int64_t t = events[i].transient;
    for (; i < events.size() && events[i].transient == t; ++i) {
      const Event& e = events[i];
      if (best[e.segment] == kNone) {
        best[e.segment] = e.retained;
        sum += e.retained;
        --missing;
      } else if (e.retained < best[e.segment]) {
        sum -= best[e.segment] - e.retained;
        best[e.segment] = e.retained;
      }
    }
    if (missing == 0) {
      answer = std::min(answer, t + sum);
    }
  }
  return persistent + answer;
}

// The lower convex hull of the (retained, time) points of the options of one
// segment that `allowed` accepts: option indices by increasing retained and
// strictly decreasing time. Empty when no option is allowed.
template <typename Allowed>
std::vector<int32_t> lower_hull(
    const std::vector<PlannerOption>& opts, Allowed allowed) {
  std::vector<int32_t> order;
  for (size_t o = 0; o < opts.size(); ++o) {
    if (allowed(opts[o])) {
      order.push_back(static_cast<int32_t>(o));
    }
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (opts[a].retained != opts[b].retained) {
      return opts[a].retained < opts[b].retained;
    }
    if (opts[a].time != opts[b].time) {
      return opts[a].time < opts[b].time;
    }
    return a < b;
  });
  std::vector<int32_t> hull;
  for (int32_t o : order) {
    if (!hull.empty() && opts[o].time >= opts[hull.back()].time) {
      continue;  // no faster than a leaner option
    }
    while (hull.size() >= 2) {
      const PlannerOption& a = opts[hull[hull.size() - 2]];
      const PlannerOption& b = opts[hull.back()];
      const PlannerOption& p = opts[o];
      using LD = long double;
      const LD cross = LD(b.retained - a.retained) * (LD(p.time) - a.time) -
                       (LD(b.time) - a.time) * LD(p.retained - a.retained);
      if (cross > 0) {
        break;  // b lies strictly below the chord a-p
      }
      hull.pop_back();
    }
    hull.push_back(o);
  }
  return hull;
}

// One hull edge: moving segment `segment` from a faster hull vertex to the
// next leaner one saves `bytes` retained bytes for `time` more time.
struct HullEdge {
  int64_t bytes;
  double time;
  double per_byte;
  size_t segment;
  size_t rank;  // position along the segment's walk, fastest first
};

void sort_edges(std::vector<HullEdge>& edges) {
  std::sort(
      edges.begin(), edges.end(), [](const HullEdge& a, const HullEdge& b) {
        if (a.per_byte != b.per_byte) {
          return a.per_byte < b.per_byte;
        }
        if (a.segment != b.segment) {
          return a.segment < b.segment;
        }
        return a.rank < b.rank;
      });
}

// Appends the edges of one hull (indices by increasing retained).
void append_edges(
    const std::vector<PlannerOption>& opts,
    const std::vector<int32_t>& hull,
    size_t segment,
    std::vector<HullEdge>& edges) {
  for (size_t k = hull.size(); k-- > 1;) {
    const PlannerOption& fast = opts[hull[k]];
    const PlannerOption& lean = opts[hull[k - 1]];
    const int64_t bytes = fast.retained - lean.retained;
    const double time = lean.time - fast.time;
    edges.push_back(
        {bytes,
         time,
         time / static_cast<double>(bytes),
         segment,
         hull.size() - 1 - k});
  }
}

// Fenwick tree over hull edges sorted by time per byte, for the LP bound of
// Note [Planner time bound].
class EdgeFenwick {
 public:
  explicit EdgeFenwick(const std::vector<HullEdge>& edges)
      : bytes_(edges.size() + 1, 0),
        time_(edges.size() + 1, 0.0),
        per_byte_(edges.size() + 1, 0.0) {
    for (size_t i = 0; i < edges.size(); ++i) {
      per_byte_[i + 1] = edges[i].per_byte;
      add(i, edges[i].bytes, edges[i].time);
    }
    top_ = 1;
    while (top_ * 2 <= edges.size()) {
      top_ *= 2;
    }
  }

  void add(size_t pos, int64_t bytes, double time) {
    for (size_t i = pos + 1; i < bytes_.size(); i += i & (~i + 1)) {
      bytes_[i] += bytes;
      time_[i] += time;
    }
  }

  // Least time to save `need` > 0 bytes with fractional edges, or infinity
  // when the active edges save less than that.
  double cost(int64_t need) const {
    size_t pos = 0;
    double time = 0.0;
    for (size_t step = top_; step > 0; step >>= 1) {
      const size_t next = pos + step;
      if (next < bytes_.size() && bytes_[next] < need) {
        pos = next;
        need -= bytes_[next];
        time += time_[next];
      }
    }
    if (pos + 1 >= bytes_.size()) {
      return std::numeric_limits<double>::infinity();
    }
    return time + static_cast<double>(need) * per_byte_[pos + 1];
  }

 private:
  std::vector<int64_t> bytes_;
  std::vector<double> time_;
  std::vector<double> per_byte_;
  size_t top_ = 1;
};

// Lower bounds on the time a completion adds, Note [Planner time bound].
// The transient of the final plan is split into pieces by levels
// T_0 < ... < T_{m-1} (transients of options, the last the largest that
// fits): a plan whose final transient lies in (T_{k-1}, T_k] uses only
// options with transient <= T_k and leaves at most room - T_{k-1} - 1 bytes
// for retained. Each piece has its own LP (hull edges of its options in a
// Fenwick tree); the bound is the least over the pieces a state can reach.
class SuffixTimeBound {
 public:
  SuffixTimeBound(
      const std::vector<std::vector<PlannerOption>>& segments,
      int64_t floor,
      int64_t room) {
    const size_t n = segments.size();
    std::vector<int64_t> distinct;
    for (const auto& opts : segments) {
      for (const PlannerOption& o : opts) {
        if (o.transient >= floor && o.transient <= room) {
          distinct.push_back(o.transient);
        }
      }
    }
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(
        std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (distinct.empty()) {
      distinct.push_back(room);  // no segments
    }
    constexpr size_t kLevels = 16;
    for (size_t k = 0; k < kLevels; ++k) {
      const int64_t t = distinct[(distinct.size() - 1) * k / (kLevels - 1)];
      if (levels_.empty() || t != levels_.back()) {
        levels_.push_back(t);
      }
    }
    for (int64_t cap : levels_) {
      Piece piece;
      piece.fast_time.assign(n + 1, 0.0);
      piece.fast_retained.assign(n + 1, 0);
      piece.slots.resize(n);
      std::vector<HullEdge> edges;
      for (size_t s = n; s-- > 0;) {
        const auto hull = lower_hull(
            segments[s],
            [cap](const PlannerOption& o) { return o.transient <= cap; });
        if (hull.empty()) {
          piece.first_ok = std::max(piece.first_ok, s + 1);
          continue;
        }
        const PlannerOption& fast = segments[s][hull.back()];
        piece.fast_time[s] = piece.fast_time[s + 1] + fast.time;
        piece.fast_retained[s] = piece.fast_retained[s + 1] + fast.retained;
        append_edges(segments[s], hull, s, edges);
      }
      sort_edges(edges);
      for (size_t e = 0; e < edges.size(); ++e) {
        piece.slots[edges[e].segment].push_back(
            {e, edges[e].bytes, edges[e].time});
      }
      piece.fenwick = EdgeFenwick(edges);
      pieces_.push_back(std::move(piece));
    }
  }

  // Drops segment s from every piece's LP. Precondition: segments are left
  // in order 0, 1, ...
  void leave(size_t s) {
    for (Piece& piece : pieces_) {
      for (const Slot& slot : piece.slots[s]) {
        piece.fenwick.add(slot.position, -slot.bytes, -slot.time);
      }
    }
  }

  // A lower bound on the time that segments >= s (every earlier one left)
  // add to a state with transient q and room_left bytes for the suffix's
  // retained plus the final transient. Returns early with a value <= stop
  // once it finds one.
  // Pass stop = NaN for the tightest bound.
  double bound(size_t s, int64_t room_left, int64_t q, double stop) const {
    // The whole LP with transient q is below every piece: try it first.
    const double whole = piece_time(pieces_.size() - 1, s, room_left, q);
    if (whole > stop) {
      return whole;
    }
    double best = std::numeric_limits<double>::infinity();
    for (size_t k = pieces_.size(); k-- > 0;) {
      if (levels_[k] < q) {
        break;
      }
      const int64_t charge = k == 0 ? q : std::max(q, levels_[k - 1] + 1);
      best = std::min(best, piece_time(k, s, room_left, charge));
      if (best <= stop) {
        break;
      }
    }
    return best;
  }

 private:
  struct Slot {
    size_t position;
    int64_t bytes;
    double time;
  };
  struct Piece {
    EdgeFenwick fenwick{{}};
    std::vector<std::vector<Slot>> slots;  // per segment
    std::vector<double> fast_time;         // suffix sums, fastest hull vertex
    std::vector<int64_t> fast_retained;
    size_t first_ok = 0;  // segments >= first_ok all have an allowed option
  };

  double piece_time(
      size_t k, size_t s, int64_t room_left, int64_t charge) const {
    const Piece& piece = pieces_[k];
    const double inf = std::numeric_limits<double>::infinity();
    if (s < piece.first_ok || charge > room_left) {
      return inf;
    }
    const int64_t need = piece.fast_retained[s] - (room_left - charge);
    if (need <= 0) {
      return piece.fast_time[s];
    }
    return piece.fast_time[s] + piece.fenwick.cost(need);
  }

  std::vector<int64_t> levels_;
  std::vector<Piece> pieces_;
};

}  // namespace

ParetoPlanner::ParetoPlanner(
    std::vector<std::vector<PlannerOption>> segments, int64_t persistent)
    : segments_(std::move(segments)), persistent_(persistent) {
  if (persistent_ < 0) {
    invalid("planner: persistent bytes must be >= 0");
  }
  const size_t n = segments_.size();
  int64_t max_retained_sum = 0;
  int64_t max_transient = 0;
  for (size_t s = 0; s < n; ++s) {
    const auto& opts = segments_[s];
    const std::string where = "planner: segment " + std::to_string(s);
    if (opts.empty()) {
      invalid(where + " has no option; give each segment at least one");
    }
    if (opts.size() >= (size_t{1} << 31)) {
      invalid(where + " has too many options");
    }
    int64_t seg_max_retained = 0;
    for (size_t o = 0; o < opts.size(); ++o) {
      const PlannerOption& opt = opts[o];
      const std::string at = where + " option " + std::to_string(o);
      if (opt.retained < 0 || opt.transient < 0) {
        invalid(at + ": retained and transient bytes must be >= 0");
      }
      if (!std::isfinite(opt.time) || opt.time < 0) {
        invalid(at + ": time must be finite and >= 0");
      }
      if (opt.retained >= kMaxTotalBytes || opt.transient >= kMaxTotalBytes) {
        invalid(at + ": byte counts must be below 2^62");
      }
      seg_max_retained = std::max(seg_max_retained, opt.retained);
      max_transient = std::max(max_transient, opt.transient);
    }
    max_retained_sum += seg_max_retained;
    if (max_retained_sum >= kMaxTotalBytes) {
      invalid("planner: the summed retained bytes can exceed 2^62");
    }
  }
  if (persistent_ >= kMaxTotalBytes - max_retained_sum - max_transient) {
    invalid("planner: persistent + retained + transient can exceed 2^62");
  }
  suffix_min_retained_.assign(n + 1, 0);
  suffix_transient_floor_.assign(n + 1, 0);
  for (size_t s = n; s-- > 0;) {
    int64_t min_r = std::numeric_limits<int64_t>::max();
    int64_t min_q = std::numeric_limits<int64_t>::max();
    for (const PlannerOption& o : segments_[s]) {
      min_r = std::min(min_r, o.retained);
      min_q = std::min(min_q, o.transient);
    }
    suffix_min_retained_[s] = suffix_min_retained_[s + 1] + min_r;
    suffix_transient_floor_[s] =
        std::max(suffix_transient_floor_[s + 1], min_q);
  }
  min_budget_ = compute_min_budget(segments_, persistent_);
  hulls_.resize(n);
  for (size_t s = 0; s < n; ++s) {
    hulls_[s] =
        lower_hull(segments_[s], [](const PlannerOption&) { return true; });
    double max_time = 0.0;
    for (const PlannerOption& o : segments_[s]) {
      max_time = std::max(max_time, o.time);
    }
    time_scale_ += max_time;
  }
}

double ParetoPlanner::greedy_upper_bound(int64_t budget) const {
  const double inf = std::numeric_limits<double>::infinity();
  if (budget < min_budget_) {
    return inf;
  }
  const int64_t room = budget - persistent_;
  const size_t n = segments_.size();
  // Caps on the transient: distinct transients in [floor, room], at most 64
  // of them spread evenly (the largest always included).
  std::vector<int64_t> caps;
  for (const auto& opts : segments_) {
    for (const PlannerOption& o : opts) {
      if (o.transient >= suffix_transient_floor_[0] && o.transient <= room) {
        caps.push_back(o.transient);
      }
    }
  }
  if (caps.empty()) {
    caps.push_back(0);  // no segments
  }
  std::sort(caps.begin(), caps.end());
  caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
  constexpr size_t kMaxCaps = 64;
  if (caps.size() > kMaxCaps) {
    std::vector<int64_t> spread;
    for (size_t k = 0; k < kMaxCaps; ++k) {
      spread.push_back(caps[(caps.size() - 1) * k / (kMaxCaps - 1)]);
    }
    caps = std::move(spread);
  }
  double best = inf;
  std::vector<size_t> vertex(n);
  std::vector<int32_t> choice(n);
  std::vector<std::vector<int32_t>> hulls(n);
  std::vector<HullEdge> edges;
  for (int64_t cap : caps) {
    bool ok = true;
    int64_t retained = 0;
    edges.clear();
    for (size_t s = 0; s < n && ok; ++s) {
      hulls[s] = lower_hull(segments_[s], [cap](const PlannerOption& o) {
        return o.transient <= cap;
      });
      ok = !hulls[s].empty();
      if (ok) {
        vertex[s] = hulls[s].size() - 1;
        retained += segments_[s][hulls[s].back()].retained;
        append_edges(segments_[s], hulls[s], s, edges);
      }
    }
    if (!ok) {
      continue;
    }
    sort_edges(edges);
    for (size_t e = 0; e < edges.size() && retained + cap > room; ++e) {
      retained -= edges[e].bytes;
      --vertex[edges[e].segment];
    }
    if (retained + cap > room) {
      continue;
    }
    // Spend the bytes the last whole edge over-saved: move single segments
    // to faster options (any with transient <= cap) while retained fits.
    for (size_t s = 0; s < n; ++s) {
      choice[s] = hulls[s][vertex[s]];
    }
    for (bool improved = true; improved;) {
      improved = false;
      for (size_t s = 0; s < n; ++s) {
        const PlannerOption& cur = segments_[s][choice[s]];
        for (size_t o = 0; o < segments_[s].size(); ++o) {
          const PlannerOption& alt = segments_[s][o];
          if (alt.transient <= cap && alt.time < cur.time &&
              retained - cur.retained + alt.retained + cap <= room) {
            retained += alt.retained - cur.retained;
            choice[s] = static_cast<int32_t>(o);
            improved = true;
            break;
          }
        }
      }
    }
    double time = 0.0;
    for (size_t s = 0; s < n; ++s) {
      time += segments_[s][choice[s]].time;
    }
    best = std::min(best, time);
  }
  return best;
}

PlannerResult ParetoPlanner::solve(
    int64_t budget, const PlannerSettings& settings) const {
  const double inf = std::numeric_limits<double>::infinity();
  if (budget < min_budget_ || !settings.time_bound) {
    PlannerResult result = run(budget, settings.dominance, inf);
    result.time_upper_bound = inf;
    return result;
  }
  // Note [Planner time bound], iterative deepening: a run with limit L keeps
  // every plan of time <= L, so a plan it returns with time <= L is the
  // optimum (and the one Note [Planner tie-breaking] picks). Limits grow
  // geometrically from the LP bound of the whole problem to the greedy
  // upper bound U, which always succeeds.
  const double upper = greedy_upper_bound(budget);
  const double lower = root_lower_bound(budget);
  int64_t generated = 0;
  int64_t pruned = 0;
  int rounds = 0;
  constexpr int kRounds = 6;
  for (int k = std::isfinite(upper) ? 0 : kRounds; k <= kRounds; ++k) {
    double limit = upper;
    if (k < kRounds) {
      limit = lower + (upper - lower) * std::ldexp(1.0, k - kRounds);
      if (!(limit < upper)) {
        continue;
      }
    }
    PlannerResult result = run(budget, settings.dominance, limit);
    ++rounds;
    generated += result.states_generated;
    pruned += result.states_pruned_by_time;
    if (k == kRounds || (result.feasible && result.time <= limit)) {
      result.states_generated = generated;
      result.states_pruned_by_time = pruned;
      result.time_upper_bound = upper;
      result.rounds = rounds;
      return result;
    }
  }
  throw ReplayException(
      ErrorKind::kInternal, "planner: the final round did not run");
}

double ParetoPlanner::root_lower_bound(int64_t budget) const {
  const int64_t room = budget - persistent_;
  const SuffixTimeBound bound(segments_, suffix_transient_floor_[0], room);
  return bound.bound(
      0,
      room,
      suffix_transient_floor_[0],
      std::numeric_limits<double>::quiet_NaN());
}

PlannerResult ParetoPlanner::run(
    int64_t budget, PlannerDominance dominance, double limit) const {
  PlannerResult result;
  result.min_budget = min_budget_;
  const size_t n = segments_.size();
  if (budget < min_budget_) {
    return result;
  }
  // The memory left for retained + transient; >= 0 since budget >=
  // min_budget >= persistent.
  const int64_t room = budget - persistent_;

  const bool bound = std::isfinite(limit);
  limit += 1e-9 * time_scale_;  // rounding slack, Note [Planner time bound]
  std::unique_ptr<SuffixTimeBound> time_bound;
  if (bound) {
    time_bound = std::make_unique<SuffixTimeBound>(
        segments_, suffix_transient_floor_[0], room);
  }

  std::vector<State> frontier{{0, 0, 0.0, 0, 0}};
  std::vector<Layer> layers(n);
  std::vector<State> cand;
  std::vector<char> keep;
  for (size_t s = 0; s < n; ++s) {
    const auto& opts = segments_[s];
    const int64_t floor = suffix_transient_floor_[s + 1];
    const int64_t rest = suffix_min_retained_[s + 1];
    if (bound) {
      time_bound->leave(s);
    }
    cand.clear();
    for (size_t p = 0; p < frontier.size(); ++p) {
      const State& st = frontier[p];
      for (size_t o = 0; o < opts.size(); ++o) {
        const PlannerOption& opt = opts[o];
        const int64_t r = st.retained + opt.retained;
        const int64_t q = std::max({st.transient, opt.transient, floor});
        if (r + q + rest > room) {
          continue;  // no completion fits (Note [Planner dominance])
        }
        const double c = st.time + opt.time;
        if (bound) {
          // Least time any completion adds.
          const double allowance = limit - c;
          if (time_bound->bound(s + 1, room - r, q, allowance) > allowance) {
            ++result.states_pruned_by_time;
            continue;
          }
        }
        cand.push_back(
            {r, q, c, static_cast<uint32_t>(p), static_cast<uint32_t>(o)});
      }
    }
    result.states_generated += static_cast<int64_t>(cand.size());
    if (cand.size() > std::numeric_limits<uint32_t>::max()) {
      throw ReplayException(
          ErrorKind::kInternal,
          "planner: the Pareto frontier outgrew 2^32 states at segment " +
              std::to_string(s));
    }
    keep.assign(cand.size(), 0);
    if (dominance == PlannerDominance::kSummedMemory) {
      summed_memory_sweep(cand, keep);
    } else {
      pareto_sweep(cand, keep);
    }
    frontier.clear();
    Layer& layer = layers[s];
    for (size_t i = 0; i < cand.size(); ++i) {
      if (keep[i]) {
        layer.parent.push_back(cand[i].parent);
        layer.option.push_back(cand[i].option);
        frontier.push_back(cand[i]);
      }
    }
    result.frontier_sizes.push_back(static_cast<int64_t>(frontier.size()));
    if (frontier.empty()) {
      // Only reachable with the unsafe kSummedMemory rule (the greedy plan
      // of time <= U always survives the exact rule).
      return result;
    }
  }
  // Every surviving state fits (the suffix bounds are 0 after the last
  // segment). Pick by Note [Planner tie-breaking]: time, peak, index.
  size_t best = 0;
  for (size_t i = 1; i < frontier.size(); ++i) {
    const State& a = frontier[i];
    const State& b = frontier[best];
    if (a.time < b.time || (a.time == b.time && a.retained + a.transient <
                                                    b.retained + b.transient)) {
      best = i;
    }
  }
  const State& chosen = frontier[best];
  result.feasible = true;
  result.retained = chosen.retained;
  result.transient = chosen.transient;
  result.peak = persistent_ + chosen.retained + chosen.transient;
  result.time = chosen.time;
  result.choices.assign(n, 0);
  uint32_t index = static_cast<uint32_t>(best);
  for (size_t s = n; s-- > 0;) {
    result.choices[s] = static_cast<int32_t>(layers[s].option[index]);
    index = layers[s].parent[index];
  }
  return result;
}

}  // namespace torch_replay
