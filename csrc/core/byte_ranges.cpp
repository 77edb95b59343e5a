#include "core/byte_ranges.h"

#include <algorithm>
#include <numeric>

#include "core/status.h"

namespace torch_replay {

RangeSet::RangeSet(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return a.begin < b.begin;
  });
  for (const auto& r : ranges) {
    if (r.end <= r.begin) {
      continue;
    }
    if (!ranges_.empty() && r.begin <= ranges_.back().end) {
      ranges_.back().end = std::max(ranges_.back().end, r.end);
    } else {
      ranges_.push_back(r);
    }
  }
}

void RangeSet::add(int64_t begin, int64_t end) {
  if (end <= begin) {
    return;
  }
  // Fast path: appending after the last range (the common, ordered case).
  if (ranges_.empty() || begin > ranges_.back().end) {
    ranges_.push_back({begin, end});
    return;
  }
  auto first = std::lower_bound(
      ranges_.begin(), ranges_.end(), begin, [](const ByteRange& r, int64_t b) {
        return r.end < b;
      });
  auto last = first;
  ByteRange merged{begin, end};
  while (last != ranges_.end() && last->begin <= end) {
    merged.begin = std::min(merged.begin, last->begin);
    merged.end = std::max(merged.end, last->end);
    ++last;
  }
  auto pos = ranges_.erase(first, last);
  ranges_.insert(pos, merged);
}

void RangeSet::add(const RangeSet& other) {
  if (other.empty()) {
    return;
  }
  std::vector<ByteRange> all;
  all.reserve(ranges_.size() + other.ranges_.size());
  std::merge(
      ranges_.begin(),
      ranges_.end(),
      other.ranges_.begin(),
      other.ranges_.end(),
      std::back_inserter(all),
      [](const auto& a, const auto& b) { return a.begin < b.begin; });
  *this = RangeSet(std::move(all));
}

RangeSet RangeSet::intersect(const RangeSet& other) const {
  RangeSet out;
  size_t i = 0, j = 0;
  const auto& a = ranges_;
  const auto& b = other.ranges_;
  while (i < a.size() && j < b.size()) {
    int64_t lo = std::max(a[i].begin, b[j].begin);
    int64_t hi = std::min(a[i].end, b[j].end);
    if (lo < hi) {
      out.ranges_.push_back({lo, hi});
    }
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

RangeSet RangeSet::subtract(const RangeSet& other) const {
  RangeSet out;
  size_t j = 0;
  const auto& b = other.ranges_;
  for (const auto& r : ranges_) {
    int64_t cur = r.begin;
    while (j < b.size() && b[j].end <= cur) {
      ++j;
    }
    size_t k = j;
    while (k < b.size() && b[k].begin < r.end) {
      if (b[k].begin > cur) {
        out.ranges_.push_back({cur, b[k].begin});
      }
      cur = std::max(cur, b[k].end);
      ++k;
    }
    if (cur < r.end) {
      out.ranges_.push_back({cur, r.end});
    }
  }
  return out;
}

bool RangeSet::overlaps(const RangeSet& other) const {
  size_t i = 0, j = 0;
  const auto& a = ranges_;
  const auto& b = other.ranges_;
  while (i < a.size() && j < b.size()) {
    if (std::max(a[i].begin, b[j].begin) < std::min(a[i].end, b[j].end)) {
      return true;
    }
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

bool RangeSet::contains(const RangeSet& other) const {
  return other.subtract(*this).empty();
}

int64_t RangeSet::bytes() const {
  int64_t total = 0;
  for (const auto& r : ranges_) {
    total += r.size();
  }
  return total;
}

RangeSet strided_footprint(
    int64_t offset,
    const std::vector<int64_t>& sizes,
    const std::vector<int64_t>& strides,
    int64_t itemsize,
    int64_t max_ranges,
    bool* exact) {
  if (exact != nullptr) {
    *exact = true;
  }
  if (sizes.size() != strides.size() || itemsize <= 0 || offset < 0) {
    throw ReplayException(
        ErrorKind::kInvalidArgument, "strided_footprint: malformed view");
  }
  struct Dim {
    int64_t size, stride;
  };
  std::vector<Dim> dims;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0 || strides[d] < 0) {
      throw ReplayException(
          ErrorKind::kInvalidArgument,
          "strided_footprint: negative size or stride");
    }
    if (sizes[d] == 0) {
      return RangeSet();
    }
    if (sizes[d] > 1 && strides[d] > 0) {
      dims.push_back({sizes[d], strides[d]});
    }
  }
  // Innermost (smallest stride) first; fold dimensions that continue a run.
  std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) {
    return a.stride < b.stride;
  });
  int64_t run = 1;  // elements per contiguous run
  size_t first_outer = 0;
  while (first_outer < dims.size() && dims[first_outer].stride == run) {
    run *= dims[first_outer].size;
    ++first_outer;
  }
  int64_t runs = 1;
  int64_t extent = 0;  // in elements, of the last element reached
  for (size_t d = 0; d < dims.size(); ++d) {
    extent += (dims[d].size - 1) * dims[d].stride;
    if (d >= first_outer) {
      runs *= dims[d].size;
    }
  }
  if (runs > max_ranges) {
    if (exact != nullptr) {
      *exact = false;
    }
    RangeSet out;
    out.add(offset * itemsize, (offset + extent + 1) * itemsize);
    return out;
  }
  std::vector<ByteRange> out;
  out.reserve(runs);
  std::vector<int64_t> idx(dims.size(), 0);
  while (true) {
    int64_t start = offset;
    for (size_t d = first_outer; d < dims.size(); ++d) {
      start += idx[d] * dims[d].stride;
    }
    out.push_back({start * itemsize, (start + run) * itemsize});
    size_t d = first_outer;
    for (; d < dims.size(); ++d) {
      if (++idx[d] < dims[d].size) {
        break;
      }
      idx[d] = 0;
    }
    if (d == dims.size()) {
      break;
    }
  }
  return RangeSet(std::move(out));
}

}  // namespace torch_replay
