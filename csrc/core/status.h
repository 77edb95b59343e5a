#pragma once

// The one exception type thrown by the torch-free core. The binding layer
// (the one translator, csrc/python/errors.cpp) translates it into the Python
// error classes of torch_replay.errors (design.md §5) by `kind`.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace torch_replay {

enum class ErrorKind {
  kInvalidArgument,  // bad input from the caller -> ValueError
  kStateMutation,    // -> StateMutationError
  kRngMismatch,      // -> RngMismatchError
  kUnsupported,      // -> UnsupportedReplayError
  kOverlap,          // -> OverlapError
  kInternal,         // a broken invariant -> RuntimeError
};

class ReplayException : public std::runtime_error {
 public:
  // `subject` identifies the storage the error is about (an opaque key the
  // adapter can turn into a name), or 0 when there is none.
  ReplayException(
      ErrorKind kind, const std::string& message, uintptr_t subject = 0)
      : std::runtime_error(message), kind_(kind), subject_(subject) {}

  ErrorKind kind() const {
    return kind_;
  }
  uintptr_t subject() const {
    return subject_;
  }

 private:
  ErrorKind kind_;
  uintptr_t subject_;
};

}  // namespace torch_replay
