#include "core/region_journal.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "core/byte_kernels.h"
#include "core/byte_testing.h"

namespace torch_replay {
namespace {

// Two storages of raw bytes; keys 1 and 2.
struct Memory {
  std::vector<uint8_t> a = std::vector<uint8_t>(256);
  std::vector<uint8_t> b = std::vector<uint8_t>(96);
  StorageRef ref(StorageKey key) {
    auto& v = key == 1 ? a : b;
    return {v.data(), static_cast<int64_t>(v.size()), &host_device()};
  }
  Resolver resolver() {
    return [this](StorageKey k) { return ref(k); };
  }
};

// Memory whose storage 1 holds each byte's own index (0, 1, 2, ...).
Memory counting_memory() {
  Memory m;
  for (size_t i = 0; i < m.a.size(); ++i)
    m.a[i] = static_cast<uint8_t>(i);
  return m;
}

// Memory with random bytes in both storages.
Memory random_memory(std::mt19937& rng) {
  Memory m;
  for (auto& x : m.a)
    x = static_cast<uint8_t>(rng());
  for (auto& x : m.b)
    x = static_cast<uint8_t>(rng());
  return m;
}

struct Write {
  StorageKey key;
  RangeSet ranges;
};

Write random_write(std::mt19937& rng, const Memory& m) {
  std::uniform_int_distribution<int> which(1, 2), nr(1, 3), len(1, 24);
  Write w;
  w.key = which(rng);
  int64_t size = w.key == 1 ? m.a.size() : m.b.size();
  for (int i = nr(rng); i > 0; --i) {
    int64_t l = len(rng);
    int64_t b = std::uniform_int_distribution<int64_t>(0, size - l)(rng);
    w.ranges.add(b, b + l);
  }
  return w;
}

void apply(Memory& m, const Write& w, std::mt19937& rng) {
  auto& v = w.key == 1 ? m.a : m.b;
  for (const auto& r : w.ranges.ranges()) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      v[i] = static_cast<uint8_t>(rng());
    }
  }
}

// A sequence of "segments", each pinning its start and doing some writes
// (overlapping regions on two storages). Undoing to any pinned position must
// give exactly the bytes at that point, and redo (saving the live bytes over
// touched_since first) must give back the live state.
TEST(RegionJournalTest, UndoRedoRoundTripsOnRandomWriteSequences) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    RegionJournal journal;
    Memory m = random_memory(rng);
    std::vector<int64_t> pins;
    std::vector<Memory> versions;
    int segments = 1 + trial % 6;
    for (int s = 0; s < segments; ++s) {
      pins.push_back(journal.pin());
      versions.push_back(m);
      int writes = rng() % 5;
      for (int k = 0; k < writes; ++k) {
        Write w = random_write(rng, m);
        journal.record(w.key, m.ref(w.key), w.ranges);
        apply(m, w, rng);
      }
    }
    const Memory live = m;
    // Replay in reverse (as backward does), each time coming back to live.
    for (int s = segments - 1; s >= 0; --s) {
      RegionStore redo;
      for (auto& [key, ranges] : journal.touched_since(pins[s])) {
        redo.save(key, m.ref(key), ranges);
      }
      journal.undo_to(pins[s], m.resolver());
      ASSERT_EQ(m.a, versions[s].a) << "trial " << trial << " segment " << s;
      ASSERT_EQ(m.b, versions[s].b);
      redo.restore_all(m.resolver());
      ASSERT_EQ(m.a, live.a);
      ASSERT_EQ(m.b, live.b);
    }
    for (auto p : pins)
      journal.unpin(p);
    EXPECT_EQ(journal.entries(), 0);
    EXPECT_EQ(journal.bytes(), 0);
  }
}

// Union rule: segment 0 reads region [0,16) and does not write it; segment 1
// overwrites [8,24). Restoring segment 0's start needs segment 1's entry, so
// it must stay while segment 0 is pinned, even after segment 1 unpins.
//
//   bytes:   0 ....... 8 ....... 16 ....... 24
//   seg 0:   [ reads ......... )
//   seg 1:             [ writes .......... )
TEST(RegionJournalTest, EarlierSegmentKeepsLaterSegmentsWrites) {
  RegionJournal journal;
  Memory m = counting_memory();
  const auto original = m.a;
  int64_t p0 = journal.pin();
  int64_t p1 = journal.pin();
  RangeSet w = ranges({{8, 24}});
  journal.record(1, m.ref(1), w);
  std::memset(m.a.data() + 8, 0xFF, 16);
  journal.unpin(p1);  // segment 1 is done (its backward ran)
  EXPECT_EQ(journal.bytes_since(p0), 16);
  journal.undo_to(p0, m.resolver());
  EXPECT_EQ(m.a, original);
  journal.unpin(p0);
  EXPECT_EQ(journal.bytes(), 0);
}

// A byte written again before the next pin keeps only its first old value;
// a pin in between makes the second write's old bytes needed again.
TEST(RegionJournalTest, RecordsEachByteOncePerPinInterval) {
  RegionJournal journal;
  Memory m = counting_memory();
  const auto original = m.a;
  const int64_t p0 = journal.pin();
  RangeSet w = ranges({{8, 24}});
  journal.record(1, m.ref(1), w);
  std::memset(m.a.data() + 8, 0x11, 16);
  RangeSet wider = ranges({{0, 32}});
  journal.record(1, m.ref(1), wider);  // only [0, 8) and [24, 32) are new
  std::memset(m.a.data(), 0x22, 32);
  EXPECT_EQ(journal.bytes(), 32);
  const auto at_p1 = m.a;
  const int64_t p1 = journal.pin();
  journal.record(1, m.ref(1), w);  // needed to undo to p1
  std::memset(m.a.data() + 8, 0x33, 16);
  EXPECT_EQ(journal.bytes(), 48);
  journal.undo_to(p1, m.resolver());
  EXPECT_EQ(m.a, at_p1);
  journal.undo_to(p0, m.resolver());
  EXPECT_EQ(m.a, original);
  journal.unpin(p1);
  journal.unpin(p0);
}

// A pin whose segment never replays (a graph kept alive) stays while later
// segments pin and unpin around writes to the same bytes (a training step
// each): the bytes are kept once, not once per step.
TEST(RegionJournalTest, KeptPinRecordsEachByteOnceAcrossLaterPins) {
  RegionJournal journal;
  Memory m = counting_memory();
  const auto original = m.a;
  const int64_t kept = journal.pin();
  RangeSet w = ranges({{0, 64}});
  for (int step = 0; step < 5; ++step) {
    const int64_t p = journal.pin();
    journal.unpin(p);                // the step's segment: its backward ran
    journal.record(1, m.ref(1), w);  // the optimizer's write
    std::memset(m.a.data(), 0x40 + step, 64);
    EXPECT_EQ(journal.bytes(), 64) << "step " << step;
  }
  journal.undo_to(kept, m.resolver());
  EXPECT_EQ(m.a, original);
  journal.unpin(kept);
  EXPECT_EQ(journal.bytes(), 0);
}

// Pins taken and dropped in random order among random writes (the compaction
// when the newest pin goes): undoing to any live pin gives the bytes it saw.
TEST(RegionJournalTest, UndoToLivePinsUnderRandomUnpinOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    RegionJournal journal;
    Memory m = random_memory(rng);
    std::vector<std::pair<int64_t, Memory>> live;  // pin, bytes at the pin
    for (int step = 0; step < 24; ++step) {
      const int what = static_cast<int>(rng() % 3);
      if (what == 0 || live.empty()) {
        live.emplace_back(journal.pin(), m);
      } else if (what == 1) {
        Write w = random_write(rng, m);
        journal.record(w.key, m.ref(w.key), w.ranges);
        apply(m, w, rng);
      } else {
        const size_t i = rng() % live.size();
        journal.unpin(live[i].first);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      for (const auto& [pin, seen] : live) {
        RegionStore redo;
        for (auto& [key, ranges] : journal.touched_since(pin)) {
          redo.save(key, m.ref(key), ranges);
        }
        const Memory now = m;
        journal.undo_to(pin, m.resolver());
        ASSERT_EQ(m.a, seen.a) << "trial " << trial << " step " << step;
        ASSERT_EQ(m.b, seen.b) << "trial " << trial << " step " << step;
        redo.restore_all(m.resolver());
        ASSERT_EQ(m.a, now.a);
        ASSERT_EQ(m.b, now.b);
      }
    }
    for (const auto& [pin, seen] : live)
      journal.unpin(pin);
    EXPECT_EQ(journal.entries(), 0);
    EXPECT_EQ(journal.bytes(), 0);
  }
}

TEST(RegionJournalTest, RecordsNothingWithoutPins) {
  RegionJournal journal;
  Memory m;
  RangeSet w = ranges({{0, 8}});
  EXPECT_EQ(journal.record(1, m.ref(1), w), -1);
  EXPECT_EQ(journal.entries(), 0);
}

// Typed alias: the same storage seen as float32 and int32. A write through
// the int32 view is journaled by its bytes and undoing it restores the float
// values exactly.
TEST(RegionJournalTest, TypedAliasWriteIsUndoneOnStorageBytes) {
  RegionJournal journal;
  std::vector<float> floats = {1.5f, -2.25f, 3.0f, 0.1f};
  auto* base = reinterpret_cast<uint8_t*>(floats.data());
  StorageRef ref{base, 16, &host_device()};
  Resolver resolve = [&](StorageKey) { return ref; };
  const auto before = floats;
  int64_t p = journal.pin();
  RangeSet int_view_elem_2;  // int32 view, element 2 -> bytes [8, 12)
  int_view_elem_2.add(8, 12);
  journal.record(7, ref, int_view_elem_2);
  int32_t bits = 0x7f800001;  // a NaN pattern written as an integer
  std::memcpy(base + 8, &bits, 4);
  EXPECT_NE(std::memcmp(floats.data(), before.data(), 16), 0);
  journal.undo_to(p, resolve);
  EXPECT_EQ(std::memcmp(floats.data(), before.data(), 16), 0);
  journal.unpin(p);
}

// Note [Unseen writes]: writes are counted per storage while it is watched or
// marked, and forgotten once it is neither; a storage stays in use while an
// entry of the log names it.
TEST(RegionJournalTest, CountsShownWritesWhileWatchedOrMarked) {
  Memory m;
  RegionJournal j;
  RangeSet r = ranges({{0, 8}});
  j.record_if_watched(1, m.ref(1), r);  // neither: not counted
  EXPECT_EQ(j.writes_shown(1), 0);
  j.watch(1);
  const int64_t pin = j.pin();
  j.record_if_watched(1, m.ref(1), r);
  j.record_if_watched(1, m.ref(1), r);  // (same bytes: no entry, still a write)
  EXPECT_EQ(j.writes_shown(1), 2);
  int owner = 0;
  j.mark(&owner, 2);
  j.record_if_watched(2, m.ref(2), r);
  EXPECT_EQ(j.writes_shown(2), 1);
  EXPECT_EQ(j.keys_in_use(), (std::set<StorageKey>{1, 2}));
  j.unmark(&owner);
  EXPECT_EQ(j.writes_shown(2), 0);
  j.unwatch(1);
  EXPECT_EQ(j.writes_shown(1), 0);
  EXPECT_EQ(j.keys_in_use(), (std::set<StorageKey>{1}));  // its entry, pinned
  j.unpin(pin);
  EXPECT_TRUE(j.keys_in_use().empty());
}

TEST(RegionStoreTest, FirstSaveWinsOnOverlap) {
  Memory m;
  std::fill(m.a.begin(), m.a.end(), 1);
  RegionStore store;
  RangeSet r1 = ranges({{0, 10}});
  store.save(1, m.ref(1), r1);
  std::fill(m.a.begin(), m.a.end(), 2);
  RangeSet r2 = ranges({{5, 20}});
  RangeSet fresh = store.save(1, m.ref(1), r2);
  EXPECT_EQ(fresh.bytes(), 10);  // only [10, 20) was new
  std::fill(m.a.begin(), m.a.end(), 3);
  store.restore(1, m.ref(1));
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(m.a[i], 1) << i;
  for (int i = 10; i < 20; ++i)
    EXPECT_EQ(m.a[i], 2) << i;
  EXPECT_EQ(m.a[20], 3);
  EXPECT_EQ(store.bytes(), 20);
}

TEST(FootprintHashesTest, DetectsChangeInsideFootprintOnly) {
  Memory m;
  FootprintHashes hashes;
  RangeSet r = ranges({{3, 9}, {40, 41}});
  hashes.add(1, m.ref(1), r);
  EXPECT_EQ(hashes.first_mismatch(m.resolver()), 0u);
  m.a[100] = 9;
  EXPECT_EQ(hashes.first_mismatch(m.resolver()), 0u);
  m.a[40] = 9;
  EXPECT_EQ(hashes.first_mismatch(m.resolver()), 1u);
}

}  // namespace
}  // namespace torch_replay

namespace torch_replay {
namespace {

// Dense rewrites by many versions: undo writes each byte once (from the
// oldest entry), and the result is the state at the pin. Counts the bytes
// written through a recording device.
class CountingDevice final : public ByteDevice {
 public:
  std::unique_ptr<Blob> gather(const uint8_t* b, const RangeSet& r) override {
    return host_device().gather(b, r);
  }
  void scatter(uint8_t* b, const RangeSet& r, const Blob& blob) override {
    written += r.bytes();
    host_device().scatter(b, r, blob);
  }
  void scatter_at(
      uint8_t* b,
      const RangeSet& r,
      const Blob& blob,
      const std::vector<int64_t>& offsets) override {
    written += r.bytes();
    host_device().scatter_at(b, r, blob, offsets);
  }
  Hash128 hash(const uint8_t* b, const RangeSet& r) override {
    return host_device().hash(b, r);
  }
  int64_t written = 0;
};

TEST(RegionJournalTest, UndoWritesEachByteOnceUnderDenseRewrites) {
  RegionJournal journal;
  CountingDevice device;
  std::vector<uint8_t> bytes(64);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(i);
  const auto start = bytes;
  StorageRef ref{bytes.data(), 64, &device};
  int64_t pin = journal.pin();
  for (int v = 0; v < 16; ++v) {  // 16 versions, each rewriting [8, 56)
    RangeSet w;
    w.add(8 + (v % 3), 56 - (v % 5));
    journal.record(1, ref, w);
    for (const auto& r : w.ranges()) {
      std::fill(
          bytes.begin() + r.begin, bytes.begin() + r.end, uint8_t(200 + v));
    }
  }
  journal.undo_to(pin, [&](StorageKey) { return ref; });
  EXPECT_EQ(bytes, start);
  EXPECT_LE(device.written, 48);  // the union, not 16 x 48
  journal.unpin(pin);
}

}  // namespace
}  // namespace torch_replay
