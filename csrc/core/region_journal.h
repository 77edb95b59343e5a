#pragma once

// Note [Region journal]
// One process-wide log of destructive writes to declared storages. Before a
// write, the bytes it will overwrite are recorded with their region, in
// program order. A segment that chose the journal pins the log position at
// its start; to replay it, every entry recorded since that position is
// undone newest first, which brings each touched byte back to the value it
// had when the segment started. Because the log is shared, a segment keeps
// (logically) the union of its own destructive writes and those of every
// later segment: exactly what it needs, since a later segment can destroy a
// region this one reads. Entries older than the oldest pin are dropped.
// "Redo" (coming back to the live state after the replay) saves the live
// bytes of the union of regions touched since the position before undoing,
// and writes them back afterwards (RegionStore).

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "core/region_store.h"

namespace torch_replay {

class RegionJournal {
 public:
  RegionJournal() = default;
  RegionJournal(const RegionJournal&) = delete;
  RegionJournal& operator=(const RegionJournal&) = delete;

  // Records the current bytes of `ranges` of storage `key`, which the caller
  // is about to overwrite. Returns the entry's sequence number. Entries are
  // recorded only while some position is pinned (otherwise nobody can need
  // them), and only for bytes no entry since the newest pin holds; -1 is
  // returned when nothing was recorded.
  int64_t record(
      StorageKey key, const StorageRef& storage, const RangeSet& ranges);

  // Pins the current end of the log and returns it.
  int64_t pin();
  // Releases one pin made by pin(). Precondition: `seq` was returned by pin().
  void unpin(int64_t seq);
  bool recording() const;

  // The sequence number the next entry will get.
  int64_t end() const;

  // Undoes every entry with sequence number >= seq, newest first.
  // Precondition: seq is pinned (so no needed entry was dropped).
  void undo_to(int64_t seq, const Resolver& resolve) const;

  // Per storage, the union of regions recorded at or after `seq`.
  std::map<StorageKey, RangeSet> touched_since(int64_t seq) const;
  // Bytes held by entries at or after `seq` (of the storages in `keys`
  // only, when given).
  int64_t bytes_since(
      int64_t seq, const std::vector<StorageKey>* keys = nullptr) const;
  // Bytes held by the whole log.
  int64_t bytes() const;
  int64_t entries() const;

  // Note [Journal watch]
  // The storages whose writes are journaled, with a count of the engines
  // that asked for each (a storage stays watched while any of them lives).
  // Whoever sees a write coming (the segment observer, the write watch
  // outside segments, the contract interpreter) calls record_if_watched
  // first: one rule for every writer.
  void watch(StorageKey key);
  // Precondition: `key` is watched.
  void unwatch(StorageKey key);
  // Whether writes to `key` must be shown to record_if_watched: it is
  // journaled, or some owner marks it (Note [Write marks]).
  bool watched(StorageKey key) const;
  bool watching_any() const;
  // Adds `ranges` to every mark set of `key`; then record() if `key` is
  // journaled. Returns the entry's sequence number or -1.
  int64_t record_if_watched(
      StorageKey key, const StorageRef& storage, const RangeSet& ranges);

  // Note [Write marks]
  // An engine that needs to know only *whether* bytes were written after it
  // looked at them, not what they were (the guard, proving its exposed reads
  // unchanged without hashing them; Note [Verification levels] in
  // csrc/aten/transaction.h), marks the storage: from then on every write
  // shown to record_if_watched adds its ranges to the owner's mark set of
  // that storage, pinned or not, and no byte is kept. A mark set only grows
  // until its owner calls unmark.
  void mark(const void* owner, StorageKey key);
  // Drops every mark set of `owner`. Idempotent.
  void unmark(const void* owner);
  // The ranges of `key` written since `owner` marked it (empty if none).
  RangeSet marked(const void* owner, StorageKey key) const;

  // Note [Unseen writes]
  // How many writes have been shown to record_if_watched for `key` while it
  // was watched or marked (0 once it is neither). A caller that also knows
  // how often the storage's tensors were written by any means (their version
  // counters) learns from the difference that some write bypassed the
  // dispatcher (a compiled kernel writing an input in place) and so reached
  // neither the journal nor a mark set.
  int64_t writes_shown(StorageKey key) const;
  // Counts a write shown without bytes to record (a resize_ of a storage
  // that has none yet), if `key` is watched or marked.
  void count_write(StorageKey key);
  // The storages watched, marked or named by an entry of the log: a resolver
  // must keep finding each (and no other storage under its key).
  std::set<StorageKey> keys_in_use() const;

  // The process-wide journal used by the checkpoint engines.
  static RegionJournal& global();

 private:
  struct Entry {
    int64_t seq;
    StorageKey key;
    RangeSet ranges;
    std::unique_ptr<Blob> old_bytes;
  };
  void trim_locked();
  void coverage_after_unpin_locked();

  mutable std::mutex mutex_;
  std::deque<Entry> entries_;
  std::multiset<int64_t> pins_;
  std::map<StorageKey, int64_t> watched_;
  std::map<StorageKey, std::map<const void*, RangeSet>> marks_;
  std::map<StorageKey, int64_t> writes_shown_;  // Note [Unseen writes]
  // Per storage, the bytes recorded since the newest pin (see record()).
  std::map<StorageKey, RangeSet> covered_since_newest_pin_;
  int64_t next_seq_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace torch_replay
