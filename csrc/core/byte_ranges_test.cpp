#include "core/byte_ranges.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "core/byte_kernels.h"
#include "core/byte_testing.h"
#include "core/status.h"

namespace torch_replay {
namespace {

std::set<int64_t> to_set(const RangeSet& r) {
  std::set<int64_t> out;
  for (const auto& x : r.ranges()) {
    for (int64_t b = x.begin; b < x.end; ++b) {
      out.insert(b);
    }
  }
  return out;
}

RangeSet random_set(std::mt19937& rng, std::set<int64_t>* bits) {
  RangeSet r;
  std::uniform_int_distribution<int> n(0, 5), pos(0, 60), len(0, 8);
  int k = n(rng);
  for (int i = 0; i < k; ++i) {
    int64_t b = pos(rng), e = b + len(rng);
    r.add(b, e);
    for (int64_t x = b; x < e; ++x) {
      bits->insert(x);
    }
  }
  return r;
}

TEST(RangeSetTest, AddMergesOverlappingAndAdjacent) {
  // [0,4) [4,6) -> [0,6); [10,12) separate; [3,11) bridges everything.
  RangeSet r = ranges({{0, 4}, {4, 6}, {10, 12}});
  ASSERT_EQ(r.ranges().size(), 2u);
  EXPECT_EQ(r.bytes(), 8);
  r.add(3, 11);
  ASSERT_EQ(r.ranges().size(), 1u);
  EXPECT_EQ(r.ranges()[0], (ByteRange{0, 12}));
}

TEST(RangeSetTest, SetAlgebraMatchesBruteForce) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    std::set<int64_t> a_bits, b_bits;
    RangeSet a = random_set(rng, &a_bits);
    RangeSet b = random_set(rng, &b_bits);
    std::set<int64_t> inter, diff, uni = a_bits;
    for (auto x : a_bits) {
      (b_bits.count(x) ? inter : diff).insert(x);
    }
    uni.insert(b_bits.begin(), b_bits.end());
    EXPECT_EQ(to_set(a.intersect(b)), inter);
    EXPECT_EQ(to_set(a.subtract(b)), diff);
    RangeSet u = a;
    u.add(b);
    EXPECT_EQ(to_set(u), uni);
    EXPECT_EQ(a.overlaps(b), !inter.empty());
    EXPECT_EQ(
        a.contains(b),
        diff.size() == a_bits.size() - inter.size() &&
            inter.size() == b_bits.size());
    EXPECT_EQ(u.bytes(), static_cast<int64_t>(uni.size()));
  }
}

TEST(StridedFootprintTest, MatchesElementEnumeration) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> ndim(0, 3), size(0, 4), stride(0, 6),
      off(0, 5);
  for (int trial = 0; trial < 3000; ++trial) {
    int d = ndim(rng);
    std::vector<int64_t> sizes(d), strides(d);
    for (int i = 0; i < d; ++i) {
      sizes[i] = size(rng);
      strides[i] = stride(rng);
    }
    int64_t offset = off(rng);
    int64_t itemsize = 1 << (trial % 4);
    // Brute force: every element's bytes.
    std::set<int64_t> expect;
    int64_t numel = 1;
    for (auto s : sizes) {
      numel *= s;
    }
    for (int64_t lin = 0; lin < numel; ++lin) {
      int64_t rem = lin, elem = offset;
      for (int i = d - 1; i >= 0; --i) {
        elem += (rem % sizes[i]) * strides[i];
        rem /= sizes[i];
      }
      for (int64_t b = 0; b < itemsize; ++b) {
        expect.insert(elem * itemsize + b);
      }
    }
    bool exact = false;
    RangeSet got =
        strided_footprint(offset, sizes, strides, itemsize, 1 << 16, &exact);
    EXPECT_TRUE(exact);
    EXPECT_EQ(to_set(got), expect);
  }
}

TEST(StridedFootprintTest, FallsBackToBoundingRange) {
  // A 4x4 view with strides (2, 9) has 16 runs of one element; capped at 4
  // runs it becomes the bounding range, a superset.
  bool exact = true;
  RangeSet got = strided_footprint(2, {4, 4}, {2, 9}, 4, 4, &exact);
  EXPECT_FALSE(exact);
  ASSERT_EQ(got.ranges().size(), 1u);
  EXPECT_EQ(got.ranges()[0], (ByteRange{8, (2 + 3 * 2 + 3 * 9 + 1) * 4}));
}

TEST(StridedFootprintTest, RejectsNegativeStride) {
  EXPECT_THROW(strided_footprint(0, {3}, {-1}, 4), ReplayException);
}

TEST(RangeHashTest, PositionDependentAndDetectsOneBit) {
  std::vector<uint8_t> buf(100, 7);
  int64_t r[] = {3, 50, 60, 97};
  Hash128 h0 = hash_ranges(buf.data(), r, 2);
  buf[40] ^= 1;
  EXPECT_NE(hash_ranges(buf.data(), r, 2), h0);
  buf[40] ^= 1;
  buf[55] ^= 1;  // outside the ranges
  EXPECT_EQ(hash_ranges(buf.data(), r, 2), h0);
  int64_t shifted[] = {4, 51, 61, 98};
  EXPECT_NE(hash_ranges(buf.data(), shifted, 2), h0);
}

}  // namespace
}  // namespace torch_replay
