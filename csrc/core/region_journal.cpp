#include "core/region_journal.h"

#include <iterator>
#include <vector>

#include "core/status.h"

namespace torch_replay {

// Bytes that an entry made since the newest pin already holds are not
// recorded again: undo restores each byte from the oldest entry at or after a
// pin, and every pin that exists now is at or before the newest one, so a
// second entry for a byte is never the oldest for any of them (pins made later
// lie after every entry of now). When the newest pin goes, the covered set is
// rebuilt for the new newest pin (coverage_after_unpin_locked): without that,
// a pin left behind by a segment whose backward never runs (a graph kept
// alive) would have each later step's writes recorded again, a copy per step.
int64_t RegionJournal::record(
    StorageKey key, const StorageRef& storage, const RangeSet& in) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pins_.empty() || in.empty()) {
    return -1;
  }
  RangeSet& covered = covered_since_newest_pin_[key];
  const RangeSet ranges = in.subtract(covered);
  if (ranges.empty()) {
    return -1;
  }
  covered.add(ranges);
  if (ranges.ranges().front().begin < 0 ||
      ranges.ranges().back().end > storage.nbytes) {
    throw ReplayException(
        ErrorKind::kInternal, "journal: byte range outside its storage");
  }
  auto blob = storage.device->gather(storage.base, ranges);
  bytes_ += blob->nbytes();
  entries_.push_back({next_seq_, key, ranges, std::move(blob)});
  return next_seq_++;
}

void RegionJournal::watch(StorageKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++watched_[key];
}

void RegionJournal::unwatch(StorageKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = watched_.find(key);
  if (it == watched_.end()) {
    throw ReplayException(
        ErrorKind::kInternal, "journal: unwatch of an unwatched storage");
  }
  if (--it->second == 0) {
    watched_.erase(it);
    if (marks_.count(key) == 0) {
      writes_shown_.erase(key);
    }
  }
}

bool RegionJournal::watched(StorageKey key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watched_.count(key) > 0 || marks_.count(key) > 0;
}

bool RegionJournal::watching_any() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !watched_.empty() || !marks_.empty();
}

int64_t RegionJournal::record_if_watched(
    StorageKey key, const StorageRef& storage, const RangeSet& ranges) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto m = marks_.find(key);
    const bool journaled = watched_.count(key) > 0;
    if (m != marks_.end()) {
      for (auto& [owner, set] : m->second) {
        set.add(ranges);
      }
    }
    if (m != marks_.end() || journaled) {
      ++writes_shown_[key];
    }
    if (!journaled) {
      return -1;
    }
  }
  return record(key, storage, ranges);
}

void RegionJournal::mark(const void* owner, StorageKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  marks_[key].try_emplace(owner);
}

void RegionJournal::unmark(const void* owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = marks_.begin(); it != marks_.end();) {
    it->second.erase(owner);
    if (it->second.empty()) {
      if (watched_.count(it->first) == 0) {
        writes_shown_.erase(it->first);
      }
      it = marks_.erase(it);
    } else {
      ++it;
    }
  }
}

void RegionJournal::count_write(StorageKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (watched_.count(key) > 0 || marks_.count(key) > 0) {
    ++writes_shown_[key];
  }
}

int64_t RegionJournal::writes_shown(StorageKey key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = writes_shown_.find(key);
  return it == writes_shown_.end() ? 0 : it->second;
}

std::set<StorageKey> RegionJournal::keys_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<StorageKey> keys;
  for (const auto& [key, count] : watched_) {
    keys.insert(key);
  }
  for (const auto& [key, owners] : marks_) {
    keys.insert(key);
  }
  for (const Entry& e : entries_) {
    keys.insert(e.key);
  }
  return keys;
}

RangeSet RegionJournal::marked(const void* owner, StorageKey key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto m = marks_.find(key);
  if (m == marks_.end()) {
    return {};
  }
  auto o = m->second.find(owner);
  return o == m->second.end() ? RangeSet() : o->second;
}

int64_t RegionJournal::pin() {
  std::lock_guard<std::mutex> lock(mutex_);
  covered_since_newest_pin_.clear();
  pins_.insert(next_seq_);
  return next_seq_;
}

void RegionJournal::unpin(int64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pins_.find(seq);
  if (it == pins_.end()) {
    throw ReplayException(ErrorKind::kInternal, "journal: unpin of a free pin");
  }
  const bool was_newest = seq == *pins_.rbegin();
  pins_.erase(it);
  trim_locked();
  if (was_newest && !pins_.empty() && *pins_.rbegin() < seq) {
    coverage_after_unpin_locked();
  }
}

// The newest pin is now an older one, N. An entry since N whose bytes an
// earlier entry since N already holds is never the oldest entry covering
// those bytes at or after any pin (every pin is at or before N, so that
// earlier entry lies after it too): undo never reads it, and it is dropped.
// What remains since N is exactly the covered set record() keeps for N.
void RegionJournal::coverage_after_unpin_locked() {
  const int64_t newest = *pins_.rbegin();
  covered_since_newest_pin_.clear();
  // Entries are in sequence order: only the tail since N is looked at, and
  // compacted in place.
  auto first = std::partition_point(
      entries_.begin(), entries_.end(), [newest](const Entry& e) {
        return e.seq < newest;
      });
  auto out = first;
  for (auto e = first; e != entries_.end(); ++e) {
    RangeSet& covered = covered_since_newest_pin_[e->key];
    if (e->ranges.subtract(covered).empty()) {
      bytes_ -= e->old_bytes->nbytes();
      continue;
    }
    covered.add(e->ranges);
    if (out != e) {
      *out = std::move(*e);
    }
    ++out;
  }
  entries_.erase(out, entries_.end());
}

bool RegionJournal::recording() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !pins_.empty();
}

int64_t RegionJournal::end() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_seq_;
}

void RegionJournal::trim_locked() {
  const int64_t keep_from = pins_.empty() ? next_seq_ : *pins_.begin();
  while (!entries_.empty() && entries_.front().seq < keep_from) {
    bytes_ -= entries_.front().old_bytes->nbytes();
    entries_.pop_front();
  }
}

// Undoing newest first writes a byte once per entry that covers it, which is
// quadratic in the number of live versions when writes are dense. The result
// is the same if each byte is written once, from the OLDEST entry at or after
// `seq` that covers it (Note [Region journal]): walk oldest first and write
// only the bytes no older entry has written.
void RegionJournal::undo_to(int64_t seq, const Resolver& resolve) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!entries_.empty() && entries_.front().seq > seq) {
    throw ReplayException(
        ErrorKind::kInternal, "journal: entries needed for undo were dropped");
  }
  std::map<StorageKey, RangeSet> done;
  for (const auto& e : entries_) {
    if (e.seq < seq) {
      continue;
    }
    StorageRef storage = resolve(e.key);
    if (storage.base == nullptr) {
      continue;  // the storage is gone: nothing to restore
    }
    RangeSet& written = done[e.key];
    RangeSet fresh = e.ranges.subtract(written);
    if (fresh.empty()) {
      continue;
    }
    if (fresh == e.ranges) {
      storage.device->scatter(storage.base, e.ranges, *e.old_bytes);
    } else {
      // Offset of each fresh range inside the entry's packed bytes.
      std::vector<int64_t> offsets;
      offsets.reserve(fresh.ranges().size());
      const auto& src = e.ranges.ranges();
      size_t r = 0;
      int64_t packed = 0;
      for (const auto& f : fresh.ranges()) {
        while (src[r].end <= f.begin) {
          packed += src[r].size();
          ++r;
        }
        offsets.push_back(packed + (f.begin - src[r].begin));
      }
      storage.device->scatter_at(storage.base, fresh, *e.old_bytes, offsets);
    }
    written.add(fresh);
  }
}

std::map<StorageKey, RangeSet> RegionJournal::touched_since(int64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<StorageKey, RangeSet> out;
  for (const auto& e : entries_) {
    if (e.seq >= seq) {
      out[e.key].add(e.ranges);
    }
  }
  return out;
}

int64_t RegionJournal::bytes_since(
    int64_t seq, const std::vector<StorageKey>* keys) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& e : entries_) {
    if (e.seq >= seq &&
        (keys == nullptr ||
         std::find(keys->begin(), keys->end(), e.key) != keys->end())) {
      total += e.old_bytes->nbytes();
    }
  }
  return total;
}

int64_t RegionJournal::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

int64_t RegionJournal::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

RegionJournal& RegionJournal::global() {
  static RegionJournal journal;
  return journal;
}

}  // namespace torch_replay
