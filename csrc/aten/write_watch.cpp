#include "aten/write_watch.h"

#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "aten/callback_thread.h"
#include "aten/op_observer.h"
#include "aten/operator_facts.h"
#include "aten/tensor_bytes.h"
#include "core/region_journal.h"

namespace torch_replay::aten {

using namespace detail;  // NOLINT(google-build-using-namespace)

namespace {

// Per-thread state of the watch's callback.
struct WatchThread : CallbackThread {
  // The thread's operator facts (made first, so they outlive this state).
  OperatorFacts* const facts = &OperatorFacts::thread();
};

WatchThread& state() {
  return thread_instance<WatchThread>();
}

void journal_writes(
    WatchThread& s, const at::RecordFunction& fn, const OpInfo& info);
void count_metadata_write(WatchThread& s, const at::RecordFunction& fn);

std::unique_ptr<at::ObserverContext> on_watch_start(
    const at::RecordFunction& fn) {
  WatchThread& s = state();
  // Inside a segment its transactions journal what it writes.
  if (s.in_callback || observer_active() ||
      fn.scope() != at::RecordScope::FUNCTION) {
    return nullptr;
  }
  const OpInfo& info = s.facts->of(fn);
  // (Nested operators are looked at too: Note [Write watch].)
  if (!info.op || info.skip || !info.may_write) {
    if (info.metadata_write) {
      count_metadata_write(s, fn);
    }
    return nullptr;  // (Note [Write watch]: what is left unwatched)
  }
  journal_writes(s, fn, info);
  return nullptr;
}

// A write of argument 0's metadata outside segments (resize_, set_, t_):
// nothing to journal, but its version counter moves (out of line: rare).
__attribute__((noinline)) void count_metadata_write(
    WatchThread& s, const at::RecordFunction& fn) {
  CallbackGuard guard(s);
  const auto inputs = fn.inputs();
  if (!inputs.empty() && inputs[0].isTensor()) {
    const at::Tensor& t = inputs[0].toTensor();
    if (declarable(t)) {
      RegionJournal::global().count_write(storage_key(t));
    }
  }
}

// The part of on_watch_start that journals a writing operator's writes (out
// of line: most operators write nothing).
__attribute__((noinline)) void journal_writes(
    WatchThread& s, const at::RecordFunction& fn, const OpInfo& info) {
  CallbackGuard guard(s);
  collect_arguments(
      info,
      fn.inputs(),
      /*writes_only=*/true,
      &s.tensors,
      &s.writes,
      nullptr);
  for (const at::Tensor& t : s.tensors) {
    try {
      journal_write_outside_segments(t);
    } catch (...) {
      // Never throw out of a callback; the re-run's start hashes refuse a
      // write that could not be journaled.
    }
  }
}

struct WriteWatch {
  std::mutex mutex;
  int users = 0;
  std::optional<at::CallbackHandle> handle;
};

WriteWatch& write_watch() {
  static WriteWatch w;
  return w;
}

}  // namespace

void journal_write_outside_segments(const at::Tensor& t) {
  if (!observable(t)) {
    if (declarable(t)) {  // no bytes yet, but its version moves: counted
      RegionJournal::global().count_write(storage_key(t));
    }
    return;
  }
  const StorageKey key = storage_key(t);
  auto& journal = RegionJournal::global();
  if (journal.watched(key)) {  // journaled or marked (Note [Write marks])
    journal.record_if_watched(key, ref_of(t.storage()), footprint_of(t));
  }
}

at::CallbackHandle add_watch_callback(
    at::RecordFunctionCallback::StartCallback start) {
  return at::addGlobalCallback(
      at::RecordFunctionCallback(start, nullptr)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

void write_watch_acquire() {
  WriteWatch& w = write_watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.users++ == 0) {
    w.handle = add_watch_callback(on_watch_start);
  }
}

void write_watch_release() {
  WriteWatch& w = write_watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (--w.users == 0 && w.handle.has_value()) {
    at::removeCallback(*w.handle);
    w.handle.reset();
  }
}

}  // namespace torch_replay::aten
