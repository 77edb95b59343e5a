#include "core/region_store.h"

#include "core/status.h"

#include <atomic>
#include <utility>

namespace torch_replay {

namespace {
std::atomic<int64_t>& process_bytes_counter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}
}  // namespace

namespace {

const RangeSet& empty_ranges() {
  static const RangeSet empty;
  return empty;
}

void check_inside(const StorageRef& storage, const RangeSet& ranges) {
  if (!ranges.empty() && (ranges.ranges().front().begin < 0 ||
                          ranges.ranges().back().end > storage.nbytes)) {
    throw ReplayException(
        ErrorKind::kInternal, "byte range outside its storage");
  }
}

}  // namespace

RangeSet RegionStore::save(
    StorageKey key, const StorageRef& storage, const RangeSet& ranges) {
  check_inside(storage, ranges);
  Entry& entry = entries_[key];
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
  auto it = entries_.find(key);
  return it == entries_.end() ? empty_ranges() : it->second.saved;
}

std::vector<StorageKey> RegionStore::keys() const {
  std::vector<StorageKey> out;
  for (const auto& kv : entries_) {
    out.push_back(kv.first);
  }
  return out;
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
  check_inside(storage, ranges);
  Entry& entry = entries_[key];
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
  auto it = entries_.find(key);
  return it == entries_.end() ? empty_ranges() : it->second.ranges;
}

std::vector<StorageKey> FootprintHashes::keys() const {
  std::vector<StorageKey> out;
  for (const auto& kv : entries_) {
    out.push_back(kv.first);
  }
  return out;
}

}  // namespace torch_replay
