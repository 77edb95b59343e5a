#include "core/region_store.h"

#include "core/status.h"

#include <atomic>
#include <utility>
#include <vector>

namespace torch_replay {

namespace {
std::atomic<int64_t>& process_bytes_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
}  // namespace

namespace {

// The ranges `member` of `key`'s entry, or no ranges when it has none.
template <class Entries, class Entry>
const RangeSet& ranges_of(
    const Entries& entries, StorageKey key, RangeSet Entry::* member) {
  static const RangeSet empty;
  auto it = entries.find(key);
  return it == entries.end() ? empty : it->second.*member;
}

template <class Entries>
std::vector<StorageKey> keys_of(const Entries& entries) {
  std::vector<StorageKey> out;
  out.reserve(entries.size());
  for (const auto& kv : entries) {
    out.push_back(kv.first);
  }
  return out;
}

// `key`'s entry (made when missing), once `ranges` is checked to lie inside
// `storage`: a range outside it leaves `entries` as it was.
template <class Entries>
auto& checked_entry(
    Entries& entries,
    StorageKey key,
    const StorageRef& storage,
    const RangeSet& ranges) {
  if (!ranges.empty() && (ranges.ranges().front().begin < 0 ||
                          ranges.ranges().back().end > storage.nbytes)) {
    throw ReplayException(
        ErrorKind::kInternal, "byte range outside its storage");
  }
  return entries[key];
}

}  // namespace

RangeSet RegionStore::save(
    StorageKey key, const StorageRef& storage, const RangeSet& ranges) {
  Entry& entry = checked_entry(entries_, key, storage, ranges);
  RangeSet fresh = ranges.subtract(entry.saved);
  if (fresh.empty()) {
    return fresh;
  }
  auto blob = storage.device->gather(storage.base, fresh);
  bytes_ += blob->nbytes();
  process_bytes_counter() += blob->nbytes();
  entry.saved.add(fresh);
  entry.pieces.push_back({fresh, std::move(blob)});
  return fresh;
}

void RegionStore::restore(StorageKey key, const StorageRef& storage) const {
  auto it = entries_.find(key);
  if (it == entries_.end() || storage.base == nullptr) {
    return;  // nothing saved, or the storage is gone
  }
  for (const auto& piece : it->second.pieces) {
    storage.device->scatter(storage.base, piece.ranges, *piece.blob);
  }
}

void RegionStore::restore_all(const Resolver& resolve) const {
  for (const auto& [key, entry] : entries_) {
    restore(key, resolve(key));
  }
}

const RangeSet& RegionStore::saved(StorageKey key) const {
  return ranges_of(entries_, key, &Entry::saved);
}

std::vector<StorageKey> RegionStore::keys() const {
  return keys_of(entries_);
}

RegionStore::RegionStore(RegionStore&& other) noexcept
    : entries_(std::move(other.entries_)),
      bytes_(std::exchange(other.bytes_, 0)) {
  other.entries_.clear();
}

RegionStore& RegionStore::operator=(RegionStore&& other) noexcept {
  if (this != &other) {
    clear();
    entries_ = std::move(other.entries_);
    other.entries_.clear();
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

RegionStore::~RegionStore() {
  process_bytes_counter() -= bytes_;
}

int64_t RegionStore::process_bytes() {
  return process_bytes_counter().load();
}

void RegionStore::clear() {
  entries_.clear();
  process_bytes_counter() -= bytes_;
  bytes_ = 0;
}

void FootprintHashes::add(
    StorageKey key, const StorageRef& storage, const RangeSet& ranges) {
  Entry& entry = checked_entry(entries_, key, storage, ranges);
  RangeSet fresh = ranges.subtract(entry.ranges);
  if (fresh.empty()) {
    return;
  }
  entry.pieces.emplace_back(fresh, storage.device->hash(storage.base, fresh));
  entry.ranges.add(fresh);
}

StorageKey FootprintHashes::first_mismatch(const Resolver& resolve) const {
  for (const auto& [key, entry] : entries_) {
    StorageRef storage = resolve(key);
    if (storage.base == nullptr) {
      continue;  // the storage is gone: nothing can read it any more
    }
    for (const auto& [ranges, hash] : entry.pieces) {
      if (storage.device->hash(storage.base, ranges) != hash) {
        return key;
      }
    }
  }
  return 0;
}

const RangeSet& FootprintHashes::ranges(StorageKey key) const {
  return ranges_of(entries_, key, &Entry::ranges);
}

std::vector<StorageKey> FootprintHashes::keys() const {
  return keys_of(entries_);
}

}  // namespace torch_replay
