#pragma once

// The per-thread state shared by the operator callbacks (the observer, the
// write watch, the audit recorder and their operator facts).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torch_replay::aten {

// The calling thread's T, made on its first use. The pointer is initial-exec
// TLS (a plain load, not a __tls_get_addr call per operator); the owner, made
// once per thread, frees the T when the thread exits.
template <typename T>
T& thread_instance() {
  static thread_local T* fast __attribute__((tls_model("initial-exec"))) =
      nullptr;
  if (fast == nullptr) {
    thread_local std::unique_ptr<T> owner = std::make_unique<T>();
    fast = owner.get();
  }
  return *fast;
}

// What every callback's per-thread state holds.
struct CallbackThread {
  bool in_callback = false;
  // Buffers reused by every callback (callbacks never nest: in_callback).
  std::vector<at::Tensor> tensors;
  std::vector<bool> writes;
  std::vector<bool> returned;
};

// Marks the thread inside a callback for the guard's life.
class CallbackGuard {
 public:
  explicit CallbackGuard(CallbackThread& s) : s_(s) {
    s_.in_callback = true;
  }
  ~CallbackGuard() {
    s_.tensors.clear();  // hold no tensor beyond the callback
    s_.writes.clear();
    s_.returned.clear();
    s_.in_callback = false;
  }
  CallbackGuard(const CallbackGuard&) = delete;
  CallbackGuard& operator=(const CallbackGuard&) = delete;

 private:
  CallbackThread& s_;
};

}  // namespace torch_replay::aten
