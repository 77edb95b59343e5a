// The one translation of the core's ReplayException into Python errors, by
// kind (design.md §5): kInvalidArgument -> ValueError; kStateMutation,
// kRngMismatch, kUnsupported, kOverlap -> the classes of torch_replay.errors
// (with the storage key of the error's subject); anything else RuntimeError.
// Registered once, for every binding, by csrc/python/module.cpp.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>

#include "core/status.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::python {
namespace {

const char* python_error_class(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kStateMutation:
      return "StateMutationError";
    case ErrorKind::kRngMismatch:
      return "RngMismatchError";
    case ErrorKind::kUnsupported:
      return "UnsupportedReplayError";
    case ErrorKind::kOverlap:
      return "OverlapError";
    default:
      return nullptr;
  }
}

void translate(const ReplayException& e) {
  const char* cls_name = python_error_class(e.kind());
  if (cls_name == nullptr) {
    PyErr_SetString(
        e.kind() == ErrorKind::kInvalidArgument ? PyExc_ValueError
                                                : PyExc_RuntimeError,
        e.what());
    return;
  }
  py::object cls = py::module_::import("torch_replay.errors").attr(cls_name);
  py::object err = cls(e.what());
  err.attr("storage_key") = py::int_(static_cast<uint64_t>(e.subject()));
  PyErr_SetObject(cls.ptr(), err.ptr());
}

}  // namespace

void register_error_translator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const ReplayException& e) {
      translate(e);
    }
  });
}

}  // namespace torch_replay::python
