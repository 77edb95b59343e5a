#pragma once

// Note [Preservation engines]
// How a checkpointed segment gets its start bytes B0 back for the re-run.
// One class per engine, one small interface, no torch: the ATen Transaction
// (csrc/aten/transaction.cpp) drives these classes for the segments users
// run, and the contract interpreter's byte and engine checks
// (csrc/core/contract_checks.cpp) drive the same classes on its byte
// machine, so the `bytes` and `engines` suites test the shipped code.
//
//   engine    keeps, from the forward to the re-run          proves B0 by
//   snapshot  every declared byte, copied at the start         the copy
//   readset   the first-touch bytes of every accessed region   the copy
//   journal   the old bytes of every later write to a          hashes of the
//             declared storage, anywhere (copy-on-write;       accessed regions
//             Note [Region journal], Note [Journal watch])     after the undo,
//                                                              or the undo
//   guard     nothing                                          hashes of the
//                                                              exposed reads,
//                                                              or no write
//                                                              marked on them
// (the second proof of each: Proof::kWriteMarks below).
// `auto` is the journal when the segment accessed declared state (read-only
// state then costs nothing until something writes it) and the guard
// otherwise.
//
// Protocol (the caller's side):
//   declare(k) once per declared storage at the forward's start;
//   before every access of declared bytes in the forward: access(...);
//   before every write of any storage, anywhere:
//     journal.record_if_watched(...) (the journal engine watches its
//     declared storages; the write may be in another segment or outside);
//   end_forward();
//   to re-run: save the live bytes of restored_regions(), restore_start(),
//   re-run, verify, put the live bytes back;
//   after a failed forward: rollback(); release() when done.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/region_journal.h"
#include "core/region_store.h"

namespace torch_replay {

enum class EngineKind : int {
  kAuto = 0,
  kSnapshot = 1,
  kJournal = 2,
  kReadset = 3,
  kGuard = 4,
};

// The user-facing engine names, indexed by EngineKind. Defined here only;
// Python reads them from the extension (torch_replay.ENGINES).
const std::vector<std::string>& engine_names();
std::string engine_name(EngineKind kind);
// Throws ReplayException(kInvalidArgument) naming the valid engines.
EngineKind parse_engine(const std::string& name);

// How an engine that does not keep every byte it needs (the journal after
// its undo, the guard) proves the start bytes B0 at the re-run (Note
// [Verification levels] in csrc/aten/transaction.h):
//   kHashes      hashes of the accessed (journal) or exposed (guard) regions,
//                taken in the forward and compared at the re-run: catches a
//                write that nobody showed to the journal;
//   kWriteMarks  the writes shown to record_if_watched (Note [Write marks]):
//                the guard refuses if one touched an exposed region, the
//                journal trusts its undo. No byte is hashed.
// The copying engines (snapshot, readset) prove nothing: they restore every
// copy at every re-run, under either proof, so they survive writes that
// nobody showed to the journal.
enum class Proof { kHashes, kWriteMarks };

enum class Access {
  kRead,
  kWrite,      // overwritten without being read first
  kReadWrite,  // read, then overwritten (in-place update)
};

class PreservationEngine {
 public:
  virtual ~PreservationEngine() = default;
  PreservationEngine(const PreservationEngine&) = delete;
  PreservationEngine& operator=(const PreservationEngine&) = delete;

  // The engine in effect (auto reports the one it became at end_forward).
  virtual EngineKind kind() const = 0;
  // A storage the caller declared; once per storage, before any access.
  virtual void declare(StorageKey key, const StorageRef& ref) = 0;
  // Before the forward accesses `ranges` of declared storage `key`.
  virtual void access(
      StorageKey key,
      const StorageRef& ref,
      const RangeSet& ranges,
      Access access) = 0;
  // After the forward.
  virtual void end_forward() {}
  // Per storage, the regions restore_start() rewrites: their live bytes
  // must be saved first, to come back to after the re-run.
  virtual std::map<StorageKey, RangeSet> restored_regions() const = 0;
  // Puts the declared bytes the re-run reads back to B0. Returns the key of
  // a storage whose B0 cannot be proved (its bytes then are unspecified and
  // the caller restores the live bytes it saved), or 0.
  virtual StorageKey restore_start(const Resolver& resolve) = 0;
  // After a failed forward: puts back every declared byte it wrote.
  virtual void rollback(const Resolver& resolve) = 0;
  // Bytes kept for this segment (the journal: the log's entries for its
  // declared storages since it started, shared with later segments that
  // declared the same storages).
  virtual int64_t retained_bytes() const = 0;
  // Drops what is kept (and the journal's pin and watches). Idempotent.
  virtual void release() = 0;

 protected:
  PreservationEngine() = default;
};

// `journal`: the log the journal engine pins and watches (the process-wide
// RegionJournal::global() for torch; a private one for the interpreter), and
// where the guard marks its exposed storages under Proof::kWriteMarks.
std::unique_ptr<PreservationEngine> make_engine(
    EngineKind kind, RegionJournal& journal, Proof proof = Proof::kHashes);

}  // namespace torch_replay
