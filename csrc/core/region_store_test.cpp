#include "core/region_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "core/byte_testing.h"
#include "core/status.h"

namespace torch_replay {
namespace {

// Three storages of raw bytes, keys 1, 2 and 3.
struct Memory : HostMemory {
  Memory() : HostMemory({40, 64, 17}) {}
};

// Byte-by-byte reference: per storage, the value each byte had when it was
// first saved (or hashed); nothing else.
using ByteModel = std::map<StorageKey, std::map<int64_t, uint8_t>>;

std::vector<char> mask_of(const RangeSet& r, size_t n) {
  std::vector<char> mask(n, 0);
  for (const ByteRange& b : r.ranges()) {
    for (int64_t i = b.begin; i < b.end; ++i) {
      mask.at(i) = 1;
    }
  }
  return mask;
}

std::vector<char> mask_of(const std::map<int64_t, uint8_t>& saved, size_t n) {
  std::vector<char> mask(n, 0);
  for (const auto& [i, v] : saved) {
    mask.at(i) = 1;
  }
  return mask;
}

StorageKey random_key(std::mt19937& rng) {
  return std::uniform_int_distribution<int>(1, 3)(rng);
}

// One to three ranges inside a storage of `size` bytes, not all empty.
RangeSet random_ranges(std::mt19937& rng, int64_t size) {
  RangeSet r;
  while (r.empty()) {
    for (int k = std::uniform_int_distribution<int>(1, 3)(rng); k > 0; --k) {
      const int64_t b =
          std::uniform_int_distribution<int64_t>(0, size - 1)(rng);
      const int64_t e = std::uniform_int_distribution<int64_t>(b, size)(rng);
      r.add(b, e);
    }
  }
  return r;
}

void scribble(std::mt19937& rng, Memory& m) {
  const StorageKey key = random_key(rng);
  auto& v = m.of(key);
  const RangeSet r = random_ranges(rng, static_cast<int64_t>(v.size()));
  for (const ByteRange& b : r.ranges()) {
    for (int64_t i = b.begin; i < b.end; ++i) {
      v[i] = static_cast<uint8_t>(rng());
    }
  }
}

void restore_model(const ByteModel& model, StorageKey key, Memory& m) {
  auto it = model.find(key);
  if (it == model.end()) {
    return;
  }
  for (const auto& [i, v] : it->second) {
    m.of(key)[i] = v;
  }
}

int64_t model_bytes(const ByteModel& model) {
  int64_t n = 0;
  for (const auto& [key, saved] : model) {
    n += static_cast<int64_t>(saved.size());
  }
  return n;
}

TEST(RegionStoreTest, RandomOperationsMatchAByteModel) {
  const int64_t process_start = RegionStore::process_bytes();
  for (int instance = 0; instance < 300; ++instance) {
    std::mt19937 rng(7000 + instance);
    Memory mem;  // what RegionStore restores into
    Memory ref;  // what the byte model restores into
    for (size_t s = 0; s < mem.bytes.size(); ++s) {
      for (auto& x : mem.bytes[s]) {
        x = static_cast<uint8_t>(rng());
      }
    }
    ref.bytes = mem.bytes;
    RegionStore store;
    ByteModel model;
    for (int step = 0; step < 30; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 9)(rng);
      const StorageKey key = random_key(rng);
      const size_t n = mem.of(key).size();
      if (op <= 3) {  // save
        const RangeSet r = random_ranges(rng, static_cast<int64_t>(n));
        const RangeSet fresh = store.save(key, mem.ref(key), r);
        std::vector<char> want(n, 0);
        auto& saved = model[key];
        for (const ByteRange& b : r.ranges()) {
          for (int64_t i = b.begin; i < b.end; ++i) {
            if (saved.emplace(i, ref.of(key)[i]).second) {
              want[i] = 1;
            }
          }
        }
        ASSERT_EQ(mask_of(fresh, n), want) << "instance " << instance;
      } else if (op <= 6) {  // the storages change, in both worlds alike
        std::mt19937 copy = rng;
        scribble(rng, mem);
        scribble(copy, ref);
      } else if (op == 7) {
        store.restore(key, mem.ref(key));
        restore_model(model, key, ref);
      } else if (op == 8) {
        store.restore_all(mem.resolver());
        for (StorageKey k = 1; k <= 3; ++k) {
          restore_model(model, k, ref);
        }
      } else if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
        store.clear();
        model.clear();
      }
      ASSERT_EQ(mem.bytes, ref.bytes) << "instance " << instance;
      ASSERT_EQ(store.bytes(), model_bytes(model)) << "instance " << instance;
      ASSERT_EQ(RegionStore::process_bytes() - process_start, store.bytes());
      std::vector<StorageKey> keys;
      for (StorageKey k = 1; k <= 3; ++k) {
        const size_t size = mem.of(k).size();
        auto it = model.find(k);
        const std::vector<char> want = it == model.end()
                                           ? std::vector<char>(size, 0)
                                           : mask_of(it->second, size);
        ASSERT_EQ(mask_of(store.saved(k), size), want)
            << "instance " << instance;
        if (it != model.end()) {
          keys.push_back(k);
        }
      }
      ASSERT_EQ(store.keys(), keys) << "instance " << instance;
    }
  }
  EXPECT_EQ(RegionStore::process_bytes(), process_start);
}

TEST(RegionStoreTest, RestoreSkipsUnknownKeysAndGoneStorages) {
  Memory m;
  m.of(1).assign(40, 7);
  RegionStore store;
  RangeSet r = ranges({{4, 12}});
  store.save(1, m.ref(1), r);
  m.of(1).assign(40, 9);
  m.gone[0] = 1;
  store.restore_all(m.resolver());  // storage 1 is gone: nothing written
  EXPECT_EQ(m.of(1), std::vector<uint8_t>(40, 9));
  store.restore(2, m.ref(2));  // nothing saved for 2
  EXPECT_EQ(m.of(2), std::vector<uint8_t>(64, 0));
  store.restore(1, m.ref(1));
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(m.of(1)[i], i >= 4 && i < 12 ? 7 : 9) << i;
  }
}

TEST(RegionStoreTest, RangesOutsideTheStorageAreRefusedAndLeaveNoEntry) {
  Memory m;
  RegionStore store;
  FootprintHashes hashes;
  for (auto [b, e] : {std::pair<int64_t, int64_t>{30, 41}, {-1, 3}}) {
    RangeSet r = ranges({{b, e}});
    EXPECT_THROW(store.save(1, m.ref(1), r), ReplayException);
    EXPECT_THROW(hashes.add(1, m.ref(1), r), ReplayException);
  }
  EXPECT_TRUE(store.keys().empty());
  EXPECT_EQ(store.bytes(), 0);
  EXPECT_TRUE(hashes.empty());
}

TEST(RegionStoreTest, MovesCarryTheBytesAndTheProcessCount) {
  const int64_t start = RegionStore::process_bytes();
  Memory m;
  RangeSet r = ranges({{0, 10}});
  {
    RegionStore a;
    a.save(1, m.ref(1), r);
    RegionStore b(std::move(a));
    EXPECT_EQ(b.bytes(), 10);
    EXPECT_EQ(a.bytes(), 0);  // NOLINT(bugprone-use-after-move)
    RegionStore c;
    c.save(2, m.ref(2), r);
    c.save(3, m.ref(3), r);
    EXPECT_EQ(RegionStore::process_bytes() - start, 30);
    c = std::move(b);  // c's own 20 bytes are let go
    EXPECT_EQ(c.bytes(), 10);
    EXPECT_EQ(c.keys(), std::vector<StorageKey>{1});
    EXPECT_EQ(RegionStore::process_bytes() - start, 10);
  }
  EXPECT_EQ(RegionStore::process_bytes(), start);
}

TEST(FootprintHashesTest, RandomOperationsMatchAByteModel) {
  for (int instance = 0; instance < 300; ++instance) {
    std::mt19937 rng(8000 + instance);
    Memory mem;
    for (auto& v : mem.bytes) {
      for (auto& x : v) {
        x = static_cast<uint8_t>(rng());
      }
    }
    FootprintHashes hashes;
    ByteModel model;  // the bytes as first hashed
    for (int step = 0; step < 30; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 9)(rng);
      const StorageKey key = random_key(rng);
      const size_t n = mem.of(key).size();
      if (op <= 3) {
        const RangeSet r = random_ranges(rng, static_cast<int64_t>(n));
        hashes.add(key, mem.ref(key), r);
        for (const ByteRange& b : r.ranges()) {
          for (int64_t i = b.begin; i < b.end; ++i) {
            model[key].emplace(i, mem.of(key)[i]);
          }
        }
      } else if (op <= 5) {  // change one byte, maybe to its own value
        auto& v = mem.of(key);
        const size_t i = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
        v[i] = std::uniform_int_distribution<int>(0, 1)(rng)
                   ? v[i]
                   : static_cast<uint8_t>(v[i] + 1 + rng() % 255);
      } else if (op <= 7) {  // put recorded bytes back
        auto it = model.find(key);
        if (it != model.end()) {
          for (const auto& [i, v] : it->second) {
            mem.of(key)[i] = v;
          }
        }
      } else if (op == 8) {
        mem.gone[key - 1] = !mem.gone[key - 1];
      } else if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
        hashes.clear();
        model.clear();
      }
      // The first storage (in key order) still there whose recorded bytes
      // changed.
      StorageKey want = 0;
      std::vector<StorageKey> keys;
      for (const auto& [k, recorded] : model) {
        keys.push_back(k);
        for (const auto& [i, v] : recorded) {
          if (want == 0 && !mem.gone[k - 1] && mem.of(k)[i] != v) {
            want = k;
          }
        }
        ASSERT_EQ(
            mask_of(hashes.ranges(k), mem.of(k).size()),
            mask_of(recorded, mem.of(k).size()));
      }
      ASSERT_EQ(hashes.first_mismatch(mem.resolver()), want)
          << "instance " << instance << " step " << step;
      ASSERT_EQ(hashes.keys(), keys);
      ASSERT_EQ(hashes.empty(), keys.empty());
    }
  }
}

}  // namespace
}  // namespace torch_replay
