#include "core/preservation_engine.h"

#include <set>
#include <utility>

#include "core/status.h"

// See Note [Preservation engines] in preservation_engine.h.

namespace torch_replay {

const std::vector<std::string>& engine_names() {
  static const std::vector<std::string> names = {
      "auto", "snapshot", "journal", "readset", "guard"};
  return names;
}

std::string engine_name(EngineKind kind) {
  return engine_names().at(static_cast<size_t>(kind));
}

EngineKind parse_engine(const std::string& name) {
  const auto& names = engine_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) {
      return static_cast<EngineKind>(i);
    }
  }
  std::string valid;
  for (size_t i = 0; i < names.size(); ++i) {
    valid += (i ? ", '" : "'") + names[i] + "'";
  }
  throw ReplayException(
      ErrorKind::kInvalidArgument,
      "engine must be one of " + valid + "; got '" + name + "'");
}

namespace {

// The engines that keep copies in one RegionStore and restore them, all of
// them, at every re-run, under either proof: however the bytes changed since
// the copy (a dispatcher write, a compiled kernel writing in place, the
// memory of .numpy()), the re-run starts from the copy. (Restoring only the
// storages a write was marked on skipped the copy back and forth for
// unwritten state, but trusted every write to be shown to the journal, which
// a write that bypasses the dispatcher never is.)
class CopyingEngine : public PreservationEngine {
 public:
  CopyingEngine() = default;
  std::map<StorageKey, RangeSet> restored_regions() const override {
    std::map<StorageKey, RangeSet> out;
    for (StorageKey key : store_.keys()) {
      out.emplace(key, store_.saved(key));
    }
    return out;
  }
  StorageKey restore_start(const Resolver& resolve) override {
    for (StorageKey key : store_.keys()) {
      store_.restore(key, resolve(key));
    }
    return 0;
  }
  void rollback(const Resolver& resolve) override {
    store_.restore_all(resolve);
  }
  int64_t retained_bytes() const override {
    return store_.bytes();
  }
  void release() override {
    store_.clear();
  }

 protected:
  // Copies `ranges` of `key` (first copy wins).
  void keep(StorageKey key, const StorageRef& ref, const RangeSet& ranges) {
    store_.save(key, ref, ranges);
  }

 private:
  RegionStore store_;
};

// snapshot: every declared byte at the start.
class SnapshotEngine final : public CopyingEngine {
 public:
  using CopyingEngine::CopyingEngine;
  EngineKind kind() const override {
    return EngineKind::kSnapshot;
  }
  void declare(StorageKey key, const StorageRef& ref) override {
    RangeSet all;
    all.add(0, ref.nbytes);
    keep(key, ref, all);
  }
  void access(StorageKey, const StorageRef&, const RangeSet&, Access) override {
  }
};

// readset: the bytes of every accessed region, as they were at first touch.
class ReadsetEngine final : public CopyingEngine {
 public:
  using CopyingEngine::CopyingEngine;
  EngineKind kind() const override {
    return EngineKind::kReadset;
  }
  void declare(StorageKey, const StorageRef&) override {}
  void access(
      StorageKey key,
      const StorageRef& ref,
      const RangeSet& ranges,
      Access) override {
    keep(key, ref, ranges);
  }
};

// guard: nothing; the bytes the segment reads before writing them (its
// exposed reads) must still be B0 at the re-run: their hashes match
// (Proof::kHashes), or no write was marked on them (Proof::kWriteMarks). The
// bytes it writes are kept only until end_forward, to roll a failed forward
// back.
class GuardEngine final : public PreservationEngine {
 public:
  GuardEngine(RegionJournal& journal, Proof proof)
      : journal_(journal), proof_(proof) {}
  ~GuardEngine() override {
    try {
      GuardEngine::release();
    } catch (...) {
    }
  }
  EngineKind kind() const override {
    return EngineKind::kGuard;
  }
  void declare(StorageKey, const StorageRef&) override {}
  void access(
      StorageKey key,
      const StorageRef& ref,
      const RangeSet& ranges,
      Access access) override {
    RangeSet& written = written_[key];
    if (access != Access::kWrite) {
      RangeSet exposed = ranges.subtract(written);
      if (!exposed.empty()) {
        if (proof_ == Proof::kHashes) {
          exposed_.add(key, ref, exposed);
        } else {
          auto [it, fresh] = exposed_ranges_.try_emplace(key);
          if (fresh) {
            journal_.mark(this, key);
          }
          it->second.add(exposed);
        }
      }
    }
    if (access != Access::kRead) {
      rollback_.save(key, ref, ranges);
      written.add(ranges);
    }
  }
  void end_forward() override {
    rollback_.clear();
  }
  std::map<StorageKey, RangeSet> restored_regions() const override {
    return {};
  }
  StorageKey restore_start(const Resolver& resolve) override {
    if (proof_ == Proof::kHashes) {
      return exposed_.first_mismatch(resolve);
    }
    for (const auto& [key, ranges] : exposed_ranges_) {
      if (journal_.marked(this, key).overlaps(ranges)) {
        return key;
      }
    }
    return 0;
  }
  void rollback(const Resolver& resolve) override {
    rollback_.restore_all(resolve);
  }
  int64_t retained_bytes() const override {
    return rollback_.bytes();
  }
  void release() override {
    rollback_.clear();
    exposed_.clear();
    if (!exposed_ranges_.empty()) {
      journal_.unmark(this);
      exposed_ranges_.clear();
    }
  }

 private:
  RegionJournal& journal_;
  Proof proof_;
  FootprintHashes exposed_;                        // Proof::kHashes
  std::map<StorageKey, RangeSet> exposed_ranges_;  // Proof::kWriteMarks
  std::map<StorageKey, RangeSet> written_;
  RegionStore rollback_;
};

// journal: pins the shared log at the start and watches the declared
// storages, so every later write to them, anywhere, first journals the old
// bytes (copy-on-write). The re-run undoes the log down to the pin; with
// Proof::kHashes, hashes of the accessed regions prove B0 (a write that
// bypassed the journal shows there).
class JournalEngine : public PreservationEngine {
 public:
  JournalEngine(RegionJournal& journal, Proof proof)
      : journal_(journal), proof_(proof), pin_(journal.pin()) {}
  ~JournalEngine() override {
    try {
      JournalEngine::release();
    } catch (...) {
    }
  }
  EngineKind kind() const override {
    return EngineKind::kJournal;
  }
  void declare(StorageKey key, const StorageRef&) override {
    journal_.watch(key);
    watched_.push_back(key);
  }
  void access(
      StorageKey key,
      const StorageRef& ref,
      const RangeSet& ranges,
      Access) override {
    accessed_ = true;
    if (proof_ == Proof::kHashes) {
      start_.add(key, ref, ranges);
    }
  }
  std::map<StorageKey, RangeSet> restored_regions() const override {
    return pinned() ? journal_.touched_since(pin_)
                    : std::map<StorageKey, RangeSet>{};
  }
  StorageKey restore_start(const Resolver& resolve) override {
    if (pinned()) {
      journal_.undo_to(pin_, resolve);
    }
    return start_.first_mismatch(resolve);
  }
  void rollback(const Resolver& resolve) override {
    if (pinned()) {
      journal_.undo_to(pin_, resolve);
    }
  }
  // The log's entries for this segment's storages since it started (later
  // segments that declared the same storages share them).
  int64_t retained_bytes() const override {
    return pinned() ? journal_.bytes_since(pin_, &watched_) : 0;
  }
  void release() override {
    for (StorageKey key : watched_) {
      journal_.unwatch(key);
    }
    watched_.clear();
    if (pinned()) {
      journal_.unpin(pin_);
      pin_ = -1;
    }
    start_.clear();
  }

 protected:
  bool pinned() const {
    return pin_ >= 0;
  }
  bool accessed() const {
    return accessed_;
  }

 private:
  RegionJournal& journal_;
  Proof proof_;
  bool accessed_ = false;
  int64_t pin_;
  std::vector<StorageKey> watched_;
  FootprintHashes start_;
};

// auto: the journal, so that read-only declared state costs nothing unless
// something writes it before the re-run; the guard (nothing kept, nothing
// watched) if the forward accessed no declared byte.
class AutoEngine final : public JournalEngine {
 public:
  using JournalEngine::JournalEngine;
  EngineKind kind() const override {
    return kind_;
  }
  void end_forward() override {
    if (!accessed()) {
      kind_ = EngineKind::kGuard;
      release();
    }
  }

 private:
  EngineKind kind_ = EngineKind::kJournal;
};

}  // namespace

std::unique_ptr<PreservationEngine> make_engine(
    EngineKind kind, RegionJournal& journal, Proof proof) {
  switch (kind) {
    case EngineKind::kAuto:
      return std::make_unique<AutoEngine>(journal, proof);
    case EngineKind::kSnapshot:
      return std::make_unique<SnapshotEngine>();
    case EngineKind::kJournal:
      return std::make_unique<JournalEngine>(journal, proof);
    case EngineKind::kReadset:
      return std::make_unique<ReadsetEngine>();
    case EngineKind::kGuard:
      return std::make_unique<GuardEngine>(journal, proof);
  }
  throw ReplayException(ErrorKind::kInternal, "make_engine: unknown engine");
}

}  // namespace torch_replay
