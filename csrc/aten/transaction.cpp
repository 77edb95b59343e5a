#include "aten/transaction.h"

#include <ATen/Context.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <utility>

#include "aten/byte_devices.h"
#include "aten/tensor_bytes.h"
#include "aten/write_watch.h"
#include "core/status.h"

namespace torch_replay::aten {

using namespace detail;  // NOLINT(google-build-using-namespace)

namespace {

// What a tensor is, for an error that refuses it: "a meta tensor", "a
// nested tensor", "a quantized tensor", "a sparse_csr tensor", ...
std::string kind_of_tensor(const at::Tensor& t) {
  if (!t.defined()) {
    return "an undefined tensor";
  }
  if (t.is_meta()) {
    return "a meta tensor (shapes only, no bytes)";
  }
  if (t.is_nested()) {
    return "a nested tensor";
  }
  if (t.is_quantized()) {
    return "a quantized tensor";
  }
  if (t.layout() != at::kStrided) {
    return "a " + c10::str(t.layout()) + " tensor";
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return "a wrapped Python number";
  }
  return "a tensor without storage (" + c10::str(t.device()) + ")";
}

bool has_sparse(const std::vector<at::Tensor>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.defined() && t.layout() != at::kStrided;
  });
}

}  // namespace

Transaction::Transaction(
    TransactionOptions options,
    std::vector<at::Tensor> tensors,
    std::vector<std::string> tensor_names,
    std::vector<at::Generator> generators,
    std::vector<std::string> generator_names)
    : options_(std::move(options)), requested_(parse_engine(options_.engine)) {
  TORCH_CHECK(
      tensors.size() == tensor_names.size() &&
          generators.size() == generator_names.size(),
      "Transaction: names must match the state");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!declarable(t)) {
      throw ReplayException(
          ErrorKind::kUnsupported,
          "state entry '" + tensor_names[i] + "' is " + kind_of_tensor(t) +
              ": torch_replay preserves strided tensors with storage (their "
              "storage's bytes). Declare its strided parts instead (for a "
              "sparse tensor: its values and indices), or leave it "
              "undeclared and do not modify it before backward.");
    }
    byte_device_for(t.device());  // refuses unsupported devices early
    auto& d = declared_[storage_key(t)];
    if (!d.storage) {
      d.storage = t.storage();
      d.name = tensor_names[i];
    }
    d.tensors.push_back(t);
  }
  for (size_t i = 0; i < generators.size(); ++i) {
    declared_generators_.emplace_back(generators[i], generator_names[i]);
  }
}

Transaction::~Transaction() {
  try {
    release();
  } catch (...) {
  }
}

StorageRef Transaction::resolve(StorageKey key) const {
  auto d = declared_.find(key);
  if (d != declared_.end()) {
    return ref_of(d->second.storage);
  }
  auto e = written_external_.find(key);
  if (e != written_external_.end()) {
    return resolve_weak(e->second.storage);
  }
  return journal_resolver()(key);
}

Resolver Transaction::resolver() const {
  return [this](StorageKey key) { return resolve(key); };
}

Resolver Transaction::byte_resolver() const {
  if (reshaped_keys_.empty()) {
    return resolver();
  }
  return [this](StorageKey key) {
    return reshaped(key) ? StorageRef{} : resolve(key);
  };
}

// ------------------------------------------- storage-changing writes

void Transaction::before_reshape(const at::Tensor& t) {
  if (phase_ != Phase::kForward || !declarable(t)) {
    return;  // (a re-run's own resize is verified by its end state)
  }
  const StorageKey key = storage_key(t);
  // No bytes to journal yet, but its version counter moves: counted (Note
  // [Unseen writes]).
  RegionJournal::global().count_write(key);
  if (internal_.count(key)) {
    return;  // a storage the segment made
  }
  for (const auto* records : {&reshaped_, &reshape_pending_}) {
    for (const auto& r : *records) {
      if (r.impl() == t.unsafeGetTensorImpl()) {
        return;  // its start state is recorded
      }
    }
  }
  external_.emplace(key, t.storage().getWeakStorageImpl());
  if (!declared_.count(key)) {
    written_external_.insert_or_assign(key, External(t));
  }
  if (!writes_.count(key) || !observable(t)) {
    reshape_pending_.emplace_back(t);
    return;
  }
  // The forward wrote some of these bytes (or an enclosing operator declared
  // it will): the start bytes are the current ones with the first-touch
  // copies of what it wrote put back (every engine keeps those until the
  // forward ends, to roll a refused forward back).
  const int64_t nbytes = static_cast<int64_t>(t.storage().nbytes());
  at::Tensor scratch =
      at::empty({nbytes}, at::TensorOptions(at::kByte).device(t.device()));
  ByteDevice& device = byte_device_for(t.device());
  RangeSet all;
  all.add(0, nbytes);
  auto copy =
      device.gather(static_cast<const uint8_t*>(t.storage().data()), all);
  const StorageRef start{scratch.data_ptr<uint8_t>(), nbytes, &device};
  device.scatter(start.base, all, *copy);
  const Resolver only = [&](StorageKey k) {
    return k == key ? start : StorageRef{};
  };
  if (engine_) {
    engine_->rollback(only);
  }
  if (reads_engine_) {
    reads_engine_->rollback(only);
  }
  implicit_.restore_all(only);
  reshape_pending_.emplace_back(t, start.base);
}

void Transaction::after_reshape() {
  std::vector<ReshapeRecord> pending = std::move(reshape_pending_);
  reshape_pending_.clear();
  for (ReshapeRecord& record : pending) {
    if (record.unchanged()) {
      continue;  // e.g. a resize_ to the size it has
    }
    reshaped_keys_.insert(record.start_key());
    reshaped_.push_back(std::move(record));
  }
}

void Transaction::observe_reshape_before(const at::Tensor& t) noexcept {
  keep_pending([&] { before_reshape(t); });
}

void Transaction::observe_reshape_after() noexcept {
  keep_pending([&] { after_reshape(); });
}

void Transaction::fail(
    ErrorKind kind, const std::string& msg, StorageKey key) const {
  throw ReplayException(kind, msg, key);
}

// Phase checks reachable from Python (re-entry of a segment from inside its
// own forward or replay, a backward through it started inside it) raise a
// named error instead of an internal assert.
void Transaction::require_phase(bool ok, const char* action) const {
  if (ok) {
    return;
  }
  static const char* const kPhaseNames[] = {
      "not started",
      "running its forward",
      "done with its forward",
      "re-running",
      "released"};
  fail(
      ErrorKind::kUnsupported,
      std::string("torch_replay: cannot ") + action +
          " of a checkpointed segment that is " +
          kPhaseNames[static_cast<int>(phase_)] +
          ". This happens when a segment is re-entered from inside its own "
          "forward or re-run (for example a backward through its outputs "
          "started inside it). Restructure the code so that the segment's "
          "gradients are taken after it returns, or call it without "
          "checkpoint.",
      0);
}

// ---------------------------------------------------------------- forward

void Transaction::begin_forward(
    const std::vector<at::Tensor>& inputs,
    const std::vector<c10::Device>& rng_devices) {
  require_phase(phase_ == Phase::kIdle, "start the forward");
  // At the level that watches only what autograd saves ("saved"), the tensor
  // arguments are watched too, as torch's checkpoint does: a segment reads
  // them, and one changed in place before backward would be re-run on other
  // values. (The other levels watch or preserve every read.)
  const bool watch_inputs = !options_.watch_reads && !options_.preserve_reads;
  for (const auto& t : inputs) {
    if (observable(t)) {
      const StorageKey key = storage_key(t);
      external_.emplace(key, t.storage().getWeakStorageImpl());
      if (watch_inputs && declared_.count(key) == 0) {
        reads_of_freed_.push_back(watch(t, key));
      }
    }
  }
  for (const auto& [key, d] : declared_) {
    external_.emplace(key, d.storage.getWeakStorageImpl());
  }
  for (const auto& [gen, name] : declared_generators_) {
    generators_.track(gen, name);
  }
  if (options_.preserve_rng_state) {
    generators_.track(
        at::detail::getDefaultCPUGenerator(), "the default CPU generator");
    for (const auto& device : rng_devices) {
      track_default_generator(device);
    }
  }
  // auto without declared state has nothing to keep: the guard, unwatched.
  const EngineKind kind = requested_ == EngineKind::kAuto && declared_.empty()
                              ? EngineKind::kGuard
                              : requested_;
  const Proof proof =
      options_.verify_bytes ? Proof::kHashes : Proof::kWriteMarks;
  engine_ = make_engine(kind, RegionJournal::global(), proof);
  if (kind == EngineKind::kJournal || kind == EngineKind::kAuto) {
    auto& reg = journal_registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (const auto& [key, d] : declared_) {
      reg.storages.insert_or_assign(key, d.storage.getWeakStorageImpl());
    }
  }
  for (const auto& [key, d] : declared_) {
    engine_->declare(key, ref_of(d.storage));
  }
  if (options_.preserve_reads) {
    reads_engine_ =
        make_engine(EngineKind::kJournal, RegionJournal::global(), proof);
  }
  if (kind == EngineKind::kJournal || kind == EngineKind::kAuto ||
      options_.preserve_reads || marks_writes()) {
    // Writes outside any segment are journaled too (Note [Write watch]).
    write_watch_acquire();
    watching_writes_ = true;
  }
  phase_ = Phase::kForward;
}

void Transaction::record_accounted() {
  accounted_.clear();
  const RegionJournal& journal = RegionJournal::global();
  const EngineKind kind = engine_->kind();
  if (kind == EngineKind::kJournal || kind == EngineKind::kGuard) {
    for (const auto& [key, d] : declared_) {
      if (footprint_.count(key) == 0) {
        continue;  // not accessed: nothing the re-run reads depends on it
      }
      const int64_t shown = journal.writes_shown(key);
      for (const auto& t : d.tensors) {
        c10::VariableVersion counter =
            t.unsafeGetTensorImpl()->version_counter();
        const int64_t version = counter_version(counter);
        accounted_.push_back(
            Accounted{std::move(counter), version, shown, key});
      }
    }
  }
  for (auto& [key, counter] : preserved_counters_) {
    accounted_.push_back(
        Accounted{
            counter, counter_version(counter), journal.writes_shown(key), key});
  }
  preserved_counters_.clear();
}

void Transaction::track_default_generator(const c10::Device& device) {
  if (device.is_cpu()) {
    generators_.track(
        at::detail::getDefaultCPUGenerator(), "the default CPU generator");
    return;
  }
  const auto& gen = at::globalContext().defaultGenerator(device);
  generators_.track(gen, "the default generator of " + device.str());
}

void Transaction::before_op(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool random,
    const std::optional<at::Generator>& generator,
    bool nested,
    const std::vector<bool>& returned) {
  TORCH_INTERNAL_ASSERT(tensors.size() == writes.size());
  TORCH_INTERNAL_ASSERT(returned.empty() || returned.size() == writes.size());
  if (has_sparse(tensors)) {
    // Observed as the strided parts (Note [Sparse tensors]), and refused if
    // it writes a sparse tensor that existed before the segment.
    std::vector<at::Tensor> parts;
    std::vector<bool> part_writes, part_returned;
    const StorageKey refused = expand_sparse(
        tensors, writes, returned, &parts, &part_writes, &part_returned);
    // (The accesses are recorded before the refusal: the operator may run
    // anyway, and the rollback then restores what it wrote in place.)
    before_op(parts, part_writes, random, generator, nested, part_returned);
    if (refused != 0) {
      fail(
          ErrorKind::kUnsupported,
          "the segment writes a sparse tensor that existed before it: a "
          "sparse write may replace the tensor's indices and values instead "
          "of writing them, and the re-run could not start again from the "
          "forward's. Write a copy (t = t.clone() before the segment, or out "
          "of place inside it), or keep that write outside the checkpointed "
          "segment.",
          refused);
    }
    return;
  }
  const bool replay = phase_ == Phase::kReplay;
  require_phase(replay || phase_ == Phase::kForward, "observe an operator");
  if (!nested) {
    // Before the operator allocates its results (Note [Storage keys]).
    forget_dead(replay ? replay_internal_ : internal_);
  }
  const bool tainted_read = scan_arguments(tensors, writes, replay);
  if (!nested) {
    last_op_tainted_ = tainted_read;
  }
  if (random || generator.has_value()) {
    note_random_op(tensors, generator, replay);
  }
  record_accesses(tensors, writes, replay);
  refuse_writes(tensors, writes, returned, tainted_read, replay);
}

bool Transaction::scan_arguments(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool replay) {
  // Keys, devices, and grad taint of the reads; whether each storage is the
  // segment's own (made by it), looked up once for both loops.
  std::vector<StorageKey>& keys = keys_scratch_;  // (callbacks never nest)
  std::vector<char>& own = own_scratch_;
  keys.assign(tensors.size(), 0);
  own.assign(tensors.size(), 0);
  bool tainted_read = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!observable(t)) {
      continue;
    }
    const StorageKey key = storage_key(t);
    keys[i] = key;
    own[i] =
        replay ? replay_internal_.count(key) > 0 : internal_.count(key) > 0;
    if (!replay) {
      const c10::Device device = t.device();
      if (std::find(devices_seen_.begin(), devices_seen_.end(), device) ==
          devices_seen_.end()) {
        devices_seen_.push_back(device);
      }
      if (!own[i] && !external_.count(key)) {
        external_.emplace(key, t.storage().getWeakStorageImpl());
      }
      if (!tainted_read && !writes[i] && at::isFloatingType(t.scalar_type())) {
        tainted_read = t.requires_grad();
        if (!tainted_read) {
          auto it = grad_tainted_.find(t.unsafeGetTensorImpl());
          tainted_read = it != grad_tainted_.end() && !it->second.expired();
        }
      }
    }
  }
  return tainted_read;
}

void Transaction::note_random_op(
    const std::vector<at::Tensor>& tensors,
    const std::optional<at::Generator>& generator,
    bool replay) {
  c10::Device device(c10::kCPU);
  for (const auto& t : tensors) {
    if (t.defined()) {
      device = t.device();
      break;
    }
  }
  if (replay) {
    note_replay_draw(device, generator);
  } else {
    track_random_use(device, generator);
  }
}

void Transaction::record_accesses(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool replay) {
  const std::vector<StorageKey>& keys = keys_scratch_;
  const std::vector<char>& own = own_scratch_;
  std::exception_ptr refused;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (keys[i] == 0) {
      continue;
    }
    const StorageKey key = keys[i];
    const bool declared = !declared_.empty() && declared_.count(key) > 0;
    const bool interesting = replay ? !own[i] : (declared || !own[i]);
    if (!interesting ||
        (declared && !writes[i] && read_whole(tensors[i], key))) {
      continue;
    }
    // A read of undeclared state needs its bytes only to be preserved
    // (detect="preserve"); otherwise its version counter is all it costs.
    if (!writes[i] && !declared && (replay || !reads_engine_)) {
      if (!replay) {
        forward_access(tensors[i], key, RangeSet(), false);
      }
      continue;
    }
    RangeSet fp = footprint_of(tensors[i]);
    // Every access is recorded (its bytes saved) even if an earlier one is
    // refused: the operator may run anyway (Note [C++ observer]).
    try {
      if (replay) {
        replay_access(tensors[i], key, fp, writes[i]);
      } else {
        forward_access(tensors[i], key, fp, writes[i]);
      }
    } catch (const ReplayException&) {
      if (!refused) {
        refused = std::current_exception();
      }
    }
  }
  if (refused) {
    std::rethrow_exception(refused);
  }
}

void Transaction::refuse_writes(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    const std::vector<bool>& returned,
    bool tainted_read,
    bool replay) {
  const std::vector<StorageKey>& keys = keys_scratch_;
  // Refuse raw overlapping writes and float gradients through integer writes
  // (after the accesses above are recorded, so that a rollback restores them).
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!writes[i] || keys[i] == 0) {
      continue;
    }
    const at::Tensor& w = tensors[i];
    const bool carried = returned.empty() || returned[i];
    if (!replay && tainted_read && carried &&
        !at::isFloatingType(w.scalar_type()) &&
        !at::isComplexType(w.scalar_type())) {
      fail(
          ErrorKind::kUnsupported,
          "the segment writes a value that requires a float gradient into an "
          "integer tensor (" +
              describe(w) +
              "): no gradient can flow through an integer write. Detach the "
              "value before the write, or keep that tensor floating point.",
          keys[i]);
    }
    if (overlaps_other_view(tensors, keys, i)) {
      fail(
          ErrorKind::kOverlap,
          "an operation writes " + describe(w) +
              " while reading an overlapping but different view of the same "
              "memory: the result would depend on the order of element "
              "updates. Clone the source first (e.g. x[1:].copy_(x[:-1]."
              "clone())).",
          keys[i]);
    }
  }
}

void Transaction::forward_access(
    const at::Tensor& t, StorageKey key, const RangeSet& fp, bool write) {
  if (reshaped(key)) {
    // Its whole start state is recorded (Note [Storage-changing writes]);
    // the re-run's end bytes are verified against these.
    footprint_[key].add(fp);
    if (write) {
      writes_[key].add(fp);
    }
    return;
  }
  auto d = declared_.find(key);
  if (d != declared_.end()) {
    const StorageRef ref = ref_of(d->second.storage);
    RangeSet& seen =
        footprint_[key];  // (a std::map: the reference stays valid)
    seen.add(fp);
    // An operator that writes an argument may also read it first.
    engine_->access(key, ref, fp, write ? Access::kReadWrite : Access::kRead);
    if (write) {
      writes_[key].add(fp);
      RegionJournal::global().record_if_watched(key, ref, fp);
    }
    note_whole(t, key, seen);
    return;
  }
  // A storage that existed before the segment.
  if (write) {
    auto ext = written_external_.find(key);
    if (ext == written_external_.end() || ext->second.storage.expired()) {
      written_external_.insert_or_assign(key, External(t));
    }
    const StorageRef ref = ref_of(t.storage());
    implicit_.save(key, ref, fp);
    footprint_[key].add(fp);
    writes_[key].add(fp);
    RegionJournal::global().record_if_watched(key, ref, fp);
  } else if (reads_engine_ && !is_transient_storage(key)) {
    // Only bytes the segment has not written yet are read from before it
    // (a read of its own write is reproduced by the re-run itself). A hash of
    // bytes it wrote would be a hash of no value the journal can restore, and
    // the re-run would be refused for a bypass that never happened.
    auto w = writes_.find(key);
    if (w == writes_.end()) {
      preserve_read(t, key, fp);
    } else if (RangeSet exposed = fp.subtract(w->second); !exposed.empty()) {
      preserve_read(t, key, exposed);
    }
  } else if (options_.watch_reads || reads_engine_) {
    // (Under preserve_reads, a transient storage: Note [Transient storages].)
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto it = reads_.find(impl);
    if (it != reads_.end() && !it->second.impl.expired()) {
      return;  // already watched
    }
    if (it != reads_.end()) {  // the address was reused: keep the old counter
      reads_of_freed_.push_back(std::move(it->second));
      reads_.erase(it);
    }
    reads_.emplace(impl, watch(t, key));
  }
}

bool Transaction::read_whole(const at::Tensor& t, StorageKey key) const {
  auto it = whole_.find(key);
  if (it == whole_.end()) {
    return false;
  }
  const c10::Storage& st = t.storage();
  return it->second.data == st.data() &&
         it->second.nbytes == static_cast<int64_t>(st.nbytes()) &&
         !reshaped(key);
}

void Transaction::note_whole(
    const at::Tensor& t, StorageKey key, const RangeSet& seen) {
  const int64_t nbytes = static_cast<int64_t>(t.storage().nbytes());
  const std::vector<ByteRange>& r = seen.ranges();
  if (r.size() == 1 && r[0].begin <= 0 && r[0].end >= nbytes) {
    whole_.insert_or_assign(key, Whole{t.storage().data(), nbytes});
  }
}

void Transaction::preserve_read(
    const at::Tensor& t, StorageKey key, const RangeSet& fp) {
  const StorageRef ref = ref_of(t.storage());
  if (preserved_.insert(key).second) {
    {
      auto& reg = journal_registry();
      std::lock_guard<std::mutex> lock(reg.mutex);
      reg.storages.insert_or_assign(key, t.storage().getWeakStorageImpl());
    }
    written_external_.insert_or_assign(key, External(t));
    reads_engine_->declare(key, ref);
    preserved_counters_.emplace_back(
        key, t.unsafeGetTensorImpl()->version_counter());
  }
  reads_engine_->access(key, ref, fp, Access::kRead);
}

StorageKey Transaction::expand_sparse(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    const std::vector<bool>& returned,
    std::vector<at::Tensor>* parts,
    std::vector<bool>* part_writes,
    std::vector<bool>* part_returned) {
  const bool forward = phase_ == Phase::kForward;
  StorageKey refused = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t first = parts->size();
    if (!sparse_parts(tensors[i], parts)) {
      parts->push_back(tensors[i]);
    }
    part_writes->resize(parts->size(), writes[i]);
    part_returned->resize(parts->size(), returned.empty() || returned[i]);
    if (!forward || first + 1 == parts->size()) {
      continue;
    }
    for (size_t j = first; j < parts->size(); ++j) {
      const at::Tensor& part = (*parts)[j];
      if (!observable(part) || internal_.count(storage_key(part))) {
        continue;
      }
      const StorageKey key = storage_key(part);
      if (writes[i] && refused == 0) {
        refused = key;
        sparse_starts_.emplace_back(
            tensors[i],
            std::vector<at::Tensor>(parts->begin() + first, parts->end()));
      }
      if (!reads_engine_ && !declared_.count(key)) {
        external_.emplace(key, part.storage().getWeakStorageImpl());
        RangeSet all;
        all.add(0, static_cast<int64_t>(part.storage().nbytes()));
        sparse_reads_.add(key, ref_of(part.storage()), all);
      }
    }
  }
  return refused;
}

void Transaction::after_op(
    const std::vector<at::Tensor>& outputs, bool differentiable) {
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.layout() != at::kStrided) {
      std::vector<at::Tensor> parts;
      for (const at::Tensor& o : outputs) {
        if (!sparse_parts(o, &parts)) {
          parts.push_back(o);
        }
      }
      after_op(parts, differentiable);
      return;
    }
  }
  const bool replay = phase_ == Phase::kReplay;
  for (const auto& t : outputs) {
    if (!observable(t)) {
      continue;
    }
    const StorageKey key = storage_key(t);
    if (replay) {
      if (!footprint_.count(key) && !declared_.count(key) &&
          !live_.saved(key).bytes() && !external_.count(key)) {
        replay_internal_.emplace(key, t.storage().getWeakStorageImpl());
      }
      continue;
    }
    if (!external_.count(key)) {
      internal_.emplace(key, t.storage().getWeakStorageImpl());
    }
    // (An output that requires grad shows it itself; the map is for outputs
    // made under no_grad, as in the reentrant forward.)
    if (last_op_tainted_ && differentiable && !t.requires_grad() &&
        (at::isFloatingType(t.scalar_type()) ||
         at::isComplexType(t.scalar_type()))) {
      grad_tainted_.insert_or_assign(
          t.unsafeGetTensorImpl(),
          c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
              t.getIntrusivePtr()));
    }
  }
}

void Transaction::forget_dead(StorageMap& made) {
  std::vector<StorageKey>& dead = dead_scratch_;
  dead.clear();
  for (const auto& [key, weak] : made) {
    if (weak.expired()) {
      dead.push_back(key);
    }
  }
  for (StorageKey key : dead) {
    made.erase(key);  // frees the StorageImpl (Note [Storage keys])
  }
}

Transaction::External::External(const at::Tensor& t)
    : storage(t.storage().getWeakStorageImpl()) {
  if (t.storage().allocator() == nullptr) {
    foreign = t.storage();
  }
}

Transaction::Watched Transaction::watch(const at::Tensor& t, StorageKey key) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return Watched{
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
          t.getIntrusivePtr()),
      impl->version_counter(),
      version_of(impl),
      key};
}

void Transaction::record_saved(const at::Tensor& t) {
  if (!observable(t) || declared_.count(storage_key(t)) ||
      preserved_.count(storage_key(t))) {
    return;
  }
  saved_.push_back(watch(t, storage_key(t)));
}

void Transaction::end_forward() {
  require_phase(phase_ == Phase::kForward, "end the forward");
  // A declared generator must live on a device the segment used.
  for (const auto& [gen, name] : declared_generators_) {
    const auto device = gen.device();
    bool used = std::any_of(
        devices_seen_.begin(), devices_seen_.end(), [&](const c10::Device& d) {
          return d.type() == device.type() &&
                 (!device.has_index() || !d.has_index() ||
                  d.index() == device.index());
        });
    if (!used && !devices_seen_.empty()) {
      abort_forward();
      fail(
          ErrorKind::kInvalidArgument,
          "state declares " + name + " on " + device.str() +
              ", a device the segment never used; declare the generator the "
              "segment draws from (or remove it from state)",
          0);
    }
  }
  if (requested_ == EngineKind::kGuard) {
    for (const auto& [key, ranges] : writes_) {
      if (declared_.count(key)) {
        const std::string name = declared_.at(key).name;
        abort_forward();
        fail(
            ErrorKind::kStateMutation,
            "engine='guard' keeps nothing, but the segment writes declared "
            "state '" +
                name + "'; use engine='journal', 'readset' or 'snapshot'",
            key);
      }
    }
  }
  engine_->end_forward();
  if (reads_engine_) {
    reads_engine_->end_forward();
    // A tensor saved for backward before its operator reported reading it
    // (the Python observer: autograd saves before a TorchDispatchMode sees the
    // operator) is preserved, not checked, as under the C++ observer.
    saved_.erase(
        std::remove_if(
            saved_.begin(),
            saved_.end(),
            [this](const Watched& w) { return preserved_.count(w.key) > 0; }),
        saved_.end());
  }
  if (watching_writes_ && engine_->kind() != EngineKind::kJournal &&
      !reads_engine_ && !marks_writes()) {
    write_watch_release();  // auto became the guard: nothing to watch
    watching_writes_ = false;
  }
  generators_.record_end();
  for (auto& r : reshaped_) {
    r.record_end();
  }
  record_accounted();
  // B_T where the forward wrote, or everywhere it looked (Note [Verification
  // levels]).
  for (const auto& [key, ranges] :
       options_.verify_bytes ? footprint_ : writes_) {
    auto e = written_external_.find(key);
    if (e != written_external_.end() && e->second.storage.expired()) {
      continue;  // freed since: nothing can read it any more (see External)
    }
    end_hashes_.add(key, resolve(key), ranges);
  }
  // Reads are checked for changes after the forward (its own writes count).
  for (auto& [impl, w] : reads_) {
    w.version = counter_version(w.counter);
  }
  for (auto& w : reads_of_freed_) {
    w.version = counter_version(w.counter);
  }
  // Whether the segment made a storage is asked only while its forward runs
  // (Note [Storage keys]): the storages it made are let go now, not at the
  // backward. (Freed, not cleared: the table's memory goes too.)
  StorageMap().swap(internal_);
  decltype(grad_tainted_)().swap(grad_tainted_);
  phase_ = Phase::kForwardDone;
}

void Transaction::rollback() {
  const Resolver r = byte_resolver();
  if (engine_) {
    engine_->rollback(r);
  }
  if (reads_engine_) {
    reads_engine_->rollback(r);
  }
  implicit_.restore_all(r);
  for (auto it = reshaped_.rbegin(); it != reshaped_.rend(); ++it) {
    it->rollback();
  }
  for (auto& [sparse, parts] : sparse_starts_) {
    std::vector<at::Tensor> now;
    sparse_parts(sparse, &now);
    if (now.size() == parts.size() &&
        std::equal(now.begin(), now.end(), parts.begin(), [](auto& a, auto& b) {
          return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
        })) {
      continue;
    }
    if (sparse.layout() == at::kSparse) {
      static_cast<at::SparseTensorImpl*>(sparse.unsafeGetTensorImpl())
          ->set_indices_and_values_unsafe(parts[0], parts[1]);
    } else {
      static_cast<at::SparseCsrTensorImpl*>(sparse.unsafeGetTensorImpl())
          ->set_member_tensors(parts[0], parts[1], parts[2], sparse.sizes());
    }
  }
  sparse_starts_.clear();
  generators_.set_start();
}

void Transaction::abort_forward() {
  if (phase_ != Phase::kForward && phase_ != Phase::kForwardDone) {
    return;
  }
  rollback();
  release();
}

// ---------------------------------------------------------- introspection

int64_t Transaction::retained_bytes() const {
  int64_t reshaped = 0;
  for (const auto& r : reshaped_) {
    reshaped += r.bytes();
  }
  return reshaped + implicit_.bytes() +
         (engine_ ? engine_->retained_bytes() : 0) +
         (reads_engine_ ? reads_engine_->retained_bytes() : 0);
}

void Transaction::track_random_use(
    const c10::Device& device, const std::optional<at::Generator>& generator) {
  if (generator.has_value()) {
    if (options_.preserve_rng_state && !generators_.tracks(*generator)) {
      generators_.track(
          *generator,
          "an explicit generator on " + generator->device().str() +
              " passed as generator=");
    }
    generators_.mark_drawn(*generator);  // Note [Generator draws by thread]
  } else {
    if (options_.preserve_rng_state) {
      track_default_generator(device);
    }
    generators_.mark_drawn(default_generator(device));
  }
}

void Transaction::note_replay_draw(
    const c10::Device& device, const std::optional<at::Generator>& generator) {
  generators_.mark_replay_drawn(
      generator.has_value() ? *generator : default_generator(device));
}

at::Generator Transaction::default_generator(const c10::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator()
                         : at::globalContext().defaultGenerator(device);
}

template <typename F>
void Transaction::keep_pending(F&& f) noexcept {
  try {
    f();
  } catch (...) {
    if (!pending_) {
      pending_ = std::current_exception();  // the first error wins
    }
  }
}

void Transaction::observe_random(
    const c10::Device& device,
    const std::optional<at::Generator>& generator) noexcept {
  if (phase_ == Phase::kReplay) {
    keep_pending([&] { note_replay_draw(device, generator); });
  } else if (phase_ == Phase::kForward) {
    keep_pending([&] { track_random_use(device, generator); });
  }
}

void Transaction::observe_before(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    bool random,
    const std::optional<at::Generator>& generator,
    bool nested,
    const std::vector<bool>& returned) noexcept {
  keep_pending(
      [&] { before_op(tensors, writes, random, generator, nested, returned); });
}

void Transaction::observe_after(
    const std::vector<at::Tensor>& outputs, bool differentiable) noexcept {
  keep_pending([&] { after_op(outputs, differentiable); });
}

void Transaction::raise_pending() {
  if (pending_) {
    std::exception_ptr p = std::exchange(pending_, nullptr);
    std::rethrow_exception(p);
  }
}

bool Transaction::stateful() const {
  // R_T exists only once the forward ended; before, compare with now.
  return !footprint_.empty() ||
         (phase_ == Phase::kForward ? generators_.moved_now()
                                    : generators_.moved());
}

int64_t Transaction::footprint_bytes() const {
  int64_t total = 0;
  for (const auto& [key, r] : footprint_) {
    total += declared_.count(key) ? r.bytes() : 0;
  }
  return total;
}

int64_t Transaction::written_bytes() const {
  int64_t total = 0;
  for (const auto& [key, r] : writes_) {
    total += declared_.count(key) ? r.bytes() : 0;
  }
  return total;
}

int64_t Transaction::declared_bytes() const {
  int64_t total = 0;
  for (const auto& [key, d] : declared_) {
    total += static_cast<int64_t>(d.storage.nbytes());
  }
  return total;
}

std::string Transaction::name_of(StorageKey key) const {
  auto it = declared_.find(key);
  return it == declared_.end() ? std::string() : it->second.name;
}

std::string Transaction::quoted_name(
    StorageKey key, const char* unnamed) const {
  std::string name = name_of(key);
  return name.empty() ? std::string(unnamed) : "'" + name + "'";
}

uint64_t Transaction::touched_key(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) {
    return 0;
  }
  const StorageKey key = storage_key(t);
  if (!external_.count(key) ||
      (declared_.count(key) && !footprint_.count(key))) {
    return 0;
  }
  return static_cast<uint64_t>(key);
}

}  // namespace torch_replay::aten
