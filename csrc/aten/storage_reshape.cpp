#include "aten/storage_reshape.h"

#include <c10/core/Allocator.h>

#include <utility>

#include "aten/byte_devices.h"
#include "aten/tensor_bytes.h"

namespace torch_replay::aten {

using namespace detail;  // NOLINT(google-build-using-namespace)

namespace {

RangeSet whole(int64_t nbytes) {
  RangeSet all;
  all.add(0, nbytes);
  return all;
}

c10::Allocator* allocator_of(c10::StorageImpl* s) {
  c10::Allocator* a = s->allocator();
  return a != nullptr ? a : c10::GetAllocator(s->device_type());
}

}  // namespace

TensorShape TensorShape::of(const c10::TensorImpl& impl) {
  TensorShape s;
  s.storage = impl.storage();
  s.sizes.assign(impl.sizes().begin(), impl.sizes().end());
  s.strides.assign(impl.strides().begin(), impl.strides().end());
  s.offset = impl.storage_offset();
  s.nbytes = static_cast<int64_t>(s.storage.nbytes());
  s.data = s.storage.data();
  return s;
}

bool TensorShape::same(const TensorShape& o) const {
  return storage.unsafeGetStorageImpl() == o.storage.unsafeGetStorageImpl() &&
         sizes == o.sizes && strides == o.strides && offset == o.offset &&
         nbytes == o.nbytes && data == o.data;
}

ReshapeRecord::ReshapeRecord(const at::Tensor& t, const uint8_t* start_bytes)
    : tensor_(t.getIntrusivePtr()),
      raw_(t.unsafeGetTensorImpl()),
      device_(&byte_device_for(t.device())),
      start_(TensorShape::of(*t.unsafeGetTensorImpl())) {
  if (start_.nbytes > 0) {
    start_bytes_ = device_->gather(
        start_bytes != nullptr ? start_bytes
                               : static_cast<const uint8_t*>(start_.data),
        whole(start_.nbytes));
  }
}

StorageKey ReshapeRecord::start_key() const {
  return reinterpret_cast<StorageKey>(start_.storage.unsafeGetStorageImpl());
}

StorageKey ReshapeRecord::end_key() const {
  return reinterpret_cast<StorageKey>(end_.storage.unsafeGetStorageImpl());
}

bool ReshapeRecord::unchanged() const {
  auto impl = tensor_.lock();
  return !impl || TensorShape::of(*impl).same(start_);
}

void ReshapeRecord::record_end() {
  auto impl = tensor_.lock();
  if (!impl) {
    return;
  }
  end_ = TensorShape::of(*impl);
  end_hash_ =
      byte_device_for(end_.storage.device())
          .hash(static_cast<const uint8_t*>(end_.data), whole(end_.nbytes));
}

void ReshapeRecord::install_start() {
  c10::StorageImpl* s = start_.storage.unsafeGetStorageImpl();
  at::DataPtr fresh =
      allocator_of(s)->allocate(static_cast<size_t>(start_.nbytes));
  if (start_.nbytes > 0) {
    device_->scatter(
        static_cast<uint8_t*>(fresh.get()),
        whole(start_.nbytes),
        *start_bytes_);
  }
  live_data_ = s->set_data_ptr(std::move(fresh));
  s->set_nbytes(static_cast<size_t>(start_.nbytes));
}

void ReshapeRecord::begin_replay() {
  auto impl = tensor_.lock();
  if (!impl) {
    return;  // the tensor is gone: nothing can read it any more
  }
  live_ = TensorShape::of(*impl);
  live_version_ = version_of(impl.get());
  install_start();
  if (impl->storage().unsafeGetStorageImpl() !=
      start_.storage.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(start_.storage);
  }
  impl->set_sizes_and_strides(start_.sizes, start_.strides, start_.offset);
  in_replay_ = true;
}

bool ReshapeRecord::reproduced() const {
  auto impl = tensor_.lock();
  if (!impl || !in_replay_) {
    return true;
  }
  TensorShape now = TensorShape::of(*impl);
  const bool same_storage = end_.storage.unsafeGetStorageImpl() !=
                                start_.storage.unsafeGetStorageImpl() ||
                            now.storage.unsafeGetStorageImpl() ==
                                start_.storage.unsafeGetStorageImpl();
  if (!same_storage || now.sizes != end_.sizes || now.strides != end_.strides ||
      now.offset != end_.offset || now.nbytes != end_.nbytes) {
    return false;
  }
  return byte_device_for(now.storage.device())
             .hash(static_cast<const uint8_t*>(now.data), whole(now.nbytes)) ==
         end_hash_;
}

void ReshapeRecord::finish_replay() {
  if (!in_replay_) {
    return;
  }
  in_replay_ = false;
  c10::StorageImpl* s = start_.storage.unsafeGetStorageImpl();
  s->set_data_ptr(std::move(live_data_));  // the re-run's allocation is freed
  s->set_nbytes(static_cast<size_t>(live_.nbytes));
  auto impl = tensor_.lock();
  if (impl) {
    if (impl->storage().unsafeGetStorageImpl() !=
        live_.storage.unsafeGetStorageImpl()) {
      impl->set_storage_keep_dtype(live_.storage);
    }
    impl->set_sizes_and_strides(live_.sizes, live_.strides, live_.offset);
    set_version_of(impl.get(), live_version_);
  }
  live_ = TensorShape();
  live_data_ = at::DataPtr();
}

void ReshapeRecord::rollback() {
  auto impl = tensor_.lock();
  install_start();
  live_data_ = at::DataPtr();  // the forward's allocation is freed
  if (impl) {
    if (impl->storage().unsafeGetStorageImpl() !=
        start_.storage.unsafeGetStorageImpl()) {
      impl->set_storage_keep_dtype(start_.storage);
    }
    impl->set_sizes_and_strides(start_.sizes, start_.strides, start_.offset);
  }
}

int64_t ReshapeRecord::bytes() const {
  return start_bytes_ ? start_bytes_->nbytes() : 0;
}

}  // namespace torch_replay::aten
