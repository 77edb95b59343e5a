// pybind11 bindings of the joint planner (csrc/core/pareto_planner.h) and the
// ordered layer planner (csrc/core/ordered_planner.h) as
// torch_replay._C.planner. The Python API is torch_replay/planner.py and
// torch_replay/_planning/layer_order.py; these
// bindings take plain numbers so that no tensor header is needed (see
// Note [Binding registry]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ordered_planner.h"
#include "core/pareto_planner.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::python {
namespace {

using OptionTuple = std::tuple<int64_t, int64_t, double>;

std::vector<PlannerOption> to_core(const std::vector<OptionTuple>& options) {
  std::vector<PlannerOption> core;
  core.reserve(options.size());
  for (const auto& [retained, transient, time] : options) {
    core.push_back({retained, transient, time});
  }
  return core;
}

std::vector<std::vector<PlannerOption>> to_core(
    const std::vector<std::vector<OptionTuple>>& segments) {
  std::vector<std::vector<PlannerOption>> core;
  core.reserve(segments.size());
  for (const auto& options : segments) {
    core.push_back(to_core(options));
  }
  return core;
}

std::unique_ptr<ParetoPlanner> make_planner(
    const std::vector<std::vector<OptionTuple>>& segments, int64_t persistent) {
  return std::make_unique<ParetoPlanner>(to_core(segments), persistent);
}

PlannerDominance parse_dominance(const std::string& name) {
  if (name == "pareto") {
    return PlannerDominance::kRetainedTransientTime;
  }
  if (name == "summed_memory") {
    return PlannerDominance::kSummedMemory;
  }
  throw py::value_error(
      "dominance must be 'pareto' or 'summed_memory' (unsafe, tests only), "
      "got '" +
      name + "'");
}

}  // namespace

TORCH_REPLAY_BINDINGS(planner) {
  auto pm = m.def_submodule(
      "planner", "Exact Pareto DP planner (csrc/core/pareto_planner.h)");

  py::class_<PlannerResult>(pm, "PlannerResult")
      .def_readonly("feasible", &PlannerResult::feasible)
      .def_readonly("choices", &PlannerResult::choices)
      .def_readonly("retained", &PlannerResult::retained)
      .def_readonly("transient", &PlannerResult::transient)
      .def_readonly("peak", &PlannerResult::peak)
      .def_readonly("time", &PlannerResult::time)
      .def_readonly("min_budget", &PlannerResult::min_budget)
      .def_readonly("frontier_sizes", &PlannerResult::frontier_sizes)
      .def_readonly("states_generated", &PlannerResult::states_generated)
      .def_readonly(
          "states_pruned_by_time", &PlannerResult::states_pruned_by_time)
      .def_readonly("time_upper_bound", &PlannerResult::time_upper_bound)
      .def_readonly("rounds", &PlannerResult::rounds);

  py::class_<ParetoPlanner, std::unique_ptr<ParetoPlanner>>(
      pm,
      "ParetoPlanner",
      "ParetoPlanner(segments, persistent): segments is a list (one per "
      "segment) of lists of (retained bytes, transient bytes, time) tuples.")
      .def(
          py::init(&make_planner),
          py::arg("segments"),
          py::arg("persistent") = 0)
      .def_property_readonly("min_budget", &ParetoPlanner::min_budget)
      .def_property_readonly("num_segments", &ParetoPlanner::num_segments)
      .def(
          "solve",
          [](const ParetoPlanner& self,
             int64_t budget,
             const std::string& dominance,
             bool time_bound) {
            PlannerSettings settings;
            settings.dominance = parse_dominance(dominance);
            settings.time_bound = time_bound;
            py::gil_scoped_release release;
            return self.solve(budget, settings);
          },
          py::arg("budget"),
          py::arg("dominance") = "pareto",
          py::arg("time_bound") = true,
          "Least-time plan with persistent + retained + transient <= budget. "
          "dominance='summed_memory' is the unsafe rule, for tests only.")
      .def("greedy_upper_bound", &ParetoPlanner::greedy_upper_bound)
      .def("root_lower_bound", [](const ParetoPlanner& self, int64_t budget) {
        if (budget < self.min_budget()) {
          throw py::value_error("budget is below min_budget");
        }
        return self.root_lower_bound(budget);
      });

  pm.def(
      "plan_ordered",
      [](const std::vector<std::vector<OptionTuple>>& segments,
         std::vector<int64_t> grads,
         int64_t budget,
         int64_t persistent,
         int64_t floor,
         int64_t head) {
        std::vector<std::vector<PlannerOption>> core = to_core(segments);
        OrderedPeakTerms terms{std::move(grads), persistent, floor, head};
        py::gil_scoped_release release;
        return plan_ordered(core, terms, budget);
      },
      py::arg("segments"),
      py::arg("grads"),
      py::arg("budget"),
      py::arg("persistent") = 0,
      py::arg("floor") = 0,
      py::arg("head") = 0,
      "Least-time choice with the ordered peak (Note [Ordered layer peak]) "
      "<= budget; segments of (retained, transient, time) tuples.");
  pm.def(
      "ordered_peak",
      [](const std::vector<OptionTuple>& chosen,
         std::vector<int64_t> grads,
         int64_t persistent,
         int64_t floor,
         int64_t head) {
        return ordered_peak(
            to_core(chosen),
            OrderedPeakTerms{std::move(grads), persistent, floor, head});
      },
      py::arg("chosen"),
      py::arg("grads"),
      py::arg("persistent") = 0,
      py::arg("floor") = 0,
      py::arg("head") = 0,
      "The peak of Note [Ordered layer peak] of one option per layer.");
}

}  // namespace torch_replay::python
