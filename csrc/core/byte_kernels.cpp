#include "core/byte_kernels.h"

#include <cstring>
#include <memory>
#include <vector>

namespace torch_replay {

void gather_ranges(
    const uint8_t* base, const int64_t* ranges, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = ranges[2 * i + 1] - ranges[2 * i];
    std::memcpy(dst, base + ranges[2 * i], len);
    dst += len;
  }
}

void scatter_ranges(
    uint8_t* base, const int64_t* ranges, int64_t n, const uint8_t* src) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = ranges[2 * i + 1] - ranges[2 * i];
    std::memcpy(base + ranges[2 * i], src, len);
    src += len;
  }
}

void scatter_ranges_at(
    uint8_t* base,
    const int64_t* ranges,
    int64_t n,
    const uint8_t* src,
    const int64_t* offsets) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(
        base + ranges[2 * i],
        src + offsets[i],
        ranges[2 * i + 1] - ranges[2 * i]);
  }
}

Hash128 hash_ranges(const uint8_t* base, const int64_t* ranges, int64_t n) {
  constexpr uint64_t k0 = 0xA0761D6478BD642FULL;
  constexpr uint64_t k1 = 0xE7037ED1A0B428DBULL;
  uint64_t lo = 0, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t p = ranges[2 * i];
    const int64_t end = ranges[2 * i + 1];
    for (; p + 8 <= end; p += 8) {
      uint64_t w;
      std::memcpy(&w, base + p, 8);
      lo += splitmix64(w ^ (static_cast<uint64_t>(p) * k0));
      hi += splitmix64(w + (static_cast<uint64_t>(p) * k1));
    }
    if (p < end) {
      uint64_t w = 0;
      std::memcpy(&w, base + p, end - p);
      lo += splitmix64(w ^ (static_cast<uint64_t>(p) * k0));
      hi += splitmix64(w + (static_cast<uint64_t>(p) * k1));
    }
  }
  return {lo, hi};
}

namespace {

std::vector<int64_t> flatten(const RangeSet& ranges) {
  std::vector<int64_t> flat;
  flat.reserve(ranges.ranges().size() * 2);
  for (const auto& r : ranges.ranges()) {
    flat.push_back(r.begin);
    flat.push_back(r.end);
  }
  return flat;
}

class HostBlob final : public Blob {
 public:
  // Uninitialised on purpose: gather() writes every byte, and zero-filling
  // first would double the memory traffic of a snapshot.
  explicit HostBlob(int64_t n)
      : bytes_(new uint8_t[static_cast<size_t>(n)]), n_(n) {}
  int64_t nbytes() const override {
    return n_;
  }
  uint8_t* data() {
    return bytes_.get();
  }
  const uint8_t* data() const {
    return bytes_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  int64_t n_;
};

class HostDevice final : public ByteDevice {
 public:
  std::unique_ptr<Blob> gather(
      const uint8_t* base, const RangeSet& ranges) override {
    auto blob = std::make_unique<HostBlob>(ranges.bytes());
    auto flat = flatten(ranges);
    gather_ranges(base, flat.data(), flat.size() / 2, blob->data());
    return blob;
  }
  void scatter(
      uint8_t* base, const RangeSet& ranges, const Blob& blob) override {
    const auto& host = dynamic_cast<const HostBlob&>(blob);
    auto flat = flatten(ranges);
    scatter_ranges(base, flat.data(), flat.size() / 2, host.data());
  }
  void scatter_at(
      uint8_t* base,
      const RangeSet& dst,
      const Blob& blob,
      const std::vector<int64_t>& blob_offsets) override {
    const auto& host = dynamic_cast<const HostBlob&>(blob);
    auto flat = flatten(dst);
    scatter_ranges_at(
        base, flat.data(), flat.size() / 2, host.data(), blob_offsets.data());
  }
  Hash128 hash(const uint8_t* base, const RangeSet& ranges) override {
    auto flat = flatten(ranges);
    return hash_ranges(base, flat.data(), flat.size() / 2);
  }
};

}  // namespace

ByteDevice& host_device() {
  static HostDevice device;
  return device;
}

}  // namespace torch_replay
