#pragma once

// Note [Audit recorder]
// torch_replay.audit (torch_replay/audit/observe.py) observes one training
// step through the same RecordFunction mechanism and the same per-operator
// facts as the checkpoint observer (Note [C++ observer]: operator_info,
// collect_arguments, the batch-norm write table, random tags, explicit
// generators), and judges it with the same byte arithmetic as the
// Transaction: exact strided footprints (csrc/core/byte_ranges.h) and the
// same overlap rule. It records, per operator, every access to a storage
// (which storage, read or written, dtype, exact footprint, view geometry,
// requires_grad) and the storages it created; Python reads the tables once,
// at the end, and asks for footprint intersections by access index.
//
//   * Storage identity: the recorder holds a weak reference to every
//     StorageImpl it saw (as StorageKeys and the Transaction do), so no later
//     storage reuses an address: a storage is one dense id for the whole run.
//   * Operators: depth 0 dispatcher operators are recorded with all their
//     tensor arguments; an operator nested inside another's implementation
//     adds only what the Transaction also takes from it (writes to storages
//     the enclosing operator was given that it does not declare, and its
//     random draws). Views read no bytes: they count as operators with no
//     access, so that a storage an alias-returning operator makes (reshape
//     copying) is seen as made there.
//   * Scope: start() registers a thread-local callback on the calling thread
//     (the autograd engine carries it to its worker threads); one recorder is
//     active at a time. Recording is serialized by a mutex.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/byte_ranges.h"
#include "core/region_store.h"

namespace torch_replay::aten {

// Footprint of a tensor's bytes in its storage, as the Transaction computes
// it (a bounding superset, `*exact` false, past 2^16 runs).
RangeSet tensor_footprint(const at::Tensor& t, bool* exact = nullptr);

// The Transaction's overlap rule for one operator (Note [Replay protocol]):
// index of a written tensor whose exact footprint overlaps another argument
// of the same storage seen through a different view, or -1.
int64_t overlapping_write(
    const std::vector<at::Tensor>& tensors, const std::vector<bool>& writes);

struct AuditAccess {
  int64_t op = 0;
  int64_t storage = 0;
  bool write = false;
  bool nested = false;  // an undeclared write of a nested operator
  bool requires_grad = false;
  bool floating = false;  // floating point or complex
  at::ScalarType dtype = at::kFloat;
  int64_t view = 0;  // dense id of (storage, offset, sizes, strides, dtype)
  bool exact = true;
  RangeSet footprint;
};

struct AuditOp {
  int64_t name = 0;  // index into AuditRecorder::op_names()
  bool random = false;
  // Address of the explicit generator drawn from (torch.Generator._cdata),
  // or 0 for the default generator of `device`.
  uint64_t generator = 0;
  std::string device;
  int64_t overlap = -1;  // access index of a raw overlapping write
};

struct AuditStorage {
  int64_t created = -1;  // operator that returned it first, -1 if earlier
  at::ScalarType dtype = at::kFloat;  // of the tensor first seen (or made)
  std::vector<int64_t> shape;
};

class AuditRecorder {
 public:
  AuditRecorder() = default;
  ~AuditRecorder();
  AuditRecorder(const AuditRecorder&) = delete;
  AuditRecorder& operator=(const AuditRecorder&) = delete;

  // Starts / stops recording the current thread's operators. Throws
  // ReplayException(kUnsupported) if another recorder is active.
  void start();
  void stop();
  // While paused, operators are not recorded (the audit's own bookkeeping).
  bool paused = false;

  // Dense id of t's storage, registering it as existing before any
  // operator that will use it (-1 if it has no observable bytes).
  int64_t storage_id(const at::Tensor& t);
  // Number of operators recorded so far (a position between operators).
  int64_t position() const;

  // Do the footprints of accesses `a` (their union) and `b` overlap? With
  // `other_view`, only pairs seen through different views count.
  bool overlap(
      const std::vector<int64_t>& a,
      const std::vector<int64_t>& b,
      bool other_view = false) const;

  const std::vector<AuditAccess>& accesses() const {
    return accesses_;
  }
  const std::vector<AuditOp>& ops() const {
    return ops_;
  }
  const std::vector<AuditStorage>& storages() const {
    return storages_;
  }
  const std::vector<std::string>& op_names() const {
    return op_names_;
  }

  // Called by the RecordFunction callbacks (Note [Audit recorder]).
  void record_op(
      const std::string& display,
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool random,
      const std::optional<at::Generator>& generator);
  void record_view(
      const std::string& display, const std::vector<at::Tensor>& tensors);
  void record_nested(
      const std::vector<at::Tensor>& tensors,
      const std::vector<bool>& writes,
      bool random,
      const std::optional<at::Generator>& generator,
      const c10::Device& device);
  void record_outputs(const std::vector<at::Tensor>& outputs);

 private:
  int64_t id_of(const at::Tensor& t);  // these require mutex_
  int64_t name_index(const std::string& display);
  void add_access(
      const at::Tensor& t, int64_t storage, bool write, bool nested);

  mutable std::mutex mutex_;
  bool active_ = false;
  std::vector<AuditAccess> accesses_;
  std::vector<AuditOp> ops_;
  std::vector<AuditStorage> storages_;
  std::unordered_map<StorageKey, int64_t> ids_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> held_;
  std::unordered_map<std::string, int64_t> view_ids_;  // by geometry
  std::vector<std::string> op_names_;
  std::unordered_map<std::string, int64_t> op_index_;
};

}  // namespace torch_replay::aten
