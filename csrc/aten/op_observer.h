#pragma once

// Note [C++ observer]
// Every operator a checkpointed segment runs is shown to its Transaction
// (Note [Replay protocol]) by a thread-local RecordFunction callback of the
// dispatcher, with the facts the Transaction needs: the tensor arguments,
// which of them the operator writes (the schema's `Tensor(a!)`, plus the
// undeclared running-statistics writes of batch norm in training), whether it
// draws random numbers (tag `nondeterministic_seeded`) and from which
// explicit generator, and the tensors it returns.
//
//   * Scope: observer_push / observer_pop bracket a segment's forward or
//     re-run on one thread. The callback is registered on the thread while
//     its stack is non-empty, so nothing else in the process pays for it.
//     Nested segments stack; an operator is shown to every transaction on
//     the stack, innermost first, except those whose gate is paused (a
//     segment re-run from inside its own forward is observed by a separate
//     transaction; see torch_replay/_replay/api.py `_Frame`).
//   * Which operators: every dispatcher call (RecordScope::FUNCTION),
//     composite operators and the operators they decompose into alike, but
//     not the kernels an autograd kernel redispatches to. Views are skipped:
//     they read no bytes, the operators that use them will. Of an operator
//     nested in another one's implementation, the writes kept are those to
//     what the enclosing operator was given, to declared state and to
//     pre-existing state the segment touched before (see
//     keep_nested_writes): a Python dispatch mode's __torch_dispatch__ runs
//     inside the operator it intercepts and may write a buffer
//     (tests/test_backward_writes.py). A kernel's own temporaries, made
//     without the dispatcher, are none of these, so a storage-changing
//     operator nested in another (the resize_ of linalg_solve's LU) is shown
//     to the transactions only for a storage the enclosing operator was given
//     or pre-existing state; shown for a temporary, it would make the temporary
//     pre-existing state and the kernel's writes to it writes to state. Not
//     seen: a nested write to undeclared state the segment has not touched
//     before it (docs/limits.md).
//
// Note [Alias-annotated composites]
// A schema whose arguments carry a non-writing alias annotation, `Tensor(a)`,
// says the result *may* alias the argument, not that it does: `to`,
// `contiguous`, `reshape`, `type_as`, `flatten`, `expand_as` ... return the
// argument itself (or a view of it) when they can and a fresh copy when they
// cannot, made by an operator they call (`_to_copy`, `clone`,
// `_unsafe_view`). So such an operator is not counted in the nesting at all:
// it reads no bytes itself, and the operators its implementation calls are
// observed as if the segment had called them (depth 0), their reads and
// outputs included. Counting it would hide the copy's read of pre-existing
// state as "the enclosing operator's read" of an operator that recorded
// nothing, and the copy it returns would not be known as made by the segment.
//   * Errors: the dispatcher swallows exceptions thrown by RecordFunction
//     callbacks, so a refusal (overlap, integer write on a gradient path, a
//     re-run reading outside the forward's footprint) is kept as the
//     transaction's pending error and raised by the Python scope when it
//     ends. The operator itself then runs, so every access is recorded
//     before any check can refuse, and the caller's rollback restores it.
//   * Built with NDEBUG like torch itself: RecordFunction::inputs() asserts in
//     debug builds of the headers on a flag release builds of torch never set.

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/region_store.h"

// Note [Write watch]
// A journal-engine segment keeps the old bytes of every destructive write to
// its declared state until its re-run (Note [Region journal]). Writes made
// inside segments are journaled by their transactions; writes made anywhere
// else in the process (the training loop enqueueing into a MoCo queue, an
// optimizer step, a hook, another thread) are journaled by a process-wide
// RecordFunction callback, registered while some journal segment is alive:
// before an operator that declares a write (depth 0, as in Note [C++
// observer]) runs outside any segment, the written bytes of a journaled
// storage are recorded. Its cost, while registered, is the dispatcher's
// boxing of arguments for every operator of the process (about a
// microsecond) plus a lookup per written argument. Writes that bypass the
// dispatcher are not seen; under tr.config.verify="bytes" the re-run's start
// hashes then refuse the replay with StateMutationError naming the tensor.
//   * What is left unwatched: an operator whose schema declares no write (and
//     is not a batch norm) is dismissed after one lookup of its cached facts,
//     without reading its arguments; so are operators run inside a segment
//     (its transactions see them). An operator nested in another one's
//     implementation is looked at like any other: a kernel writes what its
//     operator declares or tensors it made, but the __torch_dispatch__ of a
//     Python dispatch mode or tensor subclass runs inside the enclosing
//     operator and may write anything (tests/test_backward_writes.py, a mode
//     writing a buffer inside the backward's `expand`). The boxing of every
//     operator's arguments cannot be left out: RecordFunction decides it per
//     callback, not per operator, before the callback runs. The watch is
//     needed for as long as a journaled, preserved or guarded segment waits,
//     the backward included (hooks, FSDP's unshard, other threads write then).
//   * Tried and measured, not kept: turning RecordFunction off on the thread
//     for the apply of each of torch's generated derivative formulas (their
//     operators write only the gradients they make), from a BACKWARD_FUNCTION
//     callback. at::enableRecordFunction rebuilds the thread's whole callback
//     cache (a mutex, a copy of the global callbacks, every scope), twice per
//     node, which costs what the skipped operators cost: 211.7 M instructions
//     against 210.6 M without it (a scratch build with the path behind a
//     switch; callgrind, 3 steps of the 6-block d=64 GPT model of
//     `perf_symbols --model gpt-small` under state=[block], engine="guard";
//     torch's checkpoint 176.3 M).
//     The same rebuild runs twice per node anyway (the engine sets its
//     ThreadLocalState per task), and allocates once a global callback is
//     registered: part of the watch's price that no callback can lower.
//   * What the watch costs, by instruction count (callgrind, 3 steps of the
//     same model under detect="preserve", with the watch and with a scratch
//     build that never registered it: 199.6 M against 187.5 M instructions;
//     torch's checkpoint 176.3 M): of the 12.2 M, RecordFunction's own
//     machinery (building the range, running callbacks, rebuilding the
//     callback cache) 3.6 M; the autograd engine naming each node it runs,
//     "autograd::engine::evaluate_function: " + the node's name through an
//     ostringstream, which it does only while some FUNCTION-scope callback is
//     active, 3.0 M; malloc/free 1.9 M; boxing 0.8 M; thread-local lookups
//     0.6 M; this callback 0.8 M; other 1.4 M. No callback can avoid the first
//     five: they happen before it runs, for every operator and node of every
//     thread. A dispatch key with kernels for the writing operators only (a
//     fallthrough for the rest) would cost nothing for the others, but torch
//     has no such key for extensions (TESTING_ONLY_GenericMode says "don't
//     use it for anything real") and a thread-local key would not see the
//     process's other threads.

namespace torch_replay::aten {

class Transaction;

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

// Registers the process-wide write watch (counted: one per live journal
// transaction) / releases one registration.
void write_watch_acquire();
void write_watch_release();

// A switch shared by the observers of one segment (Python sets `paused`).
struct ObserverGate {
  bool paused = false;
};

// Starts showing the current thread's operators to `txn` (innermost).
// Precondition: `txn` and `gate` outlive the matching observer_pop.
void observer_push(Transaction* txn, std::shared_ptr<ObserverGate> gate);
// Stops it. Throws ReplayException(kUnsupported) if `txn` is not the
// innermost observed transaction of this thread (scopes must nest).
void observer_pop(Transaction* txn);
// Note [Observation floor]
// What observing costs before any of torch_replay's code runs: RecordFunction
// builds a range for every operator, boxes its arguments (and, for the
// observer, its results) and calls the callbacks, and while any FUNCTION-scope
// callback is registered the autograd engine also names every node it runs
// through an ostringstream (Note [Write watch]). These two switches register
// callbacks that do nothing with exactly the options of the observer (on this
// thread, inputs and outputs) and of the write watch (process-wide, inputs):
// benchmarks/bench_replay_speed.py times torch's own checkpoint under them,
// the cost no callback body can remove. Counted, like the real ones (a stray
// `off` is ignored); each returns how many `on`s are left. The other ways to
// see operators (a callback given no arguments, one given inputs only, a boxed
// dispatcher fallback on a mode key) are priced by the benchmark alone (Note
// [Other observation floors] in benchmarks/observer_floors.cpp).
int floor_observer(bool on);
int floor_watch(bool on);
// Number of transactions observing on this thread (for tests).
int observer_depth();
// Nesting of the operator being observed on this thread (for tests: 0
// between the segment's operators).
int observer_nesting();
// Operators whose schema facts this thread has cached (for tests: bounded by
// the number of distinct operator overloads).
int64_t observer_known_operators();

}  // namespace torch_replay::aten
