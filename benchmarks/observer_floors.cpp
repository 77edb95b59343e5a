// Note [Other observation floors]
// Benchmark-only callbacks that do nothing, built on first use by
// benchmarks/bench_replay_speed.py (its "floors" group), never part of the
// torch_replay extension. Note [Observation floor] in
// csrc/aten/observation_floor.h prices the observer's own registration (a
// thread-local RecordFunction callback given every operator's inputs and
// outputs). These price the other ways to see operators, so that the floor
// is a property of seeing arguments, not of one mechanism:
//  * a thread-local RecordFunction callback given neither inputs nor outputs
//    (what RecordFunction costs before any argument is boxed; it shows no
//    storage, so it could not observe a segment);
//  * the same given inputs only (no result is boxed: the observer could not
//    tell the storages a segment makes from those it finds);
//  * a boxed fallback kernel on a mode dispatch key included in the thread's
//    dispatch key set: every operator the thread calls through the dispatcher
//    reaches it with its arguments boxed on the stack, and it redispatches
//    below its key, where the results come back on the same stack. The key is
//    TESTING_ONLY_GenericMode, which PyTorch keeps free for tests of exactly
//    this (an extension has no dispatch key of its own); registering it in
//    the product would take the key from whoever else tests with it.
// Each switch is counted like the extension's (a stray `off` is ignored) and
// returns how many `on`s are left.

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <optional>

namespace {

std::unique_ptr<at::ObserverContext> nothing_start(
    const at::RecordFunction& /*fn*/) {
  return nullptr;
}

void nothing_end(const at::RecordFunction& /*fn*/, at::ObserverContext*) {}

struct Switch {
  int users = 0;
  std::optional<at::CallbackHandle> handle;
};

// On this thread, as the observer's callback is (the tests and the benchmark
// switch on and off on one thread).
int toggle_callback(Switch& s, bool on, bool inputs, bool outputs) {
  if (on && s.users++ == 0) {
    s.handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(nothing_start, nothing_end)
            .needsInputs(inputs)
            .needsOutputs(outputs)
            .scopes({at::RecordScope::FUNCTION}));
  } else if (!on && s.users > 0 && --s.users == 0) {
    at::removeCallback(*s.handle);
    s.handle.reset();
  }
  return s.users;
}

int bare(bool on) {
  thread_local Switch s;
  return toggle_callback(s, on, /*inputs=*/false, /*outputs=*/false);
}

int inputs_only(bool on) {
  thread_local Switch s;
  return toggle_callback(s, on, /*inputs=*/true, /*outputs=*/false);
}

constexpr c10::DispatchKey kModeKey =
    c10::DispatchKey::TESTING_ONLY_GenericMode;

std::atomic<int64_t> fallback_calls{0};

void boxed_fallback(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  fallback_calls.fetch_add(1, std::memory_order_relaxed);
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kModeKey),
      stack);
}

int fallback(bool on) {
  thread_local int users = 0;
  if (on && users++ == 0) {
    c10::impl::tls_set_dispatch_key_included(kModeKey, true);
  } else if (!on && users > 0 && --users == 0) {
    c10::impl::tls_set_dispatch_key_included(kModeKey, false);
  }
  return users;
}

int64_t calls() {
  return fallback_calls.load(std::memory_order_relaxed);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bare", &bare, "do-nothing RecordFunction callback, no arguments");
  m.def("inputs_only", &inputs_only, "the same, given the inputs only");
  m.def("fallback", &fallback, "do-nothing boxed fallback on a mode key");
  m.def("fallback_calls", &calls, "calls of the fallback so far");
}
