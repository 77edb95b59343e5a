#include "core/planner_time_bound.h"

#include <cmath>
#include <limits>
#include <utility>

namespace torch_replay {
namespace planner_detail {

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

EdgeFenwick::EdgeFenwick(const std::vector<HullEdge>& edges)
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

void EdgeFenwick::add(size_t pos, int64_t bytes, double time) {
  for (size_t i = pos + 1; i < bytes_.size(); i += i & (~i + 1)) {
    bytes_[i] += bytes;
    time_[i] += time;
  }
}

double EdgeFenwick::cost(int64_t need) const {
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

SuffixTimeBound::SuffixTimeBound(
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
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
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
      const auto hull = lower_hull(segments[s], [cap](const PlannerOption& o) {
        return o.transient <= cap;
      });
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

void SuffixTimeBound::leave(size_t s) {
  for (Piece& piece : pieces_) {
    for (const Slot& slot : piece.slots[s]) {
      piece.fenwick.add(slot.position, -slot.bytes, -slot.time);
    }
  }
}

double SuffixTimeBound::bound(
    size_t s, int64_t room_left, int64_t q, double stop) const {
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

double SuffixTimeBound::piece_time(
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

}  // namespace planner_detail

using planner_detail::append_edges;
using planner_detail::HullEdge;
using planner_detail::lower_hull;
using planner_detail::sort_edges;
using planner_detail::SuffixTimeBound;

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

double ParetoPlanner::root_lower_bound(int64_t budget) const {
  const int64_t room = budget - persistent_;
  const SuffixTimeBound bound(segments_, suffix_transient_floor_[0], room);
  return bound.bound(
      0,
      room,
      suffix_transient_floor_[0],
      std::numeric_limits<double>::quiet_NaN());
}

}  // namespace torch_replay
