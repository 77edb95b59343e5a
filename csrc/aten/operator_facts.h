#pragma once

// What the operator callbacks of the extension need to know of an operator
// and its arguments, whoever asks: the checkpoint observer (Note [C++
// observer] in aten/op_observer.h), the write watch (Note [Write watch] in
// aten/write_watch.h) and the audit (Note [Audit recorder]). The facts of
// an operator are computed once per schema and cached per thread; the
// helpers below read an operator's arguments with them.

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/region_store.h"

namespace torch_replay::aten {

// What an observer needs to know of an operator, computed once per schema
// (Note [C++ observer]); shared with the audit (Note [Audit recorder]).
struct OpInfo {
  bool op = true;     // an operator with a schema (not an autograd node, ...)
  bool skip = false;  // a view, or not an operator
  bool random = false;
  bool differentiable = true;
  // resize_, resize_as_, set_: may change what argument 0 is (its sizes,
  // storage, storage size; Note [Storage-changing writes]).
  bool reshapes = false;
  std::vector<bool> writes;  // per schema argument
  // Some argument may be written (a declared write, or batch norm's running
  // statistics): the write watch looks at no other operator's arguments.
  bool may_write = false;
  // Argument 0 is written in its metadata or identity only (resize_, set_,
  // t_, detach_): no bytes to journal, but its version counter moves, so the
  // write watch counts it (Note [Unseen writes] in core/region_journal.h).
  bool metadata_write = false;
  // Some argument is a Generator (an explicit generator may be passed).
  bool takes_generator = false;
  // Per schema argument: the operator returns it (its alias set is a
  // result's: in-place and out= variants). A write it does not return is a
  // side effect no gradient flows through (running statistics, observer
  // state; Note [Integer writes]).
  std::vector<bool> returned;
  // Batch norm in training writes its running statistics although its schema
  // does not say so: argument `training_arg` true => `extra` are written.
  int training_arg = -1;
  std::vector<int> extra;
  std::string display;  // "aten.copy_.default", as torch.ops names it
};

// One thread's facts of the operators it has seen, by overload: one cache
// per thread (thread()), shared by the observer, the write watch and the
// audit, whose callbacks each look up every operator they are shown.
class OperatorFacts {
 public:
  // This thread's cache (thread_instance: a plain load per operator, freed
  // when the thread exits).
  static OperatorFacts& thread();

  // The facts of `fn`'s operator (of a range that is no operator: `op` is
  // false).
  const OpInfo& of(const at::RecordFunction& fn) {
    const char* key = fn.name();
    // (Names are heap strings of the dispatcher's operator table: the low
    // bits of their addresses say little, the next ones spread them.)
    CachedInfo& slot =
        cache_[(reinterpret_cast<uintptr_t>(key) >> 4) & (kCacheSlots - 1)];
    if (slot.key == key) {
      return *slot.info;
    }
    return of_uncached(fn, key, slot);
  }
  // Operators whose facts are cached (bounded by the number of distinct
  // operator overloads).
  int64_t size() const {
    return static_cast<int64_t>(infos_.size());
  }

 private:
  struct CachedInfo {
    const char* key = nullptr;
    const OpInfo* info = nullptr;
  };
  static constexpr size_t kCacheSlots = 256;  // (a power of two)

  // The facts of an operator not in the cache (or of a range that is not an
  // operator): out of line, so that the cache's hit path stays a few
  // instructions inlined into every callback (computing the facts takes a
  // large frame).
  const OpInfo& of_uncached(
      const at::RecordFunction& fn, const char* key, CachedInfo& slot);

  // Keyed by the address of the schema's name, unique per overload; open
  // addressing (one probe of a small array per operator, which every callback
  // of every operator makes), the facts themselves never move (frames point
  // to them).
  ska::flat_hash_map<const char*, std::unique_ptr<OpInfo>> infos_;
  // In front of `infos_`, a direct-mapped cache of its entries by the same key
  // (one load and one compare for an operator seen recently: every callback
  // of every operator looks its facts up, the watch's for every operator of
  // the backward). Entries are only operators' (`infos_`'s), never a range
  // named by a string (see of_uncached), so a slot holds a key that `infos_`
  // maps to the same facts for as long as the thread lives.
  std::array<CachedInfo, kCacheSlots> cache_{};
};

// The facts of `fn`'s operator, cached per thread and overload.
const OpInfo& operator_info(const at::RecordFunction& fn);
// Appends the tensors of `v` (a tensor, or a list of them) to `tensors`,
// each with `write` in `writes`.
void flatten_tensors(
    const c10::IValue& v,
    bool write,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes);
// Registers `start` / `end` on the current thread for every dispatcher
// operator (RecordScope::FUNCTION), with its inputs and outputs: what the
// checkpoint observer and the audit recorder both need.
at::CallbackHandle add_operator_callback(
    at::RecordFunctionCallback::StartCallback start,
    at::RecordFunctionCallback::EndCallback end);

// Flattens an operator's arguments into `tensors` / `writes` (which argument
// it writes, the undeclared batch-norm writes included), and its explicit
// generator (if `generator` is not null); with `writes_only`, only the
// written tensors.
// With `returned`, also whether the operator returns each tensor's argument.
void collect_arguments(
    const OpInfo& info,
    c10::ArrayRef<const c10::IValue> inputs,
    bool writes_only,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    std::optional<at::Generator>* generator,
    std::vector<bool>* returned = nullptr);
// True if `t` has bytes an observer tracks (a strided tensor with a storage,
// not a wrapped number); its storage's key in `*key`.
bool observable_key(const at::Tensor& t, StorageKey* key);
// The storages of a depth-0 operator's tensor arguments (`keys`) and those
// of them it declares it writes (`written`).
void top_level_keys(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    std::vector<StorageKey>* keys,
    std::vector<StorageKey>* written);
// An operator nested inside another's implementation works mostly on the
// kernel's own tensors (made without the dispatcher, never seen as created);
// its reads are the enclosing operator's reads, and the writes the enclosing
// operator declares were recorded at its start. Keeps, in place, only its
// writes to storages the enclosing operator was given (`top_keys`) that it
// does not declare (`top_written`): all the pre-existing or declared state a
// kernel can reach (e.g. the running statistics written by the batch norm
// inside instance_norm). Also keeps writes to a storage `known` says is
// declared state or pre-existing state the segment touched before: code a
// Python dispatch mode or tensor subclass runs inside the enclosing operator
// may write any of it. Returns how many are left.
size_t keep_nested_writes(
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    const std::vector<StorageKey>& top_keys,
    const std::vector<StorageKey>& top_written,
    const std::function<bool(StorageKey)>& known = nullptr);
// The device of the first defined tensor (CPU if none): where an operator
// without an explicit generator draws from.
c10::Device first_device(const std::vector<at::Tensor>& tensors);

}  // namespace torch_replay::aten
