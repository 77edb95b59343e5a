// pybind11 bindings of the Inductor pass's CPU allocator guard
// (torch_replay._C.inductor). The Python API is inductor_pass/guard.py; see
// Note [Counting CPU allocator] and Note [Binding registry].
#include <pybind11/pybind11.h>

#include "aten/counting_allocator.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::aten {
namespace {

py::dict to_dict(const CountingStats& s) {
  py::dict d;
  d["live"] = s.live;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  return d;
}

}  // namespace

TORCH_REPLAY_BINDINGS(inductor) {
  auto sub = m.def_submodule(
      "inductor", "Counting CPU allocator for the Inductor pass's guard");
  sub.def(
      "counting_start",
      &counting_start,
      "Install the counting CPU allocator and zero its counters.");
  sub.def(
      "counting_stop",
      []() { return to_dict(counting_stop()); },
      "Restore the previous CPU allocator; return the final counters.");
  sub.def(
      "counting_stats",
      []() { return to_dict(counting_stats()); },
      "Counters of the active (or last) window: live, peak, allocated, "
      "num_allocs, num_frees.");
  sub.def(
      "counting_reset_peak",
      &counting_reset_peak,
      "Set peak = live (measure the peak of a part of the window).");
  sub.def("counting_active", &counting_active);
}

}  // namespace torch_replay::aten
