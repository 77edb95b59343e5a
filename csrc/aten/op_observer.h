#pragma once

// Note [C++ observer]
// Every operator a checkpointed segment runs is shown to its Transaction
// (Note [Replay protocol]) by a thread-local RecordFunction callback of the
// dispatcher, with the facts the Transaction needs (aten/operator_facts.h):
// the tensor arguments, which of them the operator writes (the schema's
// `Tensor(a!)`, plus the undeclared running-statistics writes of batch norm
// in training), whether it draws random numbers (tag
// `nondeterministic_seeded`) and from which explicit generator, and the
// tensors it returns.
//
//   * Scope: observer_push / observer_pop bracket a segment's forward or
//     re-run on one thread. The callback is registered on the thread while
//     its stack is non-empty, so nothing else in the process pays for it.
//     Nested segments stack; an operator is shown to every transaction on
//     the stack, innermost first, except those whose gate is paused (a
//     segment re-run from inside its own forward is observed by a separate
//     transaction; see torch_replay/_replay/nonreentrant.py `_Frame`).
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
//   * Errors: the dispatcher swallows exceptions thrown by RecordFunction
//     callbacks, so a refusal (overlap, integer write on a gradient path, a
//     re-run reading outside the forward's footprint) is kept as the
//     transaction's pending error and raised by the Python scope when it
//     ends. The operator itself then runs, so every access is recorded
//     before any check can refuse, and the caller's rollback restores it.
//   * Built with NDEBUG like torch itself: RecordFunction::inputs() asserts in
//     debug builds of the headers on a flag release builds of torch never set.

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

#include <cstdint>
#include <memory>

namespace torch_replay::aten {

class Transaction;

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
// Whether some transaction observes this thread's operators (the write
// watch leaves what they write to them: Note [Write watch]).
bool observer_active();
// Number of transactions observing on this thread (for tests).
int observer_depth();
// Nesting of the operator being observed on this thread (for tests: 0
// between the segment's operators).
int observer_nesting();
// Operators whose schema facts this thread has cached (for tests: bounded by
// the number of distinct operator overloads).
int64_t observer_known_operators();

}  // namespace torch_replay::aten
