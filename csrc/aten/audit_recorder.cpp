#include "aten/audit_recorder.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <utility>

#include "aten/callback_thread.h"
#include "aten/operator_facts.h"
#include "aten/tensor_bytes.h"
#include "core/status.h"

namespace torch_replay::aten {

namespace {

std::atomic<AuditRecorder*> g_active{nullptr};

// Per-thread state of the recorder's callbacks (as the observer's
// ThreadState, Note [C++ observer]).
struct RecorderThread : CallbackThread {
  int depth = 0;
  std::vector<StorageKey> top_keys;     // storages of the depth-0 operator
  std::vector<StorageKey> top_written;  // those it declares it writes
  std::optional<at::CallbackHandle> handle;
};

RecorderThread& thread_state() {
  thread_local RecorderThread s;
  return s;
}

struct Counted : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  AuditRecorder* rec = g_active.load();
  RecorderThread& s = thread_state();
  if (rec == nullptr || s.in_callback ||
      fn.scope() != at::RecordScope::FUNCTION) {
    return nullptr;
  }
  const OpInfo& info = operator_info(fn);
  if (!info.op) {
    return nullptr;
  }
  const int depth = s.depth++;
  auto counted = std::make_unique<Counted>();
  if (rec->paused || (info.skip && depth > 0)) {
    return counted;
  }
  CallbackGuard guard(s);
  std::optional<at::Generator> generator;
  collect_arguments(
      info,
      fn.inputs(),
      /*writes_only=*/false,
      &s.tensors,
      &s.writes,
      &generator);
  try {
    if (depth == 0 && info.skip) {
      // A view (or an operator that may return one, as reshape): it reads no
      // bytes, but may make a new storage (reshape copying), which must be
      // seen as made here, and its input must be known before its output.
      top_level_keys(s.tensors, s.writes, &s.top_keys, &s.top_written);
      rec->record_view(info.display, s.tensors);
      return counted;
    }
    if (depth == 0) {
      top_level_keys(s.tensors, s.writes, &s.top_keys, &s.top_written);
      rec->record_op(info.display, s.tensors, s.writes, info.random, generator);
      return counted;
    }
    // Nested: what the observer takes from it (keep_nested_writes), and its
    // random draws.
    const c10::Device device = first_device(s.tensors);
    const bool random = info.random || generator.has_value();
    keep_nested_writes(&s.tensors, &s.writes, s.top_keys, s.top_written);
    if (!s.tensors.empty() || random) {
      rec->record_nested(s.tensors, s.writes, random, generator, device);
    }
  } catch (...) {
    // Never throw out of a dispatcher callback; the audit is then incomplete.
  }
  return counted;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) {
    return;
  }
  RecorderThread& s = thread_state();
  const int depth = --s.depth;
  AuditRecorder* rec = g_active.load();
  if (rec == nullptr || s.in_callback || depth > 0 || rec->paused) {
    return;
  }
  CallbackGuard guard(s);
  for (const c10::IValue& v : fn.outputs()) {
    flatten_tensors(v, false, &s.tensors, &s.writes);
  }
  try {
    rec->record_outputs(s.tensors);
  } catch (...) {
  }
}

std::string geometry_key(const at::Tensor& t, int64_t storage) {
  std::ostringstream os;
  os << storage << ':' << static_cast<int>(t.scalar_type()) << ':'
     << t.storage_offset() << ':' << t.sizes() << ':' << t.strides();
  return os.str();
}

bool is_float(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) ||
         at::isComplexType(t.scalar_type());
}

}  // namespace

RangeSet tensor_footprint(const at::Tensor& t, bool* exact) {
  return detail::footprint_of(t, exact);
}

int64_t overlapping_write(
    const std::vector<at::Tensor>& tensors, const std::vector<bool>& writes) {
  std::vector<StorageKey> keys(tensors.size(), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    StorageKey key = 0;
    if (observable_key(tensors[i], &key)) {
      keys[i] = key;
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (writes[i] && keys[i] != 0 &&
        detail::overlaps_other_view(tensors, keys, i)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

AuditRecorder::~AuditRecorder() {
  try {
    stop();
  } catch (...) {
  }
}

void AuditRecorder::start() {
  AuditRecorder* expected = nullptr;
  if (!g_active.compare_exchange_strong(expected, this)) {
    throw ReplayException(
        ErrorKind::kUnsupported,
        "torch_replay.audit: another audit is recording in this process; "
        "audits cannot nest or run concurrently",
        0);
  }
  active_ = true;
  RecorderThread& s = thread_state();
  s.depth = 0;
  if (!s.handle.has_value()) {
    s.handle = add_operator_callback(on_start, on_end);
  }
}

void AuditRecorder::stop() {
  if (!active_) {
    return;
  }
  active_ = false;
  RecorderThread& s = thread_state();
  if (s.handle.has_value()) {
    at::removeCallback(*s.handle);
    s.handle.reset();
  }
  s.depth = 0;
  AuditRecorder* expected = this;
  g_active.compare_exchange_strong(expected, nullptr);
}

int64_t AuditRecorder::id_of(const at::Tensor& t) {
  StorageKey key = 0;
  if (!observable_key(t, &key)) {
    return -1;
  }
  auto [it, fresh] = ids_.emplace(key, static_cast<int64_t>(storages_.size()));
  if (fresh) {
    held_.push_back(t.storage().getWeakStorageImpl());
    AuditStorage st;
    st.dtype = t.scalar_type();
    st.shape.assign(t.sizes().begin(), t.sizes().end());
    storages_.push_back(std::move(st));
  }
  return it->second;
}

int64_t AuditRecorder::storage_id(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  return id_of(t);
}

int64_t AuditRecorder::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(ops_.size());
}

void AuditRecorder::add_access(
    const at::Tensor& t, int64_t storage, bool write, bool nested) {
  AuditAccess a;
  a.op = static_cast<int64_t>(ops_.size()) - 1;
  a.storage = storage;
  a.write = write;
  a.nested = nested;
  a.requires_grad = t.requires_grad();
  a.floating = is_float(t);
  a.dtype = t.scalar_type();
  auto [it, fresh] = view_ids_.emplace(
      geometry_key(t, storage), static_cast<int64_t>(view_ids_.size()));
  a.view = it->second;
  a.footprint = tensor_footprint(t, &a.exact);
  accesses_.push_back(std::move(a));
}

void AuditRecorder::record_op(
    const std::string& display,
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool random,
    const std::optional<at::Generator>& generator) {
  std::lock_guard<std::mutex> lock(mutex_);
  AuditOp op;
  op.name = name_index(display);
  ops_.push_back(op);
  c10::Device device(c10::kCPU);
  bool have_device = false;
  std::vector<int64_t> index(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.defined() && !have_device) {
      device = t.device();
      have_device = true;
    }
    const int64_t id = id_of(t);
    if (id >= 0) {
      index[i] = static_cast<int64_t>(accesses_.size());
      add_access(t, id, writes[i], false);
    }
  }
  AuditOp& rec = ops_.back();
  if (random || generator.has_value()) {
    rec.random = true;
    rec.generator =
        generator.has_value()
            ? reinterpret_cast<uint64_t>(generator->unsafeGetGeneratorImpl())
            : 0;
    rec.device = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  }
  const int64_t w = overlapping_write(tensors, writes);
  if (w >= 0) {
    rec.overlap = index[w];
  }
}

int64_t AuditRecorder::name_index(const std::string& display) {
  auto [it, fresh] =
      op_index_.emplace(display, static_cast<int64_t>(op_names_.size()));
  if (fresh) {
    op_names_.push_back(display);
  }
  return it->second;
}

void AuditRecorder::record_view(
    const std::string& display, const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> lock(mutex_);
  AuditOp op;
  op.name = name_index(display);
  ops_.push_back(op);
  for (const at::Tensor& t : tensors) {
    id_of(t);
  }
}

void AuditRecorder::record_nested(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool random,
    const std::optional<at::Generator>& generator,
    const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ops_.empty()) {
    return;
  }
  std::vector<int64_t> index(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t id = id_of(tensors[i]);
    if (id >= 0) {
      index[i] = static_cast<int64_t>(accesses_.size());
      add_access(tensors[i], id, writes[i], true);
    }
  }
  AuditOp& op = ops_.back();
  // The Transaction applies its overlap rule to these writes too.
  const int64_t w = overlapping_write(tensors, writes);
  if (w >= 0 && op.overlap < 0) {
    op.overlap = index[w];
  }
  if (random && !op.random) {
    op.random = true;
    op.device = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  }
  if (generator.has_value() && op.generator == 0) {
    op.generator =
        reinterpret_cast<uint64_t>(generator->unsafeGetGeneratorImpl());
  }
}

void AuditRecorder::record_outputs(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t op = static_cast<int64_t>(ops_.size()) - 1;
  for (const at::Tensor& t : outputs) {
    StorageKey key = 0;
    if (!observable_key(t, &key) || ids_.count(key)) {
      continue;
    }
    const int64_t id = id_of(t);
    storages_[id].created = op;
  }
}

bool AuditRecorder::overlap(
    const std::vector<int64_t>& a,
    const std::vector<int64_t>& b,
    bool other_view) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto n = static_cast<int64_t>(accesses_.size());
  auto check = [n](int64_t i) {
    if (i < 0 || i >= n) {
      throw ReplayException(
          ErrorKind::kInvalidArgument, "audit: no such access index", 0);
    }
  };
  if (other_view) {
    for (int64_t i : a) {
      check(i);
      for (int64_t j : b) {
        check(j);
        const AuditAccess& x = accesses_[i];
        const AuditAccess& y = accesses_[j];
        if (x.storage == y.storage && x.view != y.view &&
            x.footprint.overlaps(y.footprint)) {
          return true;
        }
      }
    }
    return false;
  }
  RangeSet ra;
  RangeSet rb;
  for (int64_t i : a) {
    check(i);
    ra.add(accesses_[i].footprint);
  }
  for (int64_t j : b) {
    check(j);
    rb.add(accesses_[j].footprint);
  }
  return ra.overlaps(rb);
}

}  // namespace torch_replay::aten
