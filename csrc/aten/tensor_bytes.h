#pragma once

// What the Transaction needs of a tensor's bytes (Note [Replay protocol]):
// whether it is state at all, its exact byte footprint, a raw reference to
// its storage, version counters, and the registry of storages that journal
// segments declared (to find their bytes when the journal is undone).
// Internal to transaction*.cpp.

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/byte_ranges.h"
#include "core/region_store.h"

namespace torch_replay::aten::detail {

// Footprints with more runs than this are over-approximated by their
// bounding range (Note [Byte devices] users then save a little more).
constexpr int64_t kMaxRuns = 1 << 16;

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// The storages that some journal-engine segment declared, by key, to find
// their bytes when the journal is undone. Which of them are journaled is the
// journal's own watch count (Note [Journal watch]); the weak references keep
// each StorageImpl's memory allocated, so that no later storage reuses a key
// that the journal's entries still name.
struct JournalRegistry {
  std::mutex mutex;
  std::map<StorageKey, WeakStorage> storages;
};
JournalRegistry& journal_registry();
Resolver journal_resolver();

StorageRef ref_of(const c10::Storage& storage);
StorageRef resolve_weak(const WeakStorage& weak);

// A Python number wrapped into a tensor for one operator is never state.
bool observable(const at::Tensor& t);
// A tensor that can be declared state: strided, with a storage, perhaps
// still without bytes (an empty buffer; Note [Storage-changing writes]).
bool declarable(const at::Tensor& t);
RangeSet footprint_of(const at::Tensor& t, bool* exact = nullptr);
bool same_view(const at::Tensor& a, const at::Tensor& b);
std::string describe(const at::Tensor& t);

// The overlap rule for one operator (Note [Replay protocol]): whether the
// written argument `i` has an exact footprint that overlaps another argument
// of the same storage seen through a different view (`keys[j]` is argument
// j's storage key, 0 if it is not state). Used by the Transaction, which
// refuses such an operator, and by the audit, which reports it.
bool overlaps_other_view(
    const std::vector<at::Tensor>& tensors,
    const std::vector<StorageKey>& keys,
    size_t i);

int64_t counter_version(const c10::VariableVersion& counter);
int64_t version_of(c10::TensorImpl* impl);
void set_version_of(c10::TensorImpl* impl, int64_t version);

}  // namespace torch_replay::aten::detail
