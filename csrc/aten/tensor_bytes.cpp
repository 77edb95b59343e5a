#include "aten/tensor_bytes.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>

#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "aten/byte_devices.h"

namespace torch_replay::aten {

StorageKey storage_key(const at::Tensor& t) {
  return reinterpret_cast<StorageKey>(t.storage().unsafeGetStorageImpl());
}

}  // namespace torch_replay::aten

namespace torch_replay::aten::detail {

JournalRegistry& journal_registry() {
  static JournalRegistry registry;
  return registry;
}

namespace {
struct TransientStorages {
  std::mutex mutex;
  std::map<StorageKey, WeakStorage> storages;
  std::atomic<bool> any{false};
};
TransientStorages& transient_storages() {
  static TransientStorages registry;
  return registry;
}
}  // namespace

void mark_transient_storage(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) {
    return;
  }
  auto& reg = transient_storages();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (auto it = reg.storages.begin(); it != reg.storages.end();) {
    it = it->second.expired() ? reg.storages.erase(it) : std::next(it);
  }
  reg.storages.insert_or_assign(
      storage_key(t), t.storage().getWeakStorageImpl());
  reg.any.store(true, std::memory_order_release);
}

bool is_transient_storage(StorageKey key) {
  auto& reg = transient_storages();
  if (!reg.any.load(std::memory_order_acquire)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.storages.find(key);
  return it != reg.storages.end() && !it->second.expired();
}

StorageRef ref_of(const c10::Storage& storage) {
  return {
      static_cast<uint8_t*>(storage.mutable_data()),
      static_cast<int64_t>(storage.nbytes()),
      &byte_device_for(storage.device())};
}

StorageRef resolve_weak(const WeakStorage& weak) {
  auto strong = weak.lock();
  if (!strong) {
    return {};
  }
  c10::Storage storage(std::move(strong));
  return ref_of(storage);
}

Resolver journal_resolver() {
  return [](StorageKey key) -> StorageRef {
    auto& reg = journal_registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.storages.find(key);
    return it == reg.storages.end() ? StorageRef{} : resolve_weak(it->second);
  };
}

bool observable(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() &&
         !t.is_meta() && !t.unsafeGetTensorImpl()->is_wrapped_number() &&
         t.storage().data() != nullptr;
}

bool declarable(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() &&
         !t.is_meta() && !t.unsafeGetTensorImpl()->is_wrapped_number();
}

bool sparse_parts(const at::Tensor& t, std::vector<at::Tensor>* parts) {
  if (!t.defined()) {
    return false;
  }
  const c10::Layout layout = t.layout();
  if (layout == at::kSparse) {
    auto* impl = static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
    parts->push_back(impl->indices());
    parts->push_back(impl->values());
    return true;
  }
  if (layout == at::kSparseCsr || layout == at::kSparseCsc ||
      layout == at::kSparseBsr || layout == at::kSparseBsc) {
    auto* impl = static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
    parts->push_back(impl->compressed_indices());
    parts->push_back(impl->plain_indices());
    parts->push_back(impl->values());
    return true;
  }
  return false;
}

RangeSet footprint_of(const at::Tensor& t, bool* exact) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  return strided_footprint(
      t.storage_offset(), sizes, strides, t.element_size(), kMaxRuns, exact);
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes() << " on " << t.device();
  return os.str();
}

int64_t counter_version(const c10::VariableVersion& counter) {
  return counter.enabled() ? static_cast<int64_t>(counter.current_version())
                           : 0;
}

int64_t version_of(c10::TensorImpl* impl) {
  return counter_version(impl->version_counter());
}

void set_version_of(c10::TensorImpl* impl, int64_t version) {
  c10::VariableVersion counter = impl->version_counter();
  if (counter.enabled() &&
      static_cast<int64_t>(counter.current_version()) != version) {
    counter.set_version(version);
  }
}

bool overlaps_other_view(
    const std::vector<at::Tensor>& tensors,
    const std::vector<StorageKey>& keys,
    size_t i) {
  const at::Tensor& w = tensors[i];
  bool exact_w = true;
  RangeSet fw;
  bool have_fw = false;
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (j == i || keys[j] != keys[i] || same_view(w, tensors[j])) {
      continue;
    }
    if (!have_fw) {
      fw = footprint_of(w, &exact_w);
      have_fw = true;
    }
    bool exact_r = true;
    const RangeSet fr = footprint_of(tensors[j], &exact_r);
    if (exact_w && exact_r && fw.overlaps(fr)) {
      return true;
    }
  }
  return false;
}

}  // namespace torch_replay::aten::detail
