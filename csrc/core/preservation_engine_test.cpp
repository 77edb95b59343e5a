#include "core/preservation_engine.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/byte_testing.h"
#include "core/status.h"

namespace torch_replay {
namespace {

// Three storages of raw bytes, keys 1..3, all declared.
struct Memory : HostMemory {
  Memory() : HostMemory({128, 64, 40}) {}
};

struct Touch {
  StorageKey key;
  RangeSet ranges;
  Access access;
};

RangeSet random_ranges(std::mt19937& rng, int64_t size) {
  std::uniform_int_distribution<int> nr(1, 2), len(1, 16);
  RangeSet r;
  for (int i = nr(rng); i > 0; --i) {
    int64_t l = std::min<int64_t>(len(rng), size);
    int64_t b = std::uniform_int_distribution<int64_t>(0, size - l)(rng);
    r.add(b, b + l);
  }
  return r;
}

Touch random_touch(std::mt19937& rng, Memory& m, bool writes) {
  std::uniform_int_distribution<int> which(1, 3), kind(0, writes ? 2 : 0);
  Touch t;
  t.key = which(rng);
  t.ranges = random_ranges(rng, static_cast<int64_t>(m.of(t.key).size()));
  t.access = static_cast<Access>(kind(rng));
  return t;
}

void scribble(Memory& m, const Touch& t, std::mt19937& rng) {
  auto& v = m.of(t.key);
  for (const auto& r : t.ranges.ranges()) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      v[i] = static_cast<uint8_t>(rng());
    }
  }
}

// Bytes of `m` over the regions a segment accessed.
std::vector<uint8_t> over(
    Memory& m, const std::vector<Touch>& touches, bool exposed_only) {
  std::vector<uint8_t> out;
  std::vector<RangeSet> written(3);
  for (const Touch& t : touches) {
    RangeSet r = t.ranges;
    if (exposed_only) {
      r = t.access == Access::kWrite ? RangeSet()
                                     : r.subtract(written[t.key - 1]);
    }
    for (const auto& x : r.ranges()) {
      const auto& v = m.of(t.key);
      out.insert(out.end(), v.begin() + x.begin, v.begin() + x.end);
    }
    if (t.access != Access::kRead) {
      written[t.key - 1].add(t.ranges);
    }
  }
  return out;
}

// Segments, each under its own engine, accessing and writing declared
// storages; more writes between the segments and after the last one (the
// training loop), each recorded through the journal's watch first. Then,
// newest segment first, the re-run protocol: save the live bytes, restore
// B0, compare with the bytes the forward saw, put the live bytes back.
//
// Under Proof::kWriteMarks the guard refuses when a write shown to the
// journal touched an exposed read after the read (`marked`, tracked here from
// the writes themselves): always when the bytes changed, and only then or
// when a write left them as they were.
void check_engine(
    EngineKind kind, bool writes_in_segments, Proof proof = Proof::kHashes) {
  std::mt19937 rng(
      static_cast<unsigned>(kind) * 7919 + writes_in_segments +
      (proof == Proof::kWriteMarks ? 104729 : 0));
  for (int trial = 0; trial < 200; ++trial) {
    Memory m;
    for (auto& v : m.bytes) {
      for (auto& b : v) {
        b = static_cast<uint8_t>(rng());
      }
    }
    RegionJournal journal;
    std::vector<std::unique_ptr<PreservationEngine>> engines;
    std::vector<std::vector<Touch>> touches;
    std::vector<Memory> start;
    // Every write (storage, ranges), in order, and per segment its exposed
    // reads with the number of writes made before each.
    std::vector<std::pair<StorageKey, RangeSet>> writes;
    std::vector<std::vector<std::tuple<StorageKey, RangeSet, size_t>>> exposed;
    auto outside_write = [&] {
      Touch t = random_touch(rng, m, true);
      journal.record_if_watched(t.key, m.ref(t.key), t.ranges);
      scribble(m, t, rng);
      writes.emplace_back(t.key, t.ranges);
    };
    auto marked = [&](int s) {
      for (const auto& [key, ranges, before] : exposed[s]) {
        for (size_t w = before; w < writes.size(); ++w) {
          if (writes[w].first == key && writes[w].second.overlaps(ranges)) {
            return true;
          }
        }
      }
      return false;
    };
    const int segments = 1 + trial % 3;
    for (int s = 0; s < segments; ++s) {
      start.push_back(m);
      engines.push_back(make_engine(kind, journal, proof));
      for (StorageKey k = 1; k <= 3; ++k) {
        engines.back()->declare(k, m.ref(k));
      }
      touches.emplace_back();
      exposed.emplace_back();
      std::vector<RangeSet> written_here(3);
      for (int i = 0; i < 4; ++i) {
        Touch t = random_touch(rng, m, writes_in_segments);
        engines.back()->access(t.key, m.ref(t.key), t.ranges, t.access);
        if (t.access != Access::kWrite) {
          exposed.back().emplace_back(
              t.key, t.ranges.subtract(written_here[t.key - 1]), writes.size());
        }
        if (t.access != Access::kRead) {
          journal.record_if_watched(t.key, m.ref(t.key), t.ranges);
          scribble(m, t, rng);
          writes.emplace_back(t.key, t.ranges);
          written_here[t.key - 1].add(t.ranges);
        }
        touches.back().push_back(t);
      }
      engines.back()->end_forward();
      if (trial % 2) {
        outside_write();
      }
    }
    outside_write();
    const Memory live = m;
    for (int s = segments - 1; s >= 0; --s) {
      RegionStore saved;
      for (const auto& [key, ranges] : engines[s]->restored_regions()) {
        saved.save(key, m.ref(key), ranges);
      }
      const StorageKey bad = engines[s]->restore_start(m.resolver());
      Memory b0 = start[s];
      if (kind == EngineKind::kGuard) {
        const bool changed =
            over(m, touches[s], true) != over(b0, touches[s], true);
        if (proof == Proof::kHashes) {
          // Refuses exactly when an exposed read changed.
          EXPECT_EQ(bad != 0, changed) << "trial " << trial << " segment " << s;
        } else {
          EXPECT_EQ(bad != 0, marked(s)) << "trial " << trial << " seg " << s;
          EXPECT_TRUE(bad != 0 || !changed) << "trial " << trial;
        }
      } else {
        ASSERT_EQ(bad, 0u) << "trial " << trial << " segment " << s;
        EXPECT_EQ(over(m, touches[s], false), over(b0, touches[s], false))
            << engine_name(kind) << " trial " << trial << " segment " << s;
      }
      saved.restore_all(m.resolver());
      EXPECT_EQ(m.bytes, live.bytes)
          << "the live bytes came back, trial " << trial;
    }
    for (auto& e : engines) {
      e->release();
    }
    EXPECT_EQ(journal.bytes(), 0);
    EXPECT_FALSE(journal.watching_any());
  }
}

TEST(PreservationEngineTest, SnapshotRestoresTheForwardsBytes) {
  check_engine(EngineKind::kSnapshot, true);
}
TEST(PreservationEngineTest, ReadsetRestoresTheForwardsBytes) {
  check_engine(EngineKind::kReadset, true);
}
TEST(PreservationEngineTest, JournalRestoresTheForwardsBytes) {
  check_engine(EngineKind::kJournal, true);
}
TEST(PreservationEngineTest, AutoRestoresTheForwardsBytes) {
  check_engine(EngineKind::kAuto, true);
}
TEST(PreservationEngineTest, GuardRefusesExactlyWhenAnExposedReadChanged) {
  check_engine(EngineKind::kGuard, true);
  check_engine(EngineKind::kGuard, false);
}
TEST(
    PreservationEngineTest,
    GuardByWriteMarksRefusesWhenAnExposedReadWasWritten) {
  check_engine(EngineKind::kGuard, true, Proof::kWriteMarks);
  check_engine(EngineKind::kGuard, false, Proof::kWriteMarks);
}
TEST(PreservationEngineTest, EnginesByWriteMarksRestoreTheForwardsBytes) {
  for (EngineKind kind :
       {EngineKind::kJournal,
        EngineKind::kAuto,
        EngineKind::kSnapshot,
        EngineKind::kReadset}) {
    check_engine(kind, true, Proof::kWriteMarks);
    check_engine(kind, false, Proof::kWriteMarks);
  }
}

// A write nobody shows to the journal (a compiled kernel writing in place,
// the memory of .numpy()): the copying engines still restore their copies,
// under either proof, and put nothing else back.
TEST(PreservationEngineTest, CopyingEnginesRestoreWritesTheJournalNeverSaw) {
  for (EngineKind kind : {EngineKind::kSnapshot, EngineKind::kReadset}) {
    for (Proof proof : {Proof::kHashes, Proof::kWriteMarks}) {
      Memory m;
      for (size_t i = 0; i < m.of(1).size(); ++i) {
        m.of(1)[i] = static_cast<uint8_t>(i);
      }
      const std::vector<uint8_t> start = m.of(1);
      RegionJournal journal;
      auto e = make_engine(kind, journal, proof);
      e->declare(1, m.ref(1));
      RangeSet read = ranges({{8, 40}});
      e->access(1, m.ref(1), read, Access::kRead);
      e->end_forward();
      for (auto& b : m.of(1)) {
        b = static_cast<uint8_t>(b ^ 0xff);  // unseen: no record_if_watched
      }
      const auto regions = e->restored_regions();
      ASSERT_EQ(regions.count(1), 1u) << engine_name(kind);
      EXPECT_EQ(e->restore_start(m.resolver()), 0);
      for (int64_t i = 8; i < 40; ++i) {
        EXPECT_EQ(m.of(1)[i], start[i]) << engine_name(kind) << " byte " << i;
      }
      if (kind == EngineKind::kReadset) {  // only what the segment read
        EXPECT_EQ(m.of(1)[0], static_cast<uint8_t>(start[0] ^ 0xff));
      }
      e->release();
    }
  }
}

TEST(PreservationEngineTest, ReadOnlyStateCostsNothingUntilWritten) {
  Memory m;
  RegionJournal journal;
  auto e = make_engine(EngineKind::kAuto, journal);
  e->declare(1, m.ref(1));
  RangeSet r = ranges({{0, 128}});
  e->access(1, m.ref(1), r, Access::kRead);
  e->end_forward();
  EXPECT_EQ(e->kind(), EngineKind::kJournal);
  EXPECT_EQ(e->retained_bytes(), 0);
  RangeSet w = ranges({{8, 24}});
  journal.record_if_watched(1, m.ref(1), w);  // a later write: 16 bytes kept
  EXPECT_EQ(e->retained_bytes(), 16);
  RangeSet other = ranges({{0, 8}});
  journal.record_if_watched(2, m.ref(2), other);  // not watched
  EXPECT_EQ(e->retained_bytes(), 16);
}

TEST(
    PreservationEngineTest, AutoWithoutAccessBecomesTheGuardAndWatchesNothing) {
  Memory m;
  RegionJournal journal;
  auto e = make_engine(EngineKind::kAuto, journal);
  e->declare(1, m.ref(1));
  EXPECT_TRUE(journal.watching_any());
  e->end_forward();
  EXPECT_EQ(e->kind(), EngineKind::kGuard);
  EXPECT_FALSE(journal.watching_any());
  EXPECT_FALSE(journal.recording());
}

TEST(PreservationEngineTest, RollbackPutsBackWhatTheForwardWrote) {
  for (EngineKind kind :
       {EngineKind::kSnapshot,
        EngineKind::kJournal,
        EngineKind::kReadset,
        EngineKind::kGuard,
        EngineKind::kAuto}) {
    std::mt19937 rng(5);
    Memory m;
    const Memory before = m;
    RegionJournal journal;
    auto e = make_engine(kind, journal);
    for (StorageKey k = 1; k <= 3; ++k) {
      e->declare(k, m.ref(k));
    }
    for (int i = 0; i < 6; ++i) {
      Touch t = random_touch(rng, m, true);
      e->access(t.key, m.ref(t.key), t.ranges, t.access);
      if (t.access != Access::kRead) {
        journal.record_if_watched(t.key, m.ref(t.key), t.ranges);
        scribble(m, t, rng);
      }
    }
    e->rollback(m.resolver());
    EXPECT_EQ(m.bytes, before.bytes) << engine_name(kind);
  }
}

TEST(PreservationEngineTest, NamesAreDefinedOnce) {
  for (size_t i = 0; i < engine_names().size(); ++i) {
    EXPECT_EQ(parse_engine(engine_names()[i]), static_cast<EngineKind>(i));
  }
  EXPECT_THROW(parse_engine("bogus"), ReplayException);
}

}  // namespace
}  // namespace torch_replay
