#pragma once

// Note [Binding registry]
// Each component registers its pybind11 bindings from its own file with
// TORCH_REPLAY_BINDINGS(name) { ... } so that no single file has to know every
// component. csrc/python/module.cpp runs all registered binders, in name order,
// when the extension is imported. Binding files include only pybind11, or
// torch/csrc/utils/pybind.h (torch's type casters) where they pass tensors;
// never torch/extension.h, which brings all of the C++ frontend (nn, optim,
// data): module.cpp took 29 s of CPU to compile with it, 6 s without.

#include <pybind11/pybind11.h>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "core/status.h"

namespace torch_replay::python {

using Binder = std::function<void(pybind11::module_&)>;

// Returns the process-wide registry (name -> binder). Function-local static,
// so registration from static initialisers of other files is safe.
std::map<std::string, Binder>& binder_registry();

struct BinderRegistration {
  BinderRegistration(const char* name, Binder binder) {
    binder_registry().emplace(name, std::move(binder));
  }
};

// Registers the one translator of ReplayException into Python errors, by
// kind, for every binding (csrc/python/errors.cpp); module.cpp calls it once.
void register_error_translator();

}  // namespace torch_replay::python

#define TORCH_REPLAY_BINDINGS(name)                                 \
  static void torch_replay_bind_##name(pybind11::module_& m);       \
  static ::torch_replay::python::BinderRegistration                 \
      torch_replay_binder_##name(#name, &torch_replay_bind_##name); \
  static void torch_replay_bind_##name(pybind11::module_& m)
