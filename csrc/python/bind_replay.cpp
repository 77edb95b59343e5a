// Python bindings of the replay machinery: Transaction, the reentrant segment
// Function, and the translation of core errors into torch_replay.errors.
#include <torch/csrc/utils/pybind.h>

#include <unordered_set>
#include <vector>

#include "aten/observation_floor.h"
#include "aten/op_observer.h"
#include "aten/segment_function.h"
#include "aten/tensor_bytes.h"
#include "aten/transaction.h"
#include "core/region_journal.h"
#include "core/status.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace torch_replay::aten {

namespace {

class StorageKeeper {
 public:
  uint64_t key(const at::Tensor& t) {
    const StorageKey k = storage_key(t);
    if (held_.emplace(k).second) {
      weak_.push_back(t.storage().getWeakStorageImpl());
    }
    return static_cast<uint64_t>(k);
  }
  size_t size() const {
    return held_.size();
  }

 private:
  std::unordered_set<StorageKey> held_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> weak_;
};

}  // namespace

TORCH_REPLAY_BINDINGS(replay) {
  py::class_<Transaction>(m, "Transaction")
      .def(
          py::init([](const std::string& engine,
                      std::vector<at::Tensor> tensors,
                      std::vector<std::string> tensor_names,
                      std::vector<at::Generator> generators,
                      std::vector<std::string> generator_names,
                      bool preserve_rng_state,
                      bool watch_reads,
                      bool preserve_reads,
                      bool verify_bytes) {
            TransactionOptions options;
            options.preserve_reads = preserve_reads;
            options.verify_bytes = verify_bytes;
            options.engine = engine;
            options.preserve_rng_state = preserve_rng_state;
            options.watch_reads = watch_reads;
            return std::make_unique<Transaction>(
                options,
                std::move(tensors),
                std::move(tensor_names),
                std::move(generators),
                std::move(generator_names));
          }),
          py::arg("engine"),
          py::arg("tensors"),
          py::arg("tensor_names"),
          py::arg("generators"),
          py::arg("generator_names"),
          py::arg("preserve_rng_state"),
          py::arg("watch_reads"),
          py::arg("preserve_reads") = false,
          py::arg("verify_bytes") = false)
      .def("begin_forward", &Transaction::begin_forward)
      .def(
          "before_op",
          &Transaction::before_op,
          py::arg("tensors"),
          py::arg("writes"),
          py::arg("random"),
          py::arg("generator"),
          py::arg("nested") = false,
          py::arg("returned") = std::vector<bool>{})
      .def("after_op", &Transaction::after_op)
      .def("before_reshape", &Transaction::before_reshape)
      .def("after_reshape", &Transaction::after_reshape)
      .def("record_saved", &Transaction::record_saved)
      .def("end_forward", &Transaction::end_forward)
      .def_property_readonly("has_pending", &Transaction::has_pending)
      .def("raise_pending", &Transaction::raise_pending)
      .def("abort_forward", &Transaction::abort_forward)
      .def("check_unchanged", &Transaction::check_unchanged)
      .def("begin_replay", &Transaction::begin_replay)
      .def("restores", &Transaction::restores)
      .def("overwritten_later", &Transaction::overwritten_later)
      .def("touched_key", &Transaction::touched_key)
      .def("verify_replay", &Transaction::verify_replay)
      .def("finish_replay", &Transaction::finish_replay)
      .def_property_readonly("in_replay", &Transaction::in_replay)
      .def_property_readonly("stateful", &Transaction::stateful)
      .def_property_readonly("has_writes", &Transaction::has_writes)
      .def_property_readonly("restores_any", &Transaction::restores_any)
      .def_property_readonly("engine", &Transaction::engine)
      .def_property_readonly("retained_bytes", &Transaction::retained_bytes)
      .def_property_readonly(
          "replay_transient_bytes", &Transaction::replay_transient_bytes)
      .def_property_readonly("footprint_bytes", &Transaction::footprint_bytes)
      .def_property_readonly("written_bytes", &Transaction::written_bytes)
      .def_property_readonly("declared_bytes", &Transaction::declared_bytes)
      .def_property_readonly(
          "tracked_generators", &Transaction::tracked_generators)
      .def_property_readonly("touched_storages", [](const Transaction& t) {
        std::vector<uint64_t> keys;
        for (const StorageKey k : t.touched_storages()) {
          keys.push_back(static_cast<uint64_t>(k));
        }
        return keys;
      });

  py::class_<ObserverGate, std::shared_ptr<ObserverGate>>(m, "ObserverGate")
      .def(py::init<>())
      .def_readwrite("paused", &ObserverGate::paused);
  // Note [C++ observer]: the Python scope keeps the transaction and the gate
  // alive until observer_pop.
  m.def(
      "observer_push",
      [](Transaction& txn, std::shared_ptr<ObserverGate> gate) {
        observer_push(&txn, std::move(gate));
      },
      py::arg("txn"),
      py::arg("gate"));
  m.def(
      "observer_pop",
      [](Transaction& txn) { observer_pop(&txn); },
      py::arg("txn"));
  // Note [Observation floor] (benchmarks only).
  m.def("_floor_observer", &floor_observer, py::arg("on"));
  m.def("_floor_watch", &floor_watch, py::arg("on"));
  // The same call registering nothing: what the switch itself costs.
  m.def("_floor_none", [](bool /*on*/) { return 0; }, py::arg("on"));
  m.def("observer_depth", &observer_depth);
  m.def("observer_nesting", &observer_nesting);
  m.def("observer_known_operators", &observer_known_operators);

  m.def(
      "apply_segment",
      &apply_segment,
      "Run a segment through the C++ autograd Function (use_reentrant=True)");
  m.def(
      "mark_transient_storage",
      &torch_replay::aten::detail::mark_transient_storage,
      py::arg("tensor"),
      "Never preserve this tensor's storage by its bytes (Note [Transient "
      "storages])");
  m.def("storage_key", [](const at::Tensor& t) {
    return static_cast<uint64_t>(storage_key(t));
  });
  // Storage identity that stays unique while the keeper lives: it holds a
  // weak reference to each StorageImpl it named, which keeps the object's
  // memory (not its bytes) allocated, so no later storage gets the same key
  // (as the Transaction does for the storages a segment touched).
  py::class_<StorageKeeper>(m, "StorageKeys")
      .def(py::init<>())
      .def("key", &StorageKeeper::key, py::arg("tensor"))
      .def("__len__", &StorageKeeper::size);
  m.def("engine_names", &torch_replay::engine_names);
  m.def("journal_bytes", [] { return RegionJournal::global().bytes(); });
  m.def("region_store_bytes", [] { return RegionStore::process_bytes(); });
  m.def("journal_entries", [] { return RegionJournal::global().entries(); });
}

}  // namespace torch_replay::aten
