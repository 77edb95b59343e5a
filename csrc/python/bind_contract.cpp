// pybind11 bindings of the replay contract interpreter
// (csrc/core/replay_contract.h, Note [Replay contract]) as
// torch_replay._C.contract. Used by torch_replay/suites.py; plain Python
// values only, so no tensor header is needed (Note [Binding registry]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/replay_contract.h"
#include "core/status.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::python {
namespace {

using namespace torch_replay::contract;

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

py::dict program_dict(const Program& p) {
  py::list storages, views, ops, loss;
  for (const Storage& s : p.storages) {
    py::dict d;
    d["nbytes"] = s.nbytes;
    d["initial"] = to_bytes(s.initial);
    storages.append(d);
  }
  for (const View& v : p.views) {
    py::dict d;
    d["storage"] = v.storage;
    d["dtype"] = dtype_name(v.dtype);
    d["byte_offset"] = v.byte_offset;
    d["numel"] = v.numel;
    views.append(d);
  }
  for (const Op& op : p.ops) {
    py::dict d;
    d["kind"] = op.kind == OpKind::kBoundary ? "boundary" : "write";
    d["dst_view"] = op.dst_view;
    d["dst_start"] = op.dst_start;
    d["len"] = op.len;
    py::list operands;
    for (const Operand& o : op.operands) {
      operands.append(py::make_tuple(o.view, o.start, o.coef));
    }
    d["operands"] = operands;
    d["bias"] = op.bias;
    d["nonlin"] = nonlin_name(op.nonlin);
    d["noise"] = op.noise;
    d["dropout"] = op.dropout;
    ops.append(d);
  }
  for (const LossTerm& t : p.loss) {
    loss.append(py::make_tuple(t.view, t.index, t.weight));
  }
  py::dict d;
  d["storages"] = storages;
  d["views"] = views;
  d["primary"] = p.primary;
  d["ops"] = ops;
  d["rng"] = py::make_tuple(p.rng.key, p.rng.counter);
  d["input_storages"] = p.input_storages;
  d["loss"] = loss;
  return d;
}

// A result struct as a dict, by its fields() (replay_contract.h).
template <typename R>
py::dict as_dict(const R& r) {
  py::dict d;
  std::apply(
      [&](const auto&... f) { ((d[f.first] = r.*(f.second)), ...); },
      fields(static_cast<const R*>(nullptr)));
  return d;
}

GeneratorOptions options_from(const py::kwargs& kw) {
  GeneratorOptions o;
  for (auto item : kw) {
    const std::string k = py::cast<std::string>(item.first);
    bool known = false;
    std::apply(
        [&](const auto&... f) {
          ((k == f.first ? (o.*(f.second) =
                                py::cast<std::decay_t<decltype(o.*(f.second))>>(
                                    item.second),
                            known = true)
                         : false),
           ...);
        },
        fields(static_cast<const GeneratorOptions*>(nullptr)));
    if (!known) {
      throw py::type_error("generate_program: unknown option '" + k + "'");
    }
  }
  return o;
}

py::dict evaluate(const Program& p) {
  Trace tr = trace_program(p);
  std::vector<double> rev = reverse_gradient(tr, recorded_values(tr));
  std::vector<double> jac = forward_jacobian(tr);
  py::list final_bytes, grad, jacobian, inputs;
  for (const auto& b : tr.final_state.bytes) {
    final_bytes.append(to_bytes(b));
  }
  for (int j = 0; j < tr.num_inputs; ++j) {
    bool u = tr.unsupported[j];
    grad.append(u ? py::object(py::none()) : py::object(py::float_(rev[j])));
    jacobian.append(
        u ? py::object(py::none()) : py::object(py::float_(jac[j])));
    inputs.append(py::make_tuple(tr.inputs[j].first, tr.inputs[j].second));
  }
  py::dict d;
  d["loss"] = tr.loss_value;
  d["final_bytes"] = final_bytes;
  d["rng"] = py::make_tuple(tr.final_state.rng.key, tr.final_state.rng.counter);
  d["grad"] = grad;
  d["jacobian"] = jacobian;
  d["inputs"] = inputs;
  d["nodes"] = tr.nodes.size();
  return d;
}

}  // namespace

TORCH_REPLAY_BINDINGS(contract) {
  auto c = m.def_submodule(
      "contract",
      "Reference semantics of the replay contract (design.md §2.1), "
      "torch-free.");
  py::class_<Program>(c, "Program")
      .def("describe", &Program::describe)
      .def("to_dict", &program_dict)
      .def_property_readonly("num_segments", &Program::num_segments)
      .def_property_readonly("num_writes", &Program::num_writes);
  c.def(
      "generate_program",
      [](uint64_t seed, const py::kwargs& kw) {
        GeneratorOptions o = options_from(kw);
        return generate_program(seed, o);
      },
      py::arg("seed"),
      "A seeded random program; keyword options as GeneratorOptions.");
  c.def("evaluate", [](const Program& p) { return evaluate(p); });
  c.def("check_numeric", [](const Program& p) {
    return as_dict(check_numeric(p));
  });
  c.def(
      "check_bytes", [](const Program& p) { return as_dict(check_bytes(p)); });
  c.def("check_engine", [](const Program& p, const std::string& engine) {
    return as_dict(check_engine(p, parse_engine_kind(engine)));
  });
  c.def("check_complex_step", [](const Program& p) {
    return as_dict(check_complex_step(p));
  });
}

}  // namespace torch_replay::python
