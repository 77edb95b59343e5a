#include "aten/observation_floor.h"

#include <ATen/record_function.h>

#include <memory>
#include <mutex>
#include <optional>

#include "aten/operator_facts.h"
#include "aten/write_watch.h"

namespace torch_replay::aten {

namespace {

std::unique_ptr<at::ObserverContext> floor_start(
    const at::RecordFunction& /*fn*/) {
  return nullptr;
}

void floor_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
}

// A counted registration: the first `on` registers, the last `off` removes.
struct FloorSwitch {
  int users = 0;
  std::optional<at::CallbackHandle> handle;
};

template <typename Register>
int toggle(FloorSwitch& f, bool on, Register add) {
  if (on && f.users++ == 0) {
    f.handle = add();
  } else if (!on && f.users > 0 && --f.users == 0 && f.handle.has_value()) {
    at::removeCallback(*f.handle);
    f.handle.reset();
  }
  return f.users;
}

}  // namespace

int floor_observer(bool on) {
  // Per thread, as the observer's callback is.
  static thread_local FloorSwitch f;
  return toggle(
      f, on, [] { return add_operator_callback(floor_start, floor_end); });
}

int floor_watch(bool on) {
  static FloorSwitch f;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return toggle(f, on, [] { return add_watch_callback(floor_start); });
}

}  // namespace torch_replay::aten
