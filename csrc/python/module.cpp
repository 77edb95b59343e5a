// The torch_replay._C extension module. Components register their bindings
// through TORCH_REPLAY_BINDINGS (see Note [Binding registry]).
#include <pybind11/pybind11.h>

#include "python/bindings.h"

namespace torch_replay::python {

std::map<std::string, Binder>& binder_registry() {
  static std::map<std::string, Binder> registry;
  return registry;
}

}  // namespace torch_replay::python

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_replay C++ core";
  torch_replay::python::register_error_translator();
  for (auto& [name, binder] : torch_replay::python::binder_registry()) {
    binder(m);
  }
}
