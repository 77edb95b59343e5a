#pragma once

// Saved bytes of parts of storages, and footprint hashes.
//
// A RegionStore keeps the first-saved bytes of each region: saving a range
// that is already (partly) saved keeps the old bytes for the saved part and
// copies only the rest. It backs the read-set engine (the bytes a segment
// touched, as they were before it touched them), whole snapshots (one range
// covering the storage), and the live-state save that makes a replay
// invisible (see Note [Replay protocol] in csrc/aten/transaction.h).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/byte_device.h"
#include "core/byte_ranges.h"

namespace torch_replay {

// Where a storage's bytes are now. Storages are identified by an opaque key
// (the adapter uses the address of the StorageImpl).
struct StorageRef {
  uint8_t* base = nullptr;
  int64_t nbytes = 0;
  ByteDevice* device = nullptr;
};
using StorageKey = uintptr_t;
using Resolver = std::function<StorageRef(StorageKey)>;

class RegionStore {
 public:
  RegionStore() = default;
  RegionStore(const RegionStore&) = delete;
  RegionStore& operator=(const RegionStore&) = delete;
  RegionStore(RegionStore&& other) noexcept;
  RegionStore& operator=(RegionStore&& other) noexcept;
  ~RegionStore();

  // Bytes held by every RegionStore of the process (engine memory that
  // allocator statistics and live tensor bytes do not show).
  static int64_t process_bytes();

  // Saves the bytes of `ranges` of storage `key` that are not saved yet and
  // returns the ranges newly saved. Precondition: ranges lie inside
  // [0, storage.nbytes).
  RangeSet save(
      StorageKey key, const StorageRef& storage, const RangeSet& ranges);

  // Writes every saved byte of `key` back. No-op for an unknown key.
  void restore(StorageKey key, const StorageRef& storage) const;
  // Writes every saved byte of every storage back.
  void restore_all(const Resolver& resolve) const;

  // The ranges saved for `key` (empty if none).
  const RangeSet& saved(StorageKey key) const;
  std::vector<StorageKey> keys() const;
  int64_t bytes() const {
    return bytes_;
  }
  void clear();

 private:
  struct Piece {
    RangeSet ranges;
    std::unique_ptr<Blob> blob;
  };
  struct Entry {
    RangeSet saved;
    std::vector<Piece> pieces;
  };
  std::map<StorageKey, Entry> entries_;
  int64_t bytes_ = 0;
};

// Hashes of footprints, one per storage, recorded piece by piece as the
// footprint is found (each piece is re-hashed with its own boundaries when
// verified, so pieces need not be aligned).
class FootprintHashes {
 public:
  // Adds the current bytes of `ranges` (minus what is already recorded).
  void add(StorageKey key, const StorageRef& storage, const RangeSet& ranges);
  // The first storage whose current bytes differ from the recorded ones, or
  // 0 if all match.
  StorageKey first_mismatch(const Resolver& resolve) const;
  const RangeSet& ranges(StorageKey key) const;
  std::vector<StorageKey> keys() const;
  bool empty() const {
    return entries_.empty();
  }
  void clear() {
    entries_.clear();
  }

 private:
  struct Entry {
    RangeSet ranges;
    std::vector<std::pair<RangeSet, Hash128>> pieces;
  };
  std::map<StorageKey, Entry> entries_;
};

}  // namespace torch_replay
