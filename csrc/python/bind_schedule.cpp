// pybind11 bindings of the scheduling core (torch_replay._C.schedule). The
// Python API is torch_replay/schedule.py; see Note [Binding registry].
#include <pybind11/stl.h>

#include <chrono>
#include <utility>

#include "core/capacity_search.h"
#include "core/exhaustive_schedule.h"
#include "core/min_cut_bounds.h"
#include "core/recompute_choice.h"
#include "core/schedule_problem.h"
#include "core/schedule_solver.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::schedule {
namespace {

// Runs f with the GIL released (core errors reach Python through the one
// translator, csrc/python/errors.cpp).
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  py::gil_scoped_release release;
  return f();
}

py::dict lower_bounds(
    const Problem& problem,
    bool forward,
    bool reverse,
    bool joint,
    int64_t stop_at) {
  struct Out {
    int64_t ec = 0, f = -1, r = -1, j = -1, end = 0, cuts = 0;
    double seconds = 0;
  };
  const Out out = guarded([&]() {
    const auto start = std::chrono::steady_clock::now();
    MinCutBounds bounds(problem);
    Out o;
    o.ec = bounds.event_cut();
    if (forward) {
      o.f = bounds.forward_trap(stop_at);
    }
    if (reverse) {
      o.r = bounds.reverse_trap(stop_at);
    }
    if (joint) {
      o.j = bounds.joint_trap(stop_at);
    }
    o.end = bounds.end_steps();
    o.cuts = bounds.num_min_cuts();
    o.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return o;
  });
  py::dict d;
  d["event_cut"] = out.ec;
  if (forward) {
    d["forward_trap"] = out.f;
  }
  if (reverse) {
    d["reverse_trap"] = out.r;
  }
  if (joint) {
    d["joint_trap"] = out.j;
  }
  d["end_steps"] = out.end;
  d["min_cuts"] = out.cuts;
  d["seconds"] = out.seconds;
  return d;
}

}  // namespace

TORCH_REPLAY_BINDINGS(schedule) {
  auto sm = m.def_submodule(
      "schedule", "Peak-memory scheduling core (see torch_replay.schedule)");

  py::class_<Problem>(sm, "Problem")
      .def(
          py::init([](std::vector<int64_t> sizes,
                      std::vector<int> producer,
                      std::vector<std::vector<int>> consumers,
                      std::vector<int> outputs,
                      int num_units,
                      std::vector<std::pair<int, int>> extra_edges) {
            ProblemSpec spec;
            spec.sizes = std::move(sizes);
            spec.producer = std::move(producer);
            spec.consumers = std::move(consumers);
            spec.outputs = std::move(outputs);
            spec.num_units = num_units;
            spec.extra_edges = std::move(extra_edges);
            return guarded([&]() { return Problem(std::move(spec)); });
          }),
          py::arg("sizes"),
          py::arg("producer"),
          py::arg("consumers"),
          py::arg("outputs"),
          py::arg("num_units"),
          py::arg("extra_edges"))
      .def_property_readonly("num_units", &Problem::num_units)
      .def_property_readonly("num_buffers", &Problem::num_buffers)
      .def(
          "peak",
          [](const Problem& p, const std::vector<int>& order) {
            return guarded([&]() { return p.peak(order); });
          },
          py::arg("order"))
      .def(
          "step_costs",
          [](const Problem& p, const std::vector<int>& order) {
            return guarded([&]() { return p.step_costs(order); });
          },
          py::arg("order"))
      .def(
          "preds",
          [](const Problem& p, int u) {
            if (u < 0 || u >= p.num_units()) {
              throw py::index_error("unit out of range");
            }
            return p.preds(u);
          },
          py::arg("unit"))
      .def("topological_order", [](const Problem& p) {
        return p.topological_order();
      });

  sm.def(
      "lower_bounds",
      &lower_bounds,
      py::arg("problem"),
      py::arg("forward") = true,
      py::arg("reverse") = true,
      py::arg("joint") = true,
      py::arg("stop_at") = kNoStop,
      "Min-cut lower bounds; a dict with event_cut, the requested traps, "
      "min_cuts and seconds.");

  sm.def(
      "conditional_event",
      [](const Problem& p,
         int u,
         const std::vector<int>& done,
         const std::vector<int>& not_done) -> py::object {
        auto bad = [&](int v) { return v < 0 || v >= p.num_units(); };
        if (bad(u)) {
          throw py::value_error("unit out of range");
        }
        for (int v : done) {
          if (bad(v)) {
            throw py::value_error("unit out of range in done");
          }
        }
        for (int v : not_done) {
          if (bad(v)) {
            throw py::value_error("unit out of range in not_done");
          }
        }
        const int64_t value = guarded([&]() {
          EventOracle oracle(p);
          return oracle.event(u, done, not_done);
        });
        if (value == kInfeasible) {
          return py::none();
        }
        return py::int_(value);
      },
      py::arg("problem"),
      py::arg("unit"),
      py::arg("done"),
      py::arg("not_done"));

  sm.def(
      "solve_exhaustive",
      [](const Problem& p) {
        const ExhaustiveResult r =
            guarded([&]() { return solve_exhaustive(p); });
        return std::make_pair(r.peak, r.order);
      },
      py::arg("problem"));

  sm.def(
      "greedy_order",
      [](const Problem& p, int rule) {
        return guarded([&]() { return greedy_order(p, rule); });
      },
      py::arg("problem"),
      py::arg("rule"));

  sm.def(
      "choose_recomputation",
      [](std::vector<int64_t> base,
         std::vector<std::vector<int64_t>> deltas,
         std::vector<int64_t> event_pos,
         std::vector<int64_t> event_level,
         std::vector<int64_t> costs,
         std::vector<int64_t> groups,
         int64_t budget) {
        RecomputeChoiceInput in;
        in.base = std::move(base);
        in.deltas = std::move(deltas);
        in.event_pos = std::move(event_pos);
        in.event_level = std::move(event_level);
        in.costs = std::move(costs);
        in.groups = std::move(groups);
        in.budget = budget;
        const RecomputeChoice r =
            guarded([&]() { return choose_recomputation(in); });
        return py::make_tuple(r.peak, r.cost, r.chosen, r.nodes);
      },
      py::arg("base"),
      py::arg("deltas"),
      py::arg("event_pos"),
      py::arg("event_level"),
      py::arg("costs"),
      py::arg("groups"),
      py::arg("budget"));

  py::class_<Solution>(sm, "Solution")
      .def_readonly("order", &Solution::order)
      .def_readonly("peak", &Solution::peak)
      .def_readonly("initial_peak", &Solution::initial_peak)
      .def_readonly("event_cut", &Solution::event_cut)
      .def_readonly("forward_trap", &Solution::forward_trap)
      .def_readonly("reverse_trap", &Solution::reverse_trap)
      .def_readonly("joint_trap", &Solution::joint_trap)
      .def_readonly("end_steps", &Solution::end_steps)
      .def_readonly("lower_bound", &Solution::lower_bound)
      .def_readonly("certified", &Solution::certified)
      .def_readonly("optimal", &Solution::optimal)
      .def_readonly("min_cuts", &Solution::min_cuts)
      .def_readonly("search_states", &Solution::search_states)
      .def_readonly("capacity_tests", &Solution::capacity_tests)
      .def_readonly("timed_out", &Solution::timed_out)
      .def_readonly("seconds", &Solution::seconds);

  sm.def(
      "solve",
      [](const Problem& p,
         double time_limit_s,
         int64_t max_search_states,
         int random_restarts) {
        SolveOptions options;
        options.time_limit_s = time_limit_s;
        options.max_search_states = max_search_states;
        options.random_restarts = random_restarts;
        return guarded([&]() { return solve(p, options); });
      },
      py::arg("problem"),
      py::arg("time_limit_s") = 1.0,
      py::arg("max_search_states") = 2'000'000,
      py::arg("random_restarts") = 8);
}

}  // namespace torch_replay::schedule
