#pragma once

// Helpers shared by the GoogleTests of the byte-level engines (region store,
// preservation engines): host storages to save from and restore into.

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/byte_ranges.h"

#include "core/byte_device.h"
#include "core/region_store.h"

namespace torch_replay {

// The byte ranges [begin, end) given, as one RangeSet.
inline RangeSet ranges(
    std::initializer_list<std::pair<int64_t, int64_t>> spans) {
  RangeSet out;
  for (const auto& [begin, end] : spans) {
    out.add(begin, end);
  }
  return out;
}

// Storages of raw host bytes, keys 1..n (sizes as given); a key can be made
// to resolve to nothing (a storage that is gone).
struct HostMemory {
  explicit HostMemory(const std::vector<size_t>& sizes)
      : gone(sizes.size(), 0) {
    for (size_t n : sizes) {
      bytes.emplace_back(n);
    }
  }
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<char> gone;
  std::vector<uint8_t>& of(StorageKey key) {
    return bytes.at(key - 1);
  }
  StorageRef ref(StorageKey key) {
    auto& v = of(key);
    return {v.data(), static_cast<int64_t>(v.size()), &host_device()};
  }
  Resolver resolver() {
    return
        [this](StorageKey k) { return gone.at(k - 1) ? StorageRef{} : ref(k); };
  }
};

}  // namespace torch_replay
