#include "aten/op_observer.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "aten/callback_thread.h"
#include "aten/operator_facts.h"
#include "aten/transaction.h"
#include "core/status.h"

namespace torch_replay::aten {

namespace {

struct Entry {
  Transaction* txn;
  std::shared_ptr<ObserverGate> gate;
};

struct ThreadState : CallbackThread {
  std::vector<Entry> stack;
  std::optional<at::CallbackHandle> handle;
  // Nesting of observed operators: 0 for an operator the segment calls, more
  // for operators called by another operator's implementation.
  int depth = 0;
  // Storages of the tensor arguments of the current depth-0 operator, and
  // those of them it declares it writes.
  std::vector<StorageKey> top_keys;
  std::vector<StorageKey> top_written;
  // The thread's operator facts (made first, so they outlive this state).
  OperatorFacts* const facts = &OperatorFacts::thread();
  // One entry per operator whose start this thread's observer saw and whose
  // end it has not seen yet: its facts if it was counted in `depth`, nullptr
  // if not. RecordFunction calls a callback's end exactly for the starts it
  // called, on the same thread, innermost first, so the ends pop what the
  // starts pushed (no ObserverContext allocated per operator, no second
  // lookup of the facts).
  std::vector<const OpInfo*> frames;
};

ThreadState& state() {
  return thread_instance<ThreadState>();
}

// Pushes `entry` on `frames` for the end callback to pop; pushing never
// throws (RecordFunction swallows a callback's exception, but the stack
// would no longer match the ends): reserved ahead.
void push_frame(std::vector<const OpInfo*>& frames, const OpInfo* entry) {
  if (frames.size() == frames.capacity()) {
    frames.reserve(std::max<size_t>(64, 2 * frames.capacity()));
  }
  frames.push_back(entry);
}

const OpInfo* pop_frame(std::vector<const OpInfo*>& frames) {
  if (frames.empty()) {
    return nullptr;  // (an end whose start ran before the state existed)
  }
  const OpInfo* entry = frames.back();
  frames.pop_back();
  return entry;
}

// Shows a storage-changing operator's argument 0 to the transactions, before
// or after it runs (Note [Storage-changing writes]), at any depth: the
// resize_ an out= kernel makes of its output counts too. (The end callback
// must not read fn.inputs(): the dispatcher frees the boxed arguments once
// the start callbacks ran. The transaction keeps the tensor instead.)
void show_reshape(ThreadState& s, const at::RecordFunction& fn, bool after) {
  const at::Tensor* t = nullptr;
  if (!after) {
    c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
    if (inputs.empty() || !inputs[0].isTensor()) {
      return;
    }
    t = &inputs[0].toTensor();
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      if (after) {
        it->txn->observe_reshape_after();
      } else {
        it->txn->observe_reshape_before(*t);
      }
    }
  }
}

// Whether a transaction observing on this thread declares `key` or knows it
// as a storage that existed before its forward and that the forward touched.
bool known_preexisting(const ThreadState& s, StorageKey key) {
  for (const Entry& e : s.stack) {
    if (!e.gate->paused && e.txn->knows_preexisting(key)) {
      return true;
    }
  }
  return false;
}

// Whether the storage-changing operator `fn`, nested in another one's
// implementation, changes state the segment must put back: a storage the
// enclosing operator was given (its out= argument, resized by the kernel) or
// pre-existing state. A kernel's own temporary (made without being seen as
// created, then resized: linalg_solve's LU) is neither; recording it as
// pre-existing would make the kernel's later writes to it look like writes to
// state (keep_nested_writes).
bool nested_reshape_shown(const ThreadState& s, const at::RecordFunction& fn) {
  c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  StorageKey key = 0;
  if (inputs.empty() || !inputs[0].isTensor() ||
      !observable_key(inputs[0].toTensor(), &key)) {
    return false;
  }
  return std::find(s.top_keys.begin(), s.top_keys.end(), key) !=
             s.top_keys.end() ||
         known_preexisting(s, key);
}

void show_start(
    ThreadState& s,
    const at::RecordFunction& fn,
    const OpInfo& info,
    int depth);

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& s = state();
  // Every start pushes a frame for on_end to pop, first of all (nullptr: not
  // counted, so far).
  push_frame(s.frames, nullptr);
  // (The callback also sees other ranges, autograd nodes and user ranges:
  // only dispatcher operators count.)
  if (s.in_callback || s.stack.empty() ||
      fn.scope() != at::RecordScope::FUNCTION) {
    return nullptr;
  }
  const OpInfo& info = s.facts->of(fn);
  // A view-annotated operator is not counted (Note [Alias-annotated
  // composites]): what its implementation calls is observed as if the
  // segment called it.
  if (!info.op || info.skip) {
    return nullptr;
  }
  s.frames.back() = &info;
  const int depth = s.depth++;
  if (depth > 0 && !info.may_write && !info.random && !info.takes_generator &&
      !info.reshapes) {
    // Inside another operator's implementation, an operator that declares no
    // write, draws nothing and cannot be given a generator has nothing to
    // show (see keep_nested_writes): its arguments are not read.
    return nullptr;
  }
  show_start(s, fn, info, depth);
  return nullptr;
}

// The part of on_start that reads the arguments and shows them to the
// transactions: out of line, so that the checks above, which are all that
// most nested operators cost, run without its large frame.
__attribute__((noinline)) void show_start(
    ThreadState& s,
    const at::RecordFunction& fn,
    const OpInfo& info,
    int depth) {
  CallbackGuard guard(s);
  std::vector<at::Tensor>& tensors = s.tensors;
  std::vector<bool>& writes = s.writes;
  std::optional<at::Generator> generator;
  collect_arguments(
      info,
      fn.inputs(),
      /*writes_only=*/false,
      &tensors,
      &writes,
      &generator,
      &s.returned);
  if (info.reshapes && (depth == 0 || nested_reshape_shown(s, fn))) {
    show_reshape(s, fn, /*after=*/false);
  }
  if (depth == 0) {
    top_level_keys(tensors, writes, &s.top_keys, &s.top_written);
  } else {
    // Inside another operator's implementation (see keep_nested_writes):
    // track the generator a nested random operator draws from, and the
    // writes the enclosing operator does not declare.
    if (info.random || generator.has_value()) {
      const c10::Device device = first_device(tensors);
      for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
        if (!it->gate->paused) {
          it->txn->observe_random(device, generator);
        }
      }
    }
    const size_t kept = keep_nested_writes(
        &tensors, &writes, s.top_keys, s.top_written, [&s](StorageKey key) {
          return known_preexisting(s, key);
        });
    if (kept == 0) {
      return;
    }
    generator.reset();
    s.returned.clear();  // (unknown for the kept writes: all count)
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      it->txn->observe_before(
          tensors,
          writes,
          depth == 0 && info.random,
          generator,
          depth > 0,
          s.returned);
    }
  }
}

void show_outputs(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info);

void on_end(const at::RecordFunction& fn, at::ObserverContext* /*ctx*/) {
  ThreadState& s = state();
  const OpInfo* counted = pop_frame(s.frames);
  if (counted == nullptr) {
    return;  // not counted at its start
  }
  const int depth = --s.depth;
  if (s.in_callback || s.stack.empty()) {
    return;
  }
  const OpInfo& info = *counted;
  if (info.reshapes) {
    CallbackGuard guard(s);
    show_reshape(s, fn, /*after=*/true);
  }
  if (depth > 0) {
    return;  // outputs of nested operators are the enclosing operator's
  }
  show_outputs(s, fn, info);
}

// The part of on_end that shows a depth-0 operator's outputs (out of line,
// as show_start).
__attribute__((noinline)) void show_outputs(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info) {
  CallbackGuard guard(s);
  std::vector<at::Tensor>& outputs = s.tensors;
  std::vector<bool>& unused = s.writes;
  outputs.clear();
  unused.clear();
  for (const c10::IValue& v : fn.outputs()) {
    flatten_tensors(v, false, &outputs, &unused);
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      it->txn->observe_after(outputs, info.differentiable);
    }
  }
}

}  // namespace

void observer_push(Transaction* txn, std::shared_ptr<ObserverGate> gate) {
  ThreadState& s = state();
  s.stack.push_back({txn, std::move(gate)});
  if (!s.handle.has_value()) {
    s.handle = add_operator_callback(on_start, on_end);
  }
}

void observer_pop(Transaction* txn) {
  ThreadState& s = state();
  if (s.stack.empty() || s.stack.back().txn != txn) {
    throw ReplayException(
        ErrorKind::kUnsupported,
        "torch_replay: observation scopes of checkpointed segments must nest "
        "(a segment's scope ended while another one was innermost on this "
        "thread)",
        0);
  }
  s.stack.pop_back();
  if (s.stack.empty() && s.handle.has_value()) {
    at::removeCallback(*s.handle);
    s.handle.reset();
  }
}

bool observer_active() {
  return !state().stack.empty();
}

int observer_depth() {
  return static_cast<int>(state().stack.size());
}

int observer_nesting() {
  return state().depth;
}

int64_t observer_known_operators() {
  return state().facts->size();
}

}  // namespace torch_replay::aten
