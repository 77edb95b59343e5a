#pragma once

// What the Transaction needs of a tensor's bytes (Note [Replay protocol]):
// whether it is state at all, its exact byte footprint, a raw reference to
// its storage, version counters, and the registry of storages that journal
// segments declared (to find their bytes when the journal is undone); and
// the key of a storage. Internal to the ATen adapter (transaction*.cpp, the
// operator callbacks, the audit).

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/byte_ranges.h"
#include "core/region_store.h"

namespace torch_replay::aten {

// Address of the tensor's StorageImpl: the key of a storage everywhere (Note
// [Storage keys] in aten/transaction.h).
StorageKey storage_key(const at::Tensor& t);

}  // namespace torch_replay::aten

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

// Note [Transient storages]
// Storages whose bytes another system rebuilds before every use and frees in
// between: FSDP2's unsharded parameters (Note [FSDP traffic] in
// torch_replay/_replay/fsdp.py), all-gathered from their local shard before
// each forward and backward. Preserving such a storage by its own bytes keeps
// what the new allocation held and puts it back as the re-run's start (a
// silently wrong gradient), so detect="preserve" never preserves one: a read
// of it is watched by its version counter instead, as at detect="reads", and
// the local shard is what state= declares. Registered from Python
// (mark_transient_storage); held weakly, so its key is never reused.
void mark_transient_storage(const at::Tensor& t);
bool is_transient_storage(StorageKey key);

StorageRef ref_of(const c10::Storage& storage);
StorageRef resolve_weak(const WeakStorage& weak);

// A Python number wrapped into a tensor for one operator is never state.
bool observable(const at::Tensor& t);
// A tensor that can be declared state: strided, with a storage, perhaps
// still without bytes (an empty buffer; Note [Storage-changing writes]).
bool declarable(const at::Tensor& t);
RangeSet footprint_of(const at::Tensor& t, bool* exact = nullptr);

// Note [Sparse tensors]
// A sparse tensor (COO, CSR, CSC, BSR, BSC) has no storage of its own: its
// bytes are those of its strided parts (indices and values; compressed and
// plain indices and values), which the sparse kernels read without the
// dispatcher. So the Transaction sees an operator's sparse argument or
// result as its parts (both observers pass the sparse tensor itself):
//   * a sparse tensor the segment makes has parts it made;
//   * a read of one that existed before the segment is a read of its parts.
//     The user's handle on them (`a.values()`, `a.indices()`) is an alias
//     with a version counter of its own, so an in-place change through it
//     moves no counter the segment could watch: the parts' bytes are hashed
//     at the first read and checked before the re-run (StateMutationError);
//     with detect="preserve" they are journaled like any read;
//   * a write to one that existed before the segment is refused
//     (UnsupportedReplayError): a sparse write may replace the parts (a new
//     nnz) instead of writing them, and the re-run could not start again
//     from the forward's.
// Declared state must be strided (declare the parts).

// Appends a sparse tensor's strided parts to `parts`; false (nothing
// appended) for a strided tensor.
bool sparse_parts(const at::Tensor& t, std::vector<at::Tensor>* parts);
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
