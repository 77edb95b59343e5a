// Python bindings of the audit recorder (Note [Audit recorder]): the tables
// are handed over once, as int64 tensors and small lists, not per operator.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "aten/audit_recorder.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::aten {
namespace {

py::object dtype_object(at::ScalarType s) {
  return py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPDtype(s)));
}

// One Python tuple per item, made by `row`, as a list.
template <typename T, typename Row>
py::list rows(const std::vector<T>& items, Row&& row) {
  py::list out;
  for (const T& item : items) {
    out.append(row(item));
  }
  return out;
}

// Columns of AuditRecorder.accesses(): one row per access.
constexpr int64_t kAccessColumns = 8;

at::Tensor access_table(const AuditRecorder& r) {
  const auto& acc = r.accesses();
  at::Tensor t =
      at::empty({static_cast<int64_t>(acc.size()), kAccessColumns}, at::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t i = 0; i < acc.size(); ++i) {
    const AuditAccess& x = acc[i];
    a[i][0] = x.op;
    a[i][1] = x.storage;
    a[i][2] = x.write;
    a[i][3] = x.nested;
    a[i][4] = x.requires_grad;
    a[i][5] = x.floating;
    a[i][6] = static_cast<int64_t>(x.dtype);
    a[i][7] = x.view;
  }
  return t;
}

}  // namespace

TORCH_REPLAY_BINDINGS(audit) {
  py::class_<AuditRecorder>(m, "AuditRecorder")
      .def(py::init<>())
      .def("start", &AuditRecorder::start)
      .def("stop", &AuditRecorder::stop)
      .def_readwrite("paused", &AuditRecorder::paused)
      .def("storage_id", &AuditRecorder::storage_id, py::arg("tensor"))
      .def("position", &AuditRecorder::position)
      .def(
          "overlap",
          &AuditRecorder::overlap,
          py::arg("a"),
          py::arg("b"),
          py::arg("other_view") = false,
          "Do the exact footprints of accesses a and b overlap (any pair "
          "through different views, with other_view)?")
      .def(
          "accesses",
          [](const AuditRecorder& r) { return access_table(r); },
          "int64 [n, 8]: op, storage, write, nested, requires_grad, "
          "floating, dtype code (see dtype_of), view")
      .def(
          "ops",
          [](const AuditRecorder& r) {
            return rows(r.ops(), [](const AuditOp& op) {
              return py::make_tuple(
                  op.name, op.random, op.generator, op.device, op.overlap);
            });
          },
          "[(name index, random, generator address or 0, device, overlap "
          "access or -1)] per operator")
      .def("op_names", &AuditRecorder::op_names)
      .def(
          "storages",
          [](const AuditRecorder& r) {
            return rows(r.storages(), [](const AuditStorage& s) {
              return py::make_tuple(
                  s.created, dtype_object(s.dtype), py::cast(s.shape));
            });
          },
          "[(creating op or -1, dtype, shape)] per storage id")
      .def_static(
          "dtype_of",
          [](int64_t code) {
            return dtype_object(static_cast<at::ScalarType>(code));
          },
          py::arg("code"));
}

}  // namespace torch_replay::aten
