#pragma once

// Byte ranges of a storage: the footprint of strided views, and sets of
// disjoint half-open ranges [begin, end) with union / intersection /
// difference. All offsets are bytes from the start of one storage.

#include <cstdint>
#include <vector>

namespace torch_replay {

struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
  int64_t size() const {
    return end - begin;
  }
  bool operator==(const ByteRange& o) const {
    return begin == o.begin && end == o.end;
  }
};

// A set of bytes kept as sorted, disjoint, non-adjacent ranges.
class RangeSet {
 public:
  RangeSet() = default;
  explicit RangeSet(std::vector<ByteRange> ranges);  // any order, may overlap

  // Adds [begin, end). Precondition: begin <= end (empty ranges are ignored).
  void add(int64_t begin, int64_t end);
  void add(const RangeSet& other);

  RangeSet intersect(const RangeSet& other) const;
  RangeSet subtract(const RangeSet& other) const;
  bool overlaps(const RangeSet& other) const;
  bool contains(const RangeSet& other) const;

  int64_t bytes() const;
  bool empty() const {
    return ranges_.empty();
  }
  const std::vector<ByteRange>& ranges() const {
    return ranges_;
  }
  bool operator==(const RangeSet& o) const {
    return ranges_ == o.ranges_;
  }

 private:
  std::vector<ByteRange> ranges_;
};

// The bytes touched by a strided view of `itemsize`-byte elements starting at
// element `offset` with `sizes` and `strides` (in elements; strides may be
// zero but not negative). When the exact footprint has more than `max_ranges`
// runs, the bounding range is returned instead (a superset) and `*exact` is
// set to false. Throws ReplayException(kInvalidArgument) on negative strides
// or sizes.
RangeSet strided_footprint(
    int64_t offset,
    const std::vector<int64_t>& sizes,
    const std::vector<int64_t>& strides,
    int64_t itemsize,
    int64_t max_ranges = 1 << 16,
    bool* exact = nullptr);

}  // namespace torch_replay
