// pybind11 bindings of the replay contract interpreter
// (csrc/core/replay_contract.h, Note [Replay contract]) as
// torch_replay._C.contract. Used by torch_replay/suites.py; plain Python
// values only, so no tensor header is needed (Note [Binding registry]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
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

GeneratorOptions options_from(const py::kwargs& kw) {
  GeneratorOptions o;
  for (auto item : kw) {
    std::string k = py::cast<std::string>(item.first);
    py::handle v = item.second;
    if (k == "buffers") {
      o.buffers = py::cast<int>(v);
    } else if (k == "min_elems") {
      o.min_elems = py::cast<int>(v);
    } else if (k == "max_elems") {
      o.max_elems = py::cast<int>(v);
    } else if (k == "ops") {
      o.ops = py::cast<int>(v);
    } else if (k == "segments") {
      o.segments = py::cast<int>(v);
    } else if (k == "alias_rate") {
      o.alias_rate = py::cast<double>(v);
    } else if (k == "overlap_rate") {
      o.overlap_rate = py::cast<double>(v);
    } else if (k == "rng_rate") {
      o.rng_rate = py::cast<double>(v);
    } else if (k == "int_write_rate") {
      o.int_write_rate = py::cast<double>(v);
    } else if (k == "cross_width_aliases") {
      o.cross_width_aliases = py::cast<bool>(v);
    } else if (k == "ensure_overwrite") {
      o.ensure_overwrite = py::cast<bool>(v);
    } else if (k == "init_seed") {
      o.init_seed = py::cast<uint64_t>(v);
    } else {
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
      "Reference semantics of the replay contract (SPEC 2.1), torch-free.");
  py::class_<Program>(c, "Program")
      .def("describe", &Program::describe)
      .def("to_dict", &program_dict)
      .def_property_readonly("num_segments", &Program::num_segments)
      .def_property_readonly("num_writes", &Program::num_writes);
  c.def(
      "generate_program",
      [](uint64_t seed, const py::kwargs& kw) {
        GeneratorOptions o = options_from(kw);
        return translate_errors([&] { return generate_program(seed, o); });
      },
      py::arg("seed"),
      "A seeded random program; keyword options as GeneratorOptions.");
  c.def("evaluate", [](const Program& p) {
    return translate_errors([&] { return evaluate(p); });
  });
  c.def("check_numeric", [](const Program& p) {
    NumericResult r = translate_errors([&] { return check_numeric(p); });
    py::dict d;
    d["outputs_exact"] = r.outputs_exact;
    d["max_grad_mismatch"] = r.max_grad_mismatch;
    d["coordinates"] = r.coordinates;
    d["unsupported"] = r.unsupported;
    d["control_detected"] = r.control_detected;
    d["control_mismatch"] = r.control_mismatch;
    return d;
  });
  c.def("check_bytes", [](const Program& p) {
    BytesResult r = translate_errors([&] { return check_bytes(p); });
    py::dict d;
    d["segments"] = r.segments;
    d["snapshot_ok"] = r.snapshot_ok;
    d["undo_ok"] = r.undo_ok;
    d["redo_ok"] = r.redo_ok;
    d["readset_ok"] = r.readset_ok;
    d["guard_ok"] = r.guard_ok;
    d["guard_refused"] = r.guard_refused;
    d["wrong_rng_detected"] = r.wrong_rng_detected;
    d["no_restore_wrong"] = r.no_restore_wrong;
    d["storage_ops"] = r.storage_ops;
    return d;
  });
  c.def("check_engine", [](const Program& p, const std::string& engine) {
    EngineResult r = translate_errors(
        [&] { return check_engine(p, parse_engine_kind(engine)); });
    py::dict d;
    d["refused"] = r.refused;
    d["max_grad_error"] = r.max_grad_error;
    d["max_diff_eager"] = r.max_diff_eager;
    d["state_restored"] = r.state_restored;
    d["repeat_identical"] = r.repeat_identical;
    d["retained_bytes"] = r.retained_bytes;
    return d;
  });
  c.def("check_complex_step", [](const Program& p) {
    ComplexStepResult r =
        translate_errors([&] { return check_complex_step(p); });
    py::dict d;
    d["coordinates"] = r.coordinates;
    d["unsupported"] = r.unsupported;
    d["max_mismatch"] = r.max_mismatch;
    return d;
  });
}

}  // namespace torch_replay::python
