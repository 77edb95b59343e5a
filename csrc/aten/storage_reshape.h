#pragma once

// Note [Storage-changing writes]
// resize_, resize_as_ and set_ change what a tensor is, not only its bytes:
// its sizes, strides and offset, which storage it views, and that storage's
// size (a resize_ that grows reallocates it; an empty buffer has no bytes at
// all before it). The preservation engines keep byte ranges of one
// allocation of one size (Note [Preservation engines]), so they cannot
// express it. Instead, the first storage-changing write a forward makes to a
// tensor that existed before the segment (declared or not) records the
// tensor's whole start state: its metadata, its storage, the storage's size
// and every byte (ReshapeRecord::capture, before the operator). If the
// operator changed nothing (a resize_ to the size it has), the record is
// dropped. Otherwise:
//   * the Transaction leaves that storage out of the engines' restores and
//     live saves (its resolver hides the key): the record owns it;
//   * the re-run starts from the recorded state: the storage gets a fresh
//     allocation holding the start bytes, the tensor its start metadata;
//     the live allocation is set aside, untouched (no copy);
//   * the re-run must end where the forward ended: the same metadata, the
//     same storage size and the same bytes (a hash), else StateMutationError;
//   * finish_replay puts the live allocation and metadata back; a rollback
//     (the forward refused) puts the start state back for good.
// Where the forward already wrote that storage (an enclosing operator
// declared the write: the fused fake-quantize observer resizes its scale
// and zero point, then writes them), the start bytes are the current bytes
// with the engine's first-touch copies of what it wrote put back.

#include <ATen/ATen.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/byte_device.h"
#include "core/region_store.h"

namespace torch_replay::aten {

// What a tensor is, apart from its bytes.
struct TensorShape {
  c10::Storage storage;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  int64_t nbytes = 0;          // the storage's size
  const void* data = nullptr;  // the storage's allocation

  static TensorShape of(const c10::TensorImpl& impl);
  bool same(const TensorShape& o) const;
};

class ReshapeRecord {
 public:
  // Records `t`'s start state (before a storage-changing operator): its
  // metadata, and its storage's bytes, read from `start_bytes` if given
  // (memory on the storage's device, of the storage's size: the bytes the
  // forward started from, where the forward already wrote some).
  // Precondition: `t` is a strided tensor with a storage.
  explicit ReshapeRecord(
      const at::Tensor& t, const uint8_t* start_bytes = nullptr);
  ReshapeRecord(ReshapeRecord&&) = default;
  ReshapeRecord& operator=(ReshapeRecord&&) = default;

  c10::TensorImpl* impl() const {
    return raw_;
  }
  // Keys of the storages the record owns (the start one; the end one after
  // set_).
  StorageKey start_key() const;
  // True if the operator left the tensor as it was (drop the record).
  bool unchanged() const;
  // The forward ended: remember the end state to verify the re-run against.
  void record_end();
  StorageKey end_key() const;
  // The re-run: put the start state in (the live allocation set aside).
  void begin_replay();
  // The re-run ended: whether it left the tensor as the forward did.
  bool reproduced() const;
  // Puts the live state back after the re-run.
  void finish_replay();
  // Puts the start state back for good (the forward was refused).
  void rollback();
  // Bytes kept (the start copy).
  int64_t bytes() const;

 private:
  void install_start();

  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor_;
  c10::TensorImpl* raw_ = nullptr;
  ByteDevice* device_ = nullptr;
  TensorShape start_;
  std::unique_ptr<Blob> start_bytes_;
  TensorShape end_;
  Hash128 end_hash_;
  // Set aside during a re-run.
  bool in_replay_ = false;
  TensorShape live_;
  at::DataPtr live_data_;
  int64_t live_version_ = 0;
};

}  // namespace torch_replay::aten
