#pragma once

// Note [Replay protocol]
// A Transaction wraps one checkpointed segment call. It sees every operator
// of the segment through the observer (torch_replay/_replay/observe.py calls
// before_op / after_op), both in the forward and in the replay.
//
// Forward (begin_forward .. end_forward):
//   * declared storages (state=) are preserved by the engine, one class of
//     csrc/core/preservation_engine.h (Note [Preservation engines]): whole
//     snapshot, read-set, copy-on-write journal, guard; `auto` is the journal
//     if the segment touches declared state, the guard otherwise.
//   * undeclared storages that existed before the segment and that it writes
//     (BatchNorm running stats, counters, in-place ops on inputs) are kept
//     like a read-set automatically (their first-touch bytes), so the replay
//     neither sees nor leaves a second update.
//   * generators are tracked from their first use (GeneratorStates).
//   * the end state is recorded: hashes of the touched regions (B_T) and the
//     generator states (R_T).
//   * raw overlapping writes (OverlapError) and float gradients through an
//     integer write (UnsupportedReplayError, Note [Integer writes]) are
//     refused before the op runs; abort_forward then rolls every touched
//     byte and generator back.
//
// Replay (begin_replay .. finish_replay):
//   1. check_unchanged: undeclared tensors the forward saved for backward (or
//      read, when asked) must not have been modified since; else
//      StateMutationError naming them.
//   2. the live bytes L of everything the replay may rewrite are saved, the
//      start bytes B0 and generator states R0 are put back, and the replay
//      runs under the observer, which saves any further live bytes before
//      they are first written and refuses reads outside the forward's
//      footprint (they would not be B0).
//   3. verify_replay: the touched regions must hash to B_T and the generators
//      must be at R_T, else StateMutationError / RngMismatchError.
//   4. finish_replay puts L, the live generator states and the version
//      counters back: the replay is invisible.

// Note [Integer writes]
// An operator that writes a value derived from a tensor requiring grad into
// an integer tensor, and returns that tensor (`ibuf.copy_(x * 10)`, an
// out= variant), cuts the gradient where the user means it to flow: it is
// refused. A write the operator does not return is a side effect (the
// running minimum, scale and zero point a fused fake-quantize observer
// updates, batch norm's running statistics): autograd records no gradient
// into it in eager either, and its value is the same in the re-run, so it
// runs as eager.

#include <ATen/ATen.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <exception>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "aten/generator_state.h"
#include "aten/storage_reshape.h"
#include "core/preservation_engine.h"
#include "core/region_journal.h"
#include "core/region_store.h"
#include "core/status.h"

// Note [Verification levels]
// What proves that the re-run starts from the forward's bytes B0 and ends at
// its bytes B_T (Note [Replay protocol]) without hashing every declared byte
// twice at both ends (the hashes were most of what declared state cost).
// Every dispatcher write is seen: inside a segment by its observer, outside
// by the write watch (Note [Write watch]), and either way it is shown to the
// journal's record_if_watched (Note [Journal watch]). So, by level
// (TransactionOptions::verify_bytes, tr.config.verify):
//   * "dispatcher" (default): the journal's undo is B0 (every dispatcher
//     write to a declared or preserved storage journaled its old bytes); the
//     guard refuses when a write was marked on its exposed reads (Note
//     [Write marks]; the write watch is on while it waits); the copying
//     engines restore all their copies, however the bytes changed. The end
//     state B_T is hashed only where the forward wrote, and where the re-run
//     writes bytes the forward did not, their start bytes (equal to B_T there:
//     the forward left them) are hashed before the write. Only bytes someone
//     writes are hashed.
//   * "bytes": also the accessed (journal) and exposed (guard) regions in
//     the forward and at the re-run, and B_T over the whole footprint: a
//     write that bypassed the dispatcher (the memory of .numpy(), a raw
//     pointer, a compiled kernel writing an input) is caught too.
// Undeclared tensors are checked by version counters at both levels, and
// sparse tensors' parts by hashes (Note [Sparse tensors]).

// Note [Whole reads]
// A layer's declared state is mostly weights that every matrix product of
// the forward reads whole, several times. Once the segment's accesses of a
// declared storage cover all of its bytes, a further read records nothing:
// the footprint already holds every byte; no engine's read is news (the
// snapshot copied all, the readset keeps the first copy, the guard's exposed
// bytes only shrink as the segment writes, the journal's accessed flag and
// start hashes are set); and a re-run's read cannot leave the footprint. So
// such a read is dismissed after one lookup, without computing its
// footprint, as long as the storage has the same data pointer and size it
// had when it was found whole (else the full path runs and checks it).
// Writes always take the full path.

namespace torch_replay::aten {

// Note [Storage keys]
// A storage is keyed by the address of its StorageImpl. An address is reused
// once the StorageImpl is freed, so a transaction holds a weak reference to
// every storage whose key it remembers (pre-existing, made by the segment,
// made by the re-run): a weak reference keeps the StorageImpl's memory (not
// its bytes) allocated, so no later storage can get the same key while the
// transaction remembers it, and its facts never depend on what the allocator
// did.
//
// Pre-existing storages are remembered until the transaction is released.
// Those a run (the forward, or a re-run) made are asked one question only,
// while that run goes on: did an operator of this run make the storage an
// operator is given? So a run forgets them as they die: before each operator
// the segment calls, those that only the transaction still holds (expired)
// are dropped, and the end of the run drops the rest. Forgetting is sound
// because it errs one way only:
//  * a dead storage is never accessed again;
//  * a storage the run makes later at the same address is seen made and
//    remembered again;
//  * one it did not see made there (torch.from_numpy inside the segment)
//    counts as pre-existing, whose reads are watched and whose writes are
//    kept or refused: the cautious side (tests/test_storage_keys.py).
// Why not hold them to the run's end: each held one keeps a small block of
// the heap in use per intermediate tensor, among the blocks the activations
// are freed into and allocated from. On the Llama rows of
// benchmarks/bench_replay_speed.py that cost about a point of the step, none
// of it in torch_replay's code (benchmarks/results/replay_speed.md, "Eighth
// run"); the simulated caches had shown last-level write misses in torch's
// kernels 21% above the observation floor (perf_symbols_cache.md).

struct TransactionOptions {
  std::string engine = "auto";
  bool preserve_rng_state = true;
  // Also watch the version counters of every pre-existing tensor the segment
  // reads (not only those it saves for backward).
  bool watch_reads = false;
  // Preserve every pre-existing tensor the segment reads, declared or not
  // (tr.config.detect = "preserve"): copy-on-write journaling of its
  // storage, as the journal engine does for declared state (Note [Preserved
  // reads]).
  bool preserve_reads = false;
  // Also prove B0 and B_T by hashes of every accessed byte, which catches
  // writes that bypassed the dispatcher (Note [Verification levels]).
  bool verify_bytes = false;
};

// Storages by key, each held weakly (Note [Storage keys]). Open addressing:
// a segment adds one entry per storage its operators make, and a node
// allocated per entry was the largest part of observing an operator.
using StorageMap =
    ska::flat_hash_map<StorageKey, c10::weak_intrusive_ptr<c10::StorageImpl>>;

class Transaction {
 public:
  // `tensors` / `tensor_names`: the declared tensors (a module contributes
  // its buffers and parameters), `generators` / `generator_names`: declared
  // generators. Preconditions: equal lengths; checked by the Python API.
  Transaction(
      TransactionOptions options,
      std::vector<at::Tensor> tensors,
      std::vector<std::string> tensor_names,
      std::vector<at::Generator> generators,
      std::vector<std::string> generator_names);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // ---- forward ----
  // `inputs` are the tensor arguments of the segment; `rng_devices` the
  // non-CPU devices whose default generator is preserved from the start (as
  // torch.utils.checkpoint does for the devices of the arguments).
  void begin_forward(
      const std::vector<at::Tensor>& inputs,
      const std::vector<c10::Device>& rng_devices);
  // Called before each operator with its tensor arguments; `writes[i]` says
  // whether the operator mutates tensors[i]; `random` whether it draws from
  // a generator, `generator` the explicit one if passed.
  // `nested`: the operator runs inside another operator's implementation
  // (Note [C++ observer]); it does not decide what the enclosing operator's
  // outputs are derived from. `returned[i]`: the operator returns
  // tensors[i] (empty: every written tensor counts as returned; Note
  // [Integer writes]).
  void before_op(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool random,
      const std::optional<at::Generator>& generator,
      bool nested = false,
      const std::vector<bool>& returned = {});
  // Called after each operator with its tensor outputs.
  void after_op(const std::vector<at::Tensor>& outputs, bool differentiable);
  // Called before / after an operator that may change what `t` is (resize_,
  // resize_as_, set_; Note [Storage-changing writes]). Several may be
  // pending (an operator's written arguments); after_reshape settles them
  // all. (It takes no tensor: RecordFunction's end callbacks have no inputs.)
  void before_reshape(const at::Tensor& t);
  void after_reshape();
  // The same, for the C++ observer (Note [C++ observer]): an error is kept as
  // the pending error (the first one wins) instead of thrown.
  void observe_before(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool random,
      const std::optional<at::Generator>& generator,
      bool nested,
      const std::vector<bool>& returned) noexcept;
  void observe_after(
      const std::vector<at::Tensor>& outputs, bool differentiable) noexcept;
  void observe_reshape_before(const at::Tensor& t) noexcept;
  void observe_reshape_after() noexcept;
  // A random operator nested inside another operator (its tensors are the
  // kernel's own): only its generator is tracked.
  void observe_random(
      const c10::Device& device,
      const std::optional<at::Generator>& generator) noexcept;
  bool has_pending() const {
    return static_cast<bool>(pending_);
  }
  // Throws the pending error, if any, and clears it.
  void raise_pending();
  // Called by the saved-tensor pack hook (use_reentrant=False).
  void record_saved(const at::Tensor& t);
  void end_forward();
  // Rolls back every byte and generator the forward touched (also after
  // end_forward, as long as no replay ran) and releases the transaction.
  void abort_forward();
  // True if the forward touched declared or pre-existing state or drew
  // random numbers: the replay must then run to the end to be verified.
  // During the forward: whether it has done so yet.
  bool stateful() const;

  // ---- replay ----
  void check_unchanged() const;
  void begin_replay();
  // True if finish_replay will rewrite bytes of t's storage (a recomputed
  // saved tensor aliasing it must then be cloned before finish_replay).
  bool restores(const at::Tensor& t) const;
  // True if t's bytes overlap what the forward wrote: a saved alias of them
  // taken during the replay must be copied at once, since the replay is
  // about to overwrite them as the forward did.
  bool overwritten_later(const at::Tensor& t) const;
  void verify_replay();
  void finish_replay();
  bool in_replay() const {
    return phase_ == Phase::kReplay;
  }

  // ---- introspection ----
  std::string engine() const {
    return engine_name(engine_ ? engine_->kind() : requested_);
  }
  // Bytes kept from forward to replay by the engine (the journal counts the
  // entries recorded since this segment started, shared with later ones).
  int64_t retained_bytes() const;
  // Bytes of the largest live save made around a replay so far.
  // Whether the forward wrote any pre-existing or declared bytes (when not,
  // no saved tensor can be overwritten later: overwritten_later is false).
  bool has_writes() const {
    return !writes_.empty();
  }
  // Whether the replay in progress will put any live bytes back (when not,
  // restores() is false for every tensor).
  bool restores_any() const {
    return live_.bytes() > 0;
  }
  int64_t replay_transient_bytes() const {
    return replay_transient_bytes_;
  }
  // Bytes of declared state touched by the forward, and written by it.
  int64_t footprint_bytes() const;
  int64_t written_bytes() const;
  int64_t declared_bytes() const;
  std::vector<std::string> tracked_generators() const {
    return generators_.names();
  }
  // Name of a declared storage ("" if not declared).
  std::string name_of(StorageKey key) const;
  // name_of(key) in quotes, or `unnamed` when the storage has no name.
  std::string quoted_name(StorageKey key, const char* unnamed) const;
  // Whether `key` is a declared storage, or one that existed before the
  // forward and that the forward has touched so far (begin_forward puts the
  // declared storages among those).
  bool knows_preexisting(StorageKey key) const {
    return external_.count(key) > 0;
  }
  // The key of `t`'s storage if the forward touched it as one that existed
  // before it (a declared storage only if accessed), else 0: the bindings the
  // re-bound-state check keeps (Note [Re-bound state] in
  // torch_replay/_replay/bindings.py).
  uint64_t touched_key(const at::Tensor& t) const;
  // Keys of the storages that existed before the forward and that it
  // touched, sorted: the segment's inputs, the declared storages it read or
  // wrote, and every other pre-existing storage an operator was given. What
  // the two observers must agree on (tests/op_sweep).
  std::vector<StorageKey> touched_storages() const {
    std::vector<StorageKey> keys;
    for (const auto& entry : external_) {
      if (!declared_.count(entry.first) || footprint_.count(entry.first)) {
        keys.push_back(entry.first);
      }
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  enum class Phase { kIdle, kForward, kForwardDone, kReplay, kReleased };
  struct Declared {
    c10::Storage storage;
    std::string name;
    std::vector<at::Tensor> tensors;
  };
  // A tensor whose version counter must not move before the replay. The
  // counter itself is held (it is shared by a base and all its views), so a
  // read through a temporary view stays watched after the view is freed.
  struct Watched {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
    c10::VariableVersion counter;
    int64_t version;
    StorageKey key;
  };
  // A pre-existing storage the segment wrote (or preserves). Held weakly
  // (Note [Storage keys]), and also strongly when its memory is not its
  // allocator's (torch.from_numpy, torch.frombuffer, DLPack, from_blob):
  // that memory outlives the storage, and a re-run that wraps it again
  // (a new storage, a key no forward saw) must find the start bytes put back
  // through this one, so this one must not die before the transaction does.
  struct External {
    explicit External(const at::Tensor& t);
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    c10::Storage foreign;
  };

  StorageRef resolve(StorageKey key) const;
  Resolver resolver() const;
  // The guard proves its exposed reads by write marks, which the write
  // watch must see (Note [Verification levels]).
  bool marks_writes() const {
    return requested_ == EngineKind::kGuard && !options_.verify_bytes &&
           !declared_.empty();
  }
  // The resolver of the engines' and implicit restores: storages owned by a
  // ReshapeRecord resolve to nothing (Note [Storage-changing writes]).
  Resolver byte_resolver() const;
  bool reshaped(StorageKey key) const {
    return reshaped_keys_.count(key) > 0;
  }
  // Note [Whole reads]: whether a read of `t` (declared, key `key`) is
  // already recorded; note_whole records that the forward's accesses of it
  // (`seen`, its footprint so far) now cover all of its bytes, if they do.
  bool read_whole(const at::Tensor& t, StorageKey key) const;
  void note_whole(const at::Tensor& t, StorageKey key, const RangeSet& seen);
  void preserve_read(const at::Tensor& t, StorageKey key, const RangeSet& fp);
  // Note [Sparse tensors]: before_op's arguments with sparse tensors as their
  // parts, the parts read hashed; returns the key of a pre-existing one it
  // writes (to refuse), else 0.
  StorageKey expand_sparse(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      const std::vector<bool>& returned,
      std::vector<at::Tensor>* parts,
      std::vector<bool>* part_writes,
      std::vector<bool>* part_returned);
  // before_op of strided arguments, step by step (in this order; each after
  // the one above):
  // Which storage each argument is and whether this run made it (in
  // keys_scratch_ / own_scratch_); in the forward, also records the devices
  // and pre-existing storages seen, and returns whether a float argument it
  // reads carries a gradient (the taint of Note [Integer writes]).
  bool scan_arguments(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool replay);
  // Which generator a random operator draws from (the explicit one, else the
  // default one of its first tensor's device), tracked or marked drawn.
  void note_random_op(
      const std::vector<at::Tensor>& tensors,
      const std::optional<at::Generator>& generator,
      bool replay);
  // Which accesses touch state, recorded with the engines; every one is
  // recorded before the first refusal among them is rethrown.
  void record_accesses(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool replay);
  // Whether a write must be refused: a float gradient carried into an
  // integer tensor (Note [Integer writes]), or a write overlapping another
  // view of its storage.
  void refuse_writes(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      const std::vector<bool>& returned,
      bool tainted_read,
      bool replay);
  void forward_access(
      const at::Tensor& t, StorageKey key, const RangeSet& fp, bool write);
  void replay_access(
      const at::Tensor& t, StorageKey key, const RangeSet& fp, bool write);
  void track_default_generator(const c10::Device& device);
  // Lets go of the storages in `made` (internal_ or replay_internal_) that
  // died (Note [Storage keys]).
  void forget_dead(StorageMap& made);
  void track_random_use(
      const c10::Device& device, const std::optional<at::Generator>& generator);
  // A random operator of the re-run (Note [Generator draws by thread]).
  void note_replay_draw(
      const c10::Device& device, const std::optional<at::Generator>& generator);
  static at::Generator default_generator(const c10::Device& device);
  Watched watch(const at::Tensor& t, StorageKey key);
  // Records t's version counter to put back after a replay.
  void remember_version(const at::Tensor& t);
  void rollback();
  void release();
  [[noreturn]] void fail(
      ErrorKind kind, const std::string& msg, StorageKey key) const;
  void require_phase(bool ok, const char* action) const;
  // Runs f, keeping an exception it throws as the pending error (Note [C++
  // observer]: callbacks of the dispatcher must not throw).
  template <typename F>
  void keep_pending(F&& f) noexcept;

  TransactionOptions options_;
  EngineKind requested_;
  std::unique_ptr<PreservationEngine> engine_;  // from begin_forward
  Phase phase_ = Phase::kIdle;
  std::map<StorageKey, Declared> declared_;
  std::vector<std::pair<at::Generator, std::string>> declared_generators_;
  GeneratorStates generators_;

  // What the forward saw.
  // Storages that existed before the segment and that it touched. The weak
  // references keep their StorageImpl's memory (not its bytes) allocated, so
  // that no storage made later, in the forward or a re-run, can reuse the
  // address that is its key.
  StorageMap external_;
  // Storages the segment made. Weak references too, for the same reason: a
  // storage made and freed inside the forward must not give its key to one
  // the forward did not see made (Note [Storage keys]). Freed by end_forward.
  StorageMap internal_;
  std::map<StorageKey, External> written_external_;
  std::map<StorageKey, RangeSet> footprint_, writes_;
  // Declared storages the forward accessed whole, with their data pointer and
  // size then (Note [Whole reads]).
  struct Whole {
    const void* data;
    int64_t nbytes;
  };
  ska::flat_hash_map<StorageKey, Whole> whole_;
  std::vector<c10::Device> devices_seen_;
  std::vector<Watched> saved_;
  ska::flat_hash_map<c10::TensorImpl*, Watched> reads_;  // by live tensor
  // Reads by tensors freed since, and (at the "saved" level) the segment's
  // tensor arguments.
  std::vector<Watched> reads_of_freed_;
  // Tensors made (in the forward) from values that require grad, which
  // grad mode cannot show when the forward runs under no_grad (reentrant).
  ska::flat_hash_map<
      c10::TensorImpl*,
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>>
      grad_tainted_;
  bool last_op_tainted_ = false;

  // Note [Unseen writes] (csrc/core/region_journal.h): the tensors of the
  // journaled and guarded storages the forward accessed, with their version
  // and the journal's count of writes shown for their storage at the end of
  // the forward. At the re-run, a version that moved more often than writes
  // were shown means a write bypassed the dispatcher (a compiled kernel
  // writing in place): neither the journal's undo nor the guard's marks
  // account for it, and the re-run is refused (copying engines restore
  // their copies whatever happened and need no such check).
  struct Accounted {
    c10::VariableVersion counter;
    int64_t version;
    int64_t shown;
    StorageKey key;
  };
  std::vector<Accounted> accounted_;
  // A tensor of each preserved storage, from its first read, for the above.
  std::vector<std::pair<StorageKey, c10::VariableVersion>> preserved_counters_;
  void record_accounted();
  void check_accounted() const;
  // Drops the journal registry's entries that no journal entry, watch or
  // mark needs any more (they would otherwise accumulate: one per storage a
  // segment ever preserved or declared).
  static void prune_journal_registry();

  // Note [Preserved reads]: with preserve_reads, the pre-existing storages
  // the segment reads are declared, at their first read, to a second journal
  // engine; a later write to them anywhere first journals the old bytes.
  std::unique_ptr<PreservationEngine> reads_engine_;
  std::unordered_set<StorageKey> preserved_;
  // Note [Storage-changing writes]: tensors whose storage the forward
  // resized or replaced, with their start state; the storages they own.
  std::vector<ReshapeRecord> reshaped_;
  std::unordered_set<StorageKey> reshaped_keys_;
  std::vector<ReshapeRecord> reshape_pending_;  // until after_reshape
  FootprintHashes sparse_reads_;  // parts of pre-existing sparse tensors read
  // Pre-existing sparse tensors a refused write was about to change, with
  // their parts: a rollback puts the parts back if the write replaced them.
  std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> sparse_starts_;
  RegionStore implicit_;        // undeclared pre-existing storages written
  FootprintHashes end_hashes_;  // B_T of touched regions

  // Replay bookkeeping.
  // Note [Generators after a failed re-run]: with preserve_rng_state=False the
  // default generators are not tracked, and a re-run draws from them where
  // they are, leaving them advanced, as torch's re-run does. After a re-run
  // that failed (not verified), they are put back where backward found
  // them, so that an error leaves every generator as it was.
  std::vector<std::pair<at::Generator, at::Tensor>> untracked_live_;
  bool replay_verified_ = false;
  RegionStore live_;
  StorageMap replay_internal_;
  std::vector<std::pair<c10::VariableVersion, int64_t>> replay_versions_;
  int64_t replay_transient_bytes_ = 0;
  std::exception_ptr pending_;
  bool watching_writes_ = false;
  std::vector<StorageKey> keys_scratch_;  // before_op's, reused
  std::vector<StorageKey> dead_scratch_;  // forget_dead's, reused
  std::vector<char> own_scratch_;         // before_op's, reused
};

}  // namespace torch_replay::aten
