#pragma once

// Note [Byte devices]
// The preservation engines never look at tensors: they move and hash byte
// ranges of storages through a ByteDevice. The host device below works on
// plain pointers; the ATen adapter supplies one per torch device (CPU memory
// via the host kernels, CUDA memory via the kernels in cuda/). A Blob is
// device memory owned by the engine that holds a gathered copy of ranges.

#include <cstdint>
#include <memory>
#include <vector>

#include "core/byte_ranges.h"

namespace torch_replay {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Hash128& o) const {
    return lo == o.lo && hi == o.hi;
  }
  bool operator!=(const Hash128& o) const {
    return !(*this == o);
  }
};

class Blob {
 public:
  virtual ~Blob() = default;
  virtual int64_t nbytes() const = 0;
};

class ByteDevice {
 public:
  virtual ~ByteDevice() = default;
  // Copies the bytes of `ranges` (offsets from `base`) into a new blob, packed
  // in range order.
  virtual std::unique_ptr<Blob> gather(
      const uint8_t* base, const RangeSet& ranges) = 0;
  // Writes a blob made by gather() with the same `ranges` back to `base`.
  virtual void scatter(
      uint8_t* base, const RangeSet& ranges, const Blob& blob) = 0;
  // Writes part of a blob back: range i of `dst` receives the bytes starting
  // at blob_offsets[i] in `blob`. Precondition: one offset per range, each
  // range's bytes inside the blob.
  virtual void scatter_at(
      uint8_t* base,
      const RangeSet& dst,
      const Blob& blob,
      const std::vector<int64_t>& blob_offsets) = 0;
  // Position-dependent 128-bit hash of the bytes of `ranges`
  // (see hash_ranges in byte_kernels.h: every device computes the same value).
  virtual Hash128 hash(const uint8_t* base, const RangeSet& ranges) = 0;
};

// The device for host (CPU) memory.
ByteDevice& host_device();

}  // namespace torch_replay
