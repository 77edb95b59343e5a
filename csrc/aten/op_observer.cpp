#include "aten/op_observer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/tensor_bytes.h"
#include "aten/transaction.h"
#include "core/status.h"

namespace torch_replay::aten {

namespace {

OpInfo make_info(const at::RecordFunction& fn) {
  OpInfo info;
  std::optional<c10::FunctionSchema> schema = fn.operator_schema();
  if (!schema.has_value()) {
    info.op = false;
    info.skip = true;
    return info;
  }
  const std::string& name = schema->name();
  std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findOp(schema->operator_name());
  const bool inplace_view = op.has_value() && op->hasTag(at::Tag::inplace_view);
  info.random = op.has_value() && op->hasTag(at::Tag::nondeterministic_seeded);
  // Operators whose "writes" change metadata or identity only, never bytes.
  const bool metadata_only =
      inplace_view || name == "aten::set_" || name == "aten::resize_" ||
      name == "aten::resize_as_" || name == "aten::detach_";
  bool view = false;
  for (const auto& arg : schema->arguments()) {
    const c10::TypePtr& type = arg.type();
    info.takes_generator |=
        type->kind() == c10::TypeKind::GeneratorType ||
        (type->kind() == c10::TypeKind::OptionalType &&
         type->containedType(0)->kind() == c10::TypeKind::GeneratorType);
    const c10::AliasInfo* alias = arg.alias_info();
    const bool write = alias != nullptr && alias->isWrite();
    view |= alias != nullptr && !alias->isWrite();
    info.writes.push_back(write && !metadata_only);
    info.may_write |= write && !metadata_only;
    info.metadata_write |= write && metadata_only;
    bool returned = false;
    for (const auto& ret : schema->returns()) {
      const c10::AliasInfo* r = ret.alias_info();
      if (alias == nullptr || r == nullptr) {
        continue;
      }
      for (const auto& set : alias->beforeSets()) {
        returned |= r->beforeSets().count(set) > 0;
      }
    }
    info.returned.push_back(returned);
  }
  info.skip = view;
  info.differentiable = name != "aten::detach";
  // (An in-place view, t_ or unsqueeze_, changes argument 0's sizes and
  // strides: its start metadata must be put back for the re-run too.)
  info.reshapes = inplace_view || name == "aten::set_" ||
                  name == "aten::resize_" || name == "aten::resize_as_" ||
                  name == "aten::_resize_output_";
  std::string display = name;
  const size_t sep = display.find("::");
  if (sep != std::string::npos) {
    display.replace(sep, 2, ".");
  }
  const std::string& overload = schema->overload_name();
  info.display = display + "." + (overload.empty() ? "default" : overload);
  if (name == "aten::native_batch_norm" || name == "aten::cudnn_batch_norm" ||
      name == "aten::miopen_batch_norm" || name == "aten::batch_norm" ||
      name == "aten::_batch_norm_impl_index" || name == "aten::instance_norm") {
    // (instance_norm: argument 5 is use_input_stats.)
    info.training_arg = 5;
    info.extra = {3, 4};
    info.may_write = true;
  }
  return info;
}

struct Entry {
  Transaction* txn;
  std::shared_ptr<ObserverGate> gate;
};

struct ThreadState {
  std::vector<Entry> stack;
  std::optional<at::CallbackHandle> handle;
  bool in_callback = false;
  // Nesting of observed operators: 0 for an operator the segment calls, more
  // for operators called by another operator's implementation.
  int depth = 0;
  // Storages of the tensor arguments of the current depth-0 operator, and
  // those of them it declares it writes.
  std::vector<StorageKey> top_keys;
  std::vector<StorageKey> top_written;
  // Keyed by the address of the schema's name, unique per overload; open
  // addressing (one probe of a small array per operator, which every callback
  // of every operator makes), the facts themselves never move (frames point
  // to them).
  ska::flat_hash_map<const char*, std::unique_ptr<OpInfo>> infos;
  // In front of `infos`, a direct-mapped cache of its entries by the same key
  // (one load and one compare for an operator seen recently: every callback
  // of every operator looks its facts up, the watch's for every operator of
  // the backward). Entries are only operators' (`infos`'s), never a range
  // named by a string (kNotAnOperator, see info_of), so a slot holds a key
  // that `infos` maps to the same facts for as long as the thread lives.
  struct CachedInfo {
    const char* key = nullptr;
    const OpInfo* info = nullptr;
  };
  static constexpr size_t kInfoCacheSlots = 256;  // (a power of two)
  std::array<CachedInfo, kInfoCacheSlots> info_cache{};
  // Buffers reused by every callback (callbacks never nest: in_callback).
  std::vector<at::Tensor> tensors;
  std::vector<bool> writes;
  std::vector<bool> returned;
  // One entry per operator whose start this thread's observer saw and whose
  // end it has not seen yet: its facts if it was counted in `depth`, nullptr
  // if not. RecordFunction calls a callback's end exactly for the starts it
  // called, on the same thread, innermost first, so the ends pop what the
  // starts pushed (no ObserverContext allocated per operator, no second
  // lookup of the facts).
  std::vector<const OpInfo*> frames;
};

// The thread's state. The pointer is initial-exec TLS (a plain load, not a
// __tls_get_addr call per operator); the owner, made once per thread, frees
// the state when the thread exits.
ThreadState& state() {
  static thread_local ThreadState* fast
      __attribute__((tls_model("initial-exec"))) = nullptr;
  if (fast == nullptr) {
    thread_local std::unique_ptr<ThreadState> owner =
        std::make_unique<ThreadState>();
    fast = owner.get();
  }
  return *fast;
}

// Pushes `entry` on `frames` for the end callback to pop; pushing never
// throws (RecordFunction swallows a callback's exception, but the stack
// would no longer match the ends): reserved ahead.
void push_frame(std::vector<const OpInfo*>& frames, const OpInfo* entry) {
  if (frames.size() == frames.capacity()) {
    frames.reserve(std::max<size_t>(64, 2 * frames.capacity()));
  }
  frames.push_back(entry);
}

const OpInfo* pop_frame(std::vector<const OpInfo*>& frames) {
  if (frames.empty()) {
    return nullptr;  // (an end whose start ran before the state existed)
  }
  const OpInfo* entry = frames.back();
  frames.pop_back();
  return entry;
}

// The facts of an operator not in the cache (or of a range that is not an
// operator): out of line, so that the cache's hit path stays a few
// instructions inlined into every callback (make_info's frame is large).
__attribute__((noinline)) const OpInfo& info_of_uncached(
    ThreadState& s,
    const at::RecordFunction& fn,
    const char* key,
    ThreadState::CachedInfo& slot) {
  auto it = s.infos.find(key);
  if (it == s.infos.end()) {
    OpInfo info = make_info(fn);
    if (!info.op) {
      // A range named by a string (the autograd engine's "evaluate_function:
      // ..." of every node), whose name lives in the RecordFunction itself:
      // its address is no key (one entry per address would accumulate).
      static const OpInfo kNotAnOperator = info;
      return kNotAnOperator;
    }
    it = s.infos.emplace(key, std::make_unique<OpInfo>(std::move(info))).first;
  }
  slot = {key, it->second.get()};
  return *it->second;
}

inline const OpInfo& info_of(ThreadState& s, const at::RecordFunction& fn) {
  const char* key = fn.name();
  // (Names are heap strings of the dispatcher's operator table: the low bits
  // of their addresses say little, the next ones spread them.)
  ThreadState::CachedInfo& slot = s.info_cache
                                      [(reinterpret_cast<uintptr_t>(key) >> 4) &
                                       (ThreadState::kInfoCacheSlots - 1)];
  if (slot.key == key) {
    return *slot.info;
  }
  return info_of_uncached(s, fn, key, slot);
}

struct CallbackGuard {
  explicit CallbackGuard(ThreadState& s) : s_(s) {
    s_.in_callback = true;
  }
  ~CallbackGuard() {
    s_.tensors.clear();  // hold no tensor beyond the callback
    s_.writes.clear();
    s_.returned.clear();
    s_.in_callback = false;
  }
  ThreadState& s_;
};

// Shows a storage-changing operator's argument 0 to the transactions, before
// or after it runs (Note [Storage-changing writes]), at any depth: the
// resize_ an out= kernel makes of its output counts too. (The end callback
// must not read fn.inputs(): the dispatcher frees the boxed arguments once
// the start callbacks ran. The transaction keeps the tensor instead.)
void show_reshape(ThreadState& s, const at::RecordFunction& fn, bool after) {
  const at::Tensor* t = nullptr;
  if (!after) {
    c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
    if (inputs.empty() || !inputs[0].isTensor()) {
      return;
    }
    t = &inputs[0].toTensor();
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      if (after) {
        it->txn->observe_reshape_after();
      } else {
        it->txn->observe_reshape_before(*t);
      }
    }
  }
}

// Whether a transaction observing on this thread declares `key` or knows it
// as a storage that existed before its forward and that the forward touched.
bool known_preexisting(const ThreadState& s, StorageKey key) {
  for (const Entry& e : s.stack) {
    if (!e.gate->paused && e.txn->knows_preexisting(key)) {
      return true;
    }
  }
  return false;
}

// Whether the storage-changing operator `fn`, nested in another one's
// implementation, changes state the segment must put back: a storage the
// enclosing operator was given (its out= argument, resized by the kernel) or
// pre-existing state. A kernel's own temporary (made without being seen as
// created, then resized: linalg_solve's LU) is neither; recording it as
// pre-existing would make the kernel's later writes to it look like writes to
// state (keep_nested_writes).
bool nested_reshape_shown(const ThreadState& s, const at::RecordFunction& fn) {
  c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  StorageKey key = 0;
  if (inputs.empty() || !inputs[0].isTensor() ||
      !observable_key(inputs[0].toTensor(), &key)) {
    return false;
  }
  return std::find(s.top_keys.begin(), s.top_keys.end(), key) !=
             s.top_keys.end() ||
         known_preexisting(s, key);
}

void show_start(
    ThreadState& s,
    const at::RecordFunction& fn,
    const OpInfo& info,
    int depth);

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& s = state();
  // Every start pushes a frame for on_end to pop, first of all (nullptr: not
  // counted, so far).
  push_frame(s.frames, nullptr);
  // (The callback also sees other ranges, autograd nodes and user ranges:
  // only dispatcher operators count.)
  if (s.in_callback || s.stack.empty() ||
      fn.scope() != at::RecordScope::FUNCTION) {
    return nullptr;
  }
  const OpInfo& info = info_of(s, fn);
  // A view-annotated operator is not counted (Note [Alias-annotated
  // composites]): what its implementation calls is observed as if the
  // segment called it.
  if (!info.op || info.skip) {
    return nullptr;
  }
  s.frames.back() = &info;
  const int depth = s.depth++;
  if (depth > 0 && !info.may_write && !info.random && !info.takes_generator &&
      !info.reshapes) {
    // Inside another operator's implementation, an operator that declares no
    // write, draws nothing and cannot be given a generator has nothing to
    // show (see keep_nested_writes): its arguments are not read.
    return nullptr;
  }
  show_start(s, fn, info, depth);
  return nullptr;
}

// The part of on_start that reads the arguments and shows them to the
// transactions: out of line, so that the checks above, which are all that
// most nested operators cost, run without its large frame.
__attribute__((noinline)) void show_start(
    ThreadState& s,
    const at::RecordFunction& fn,
    const OpInfo& info,
    int depth) {
  CallbackGuard guard(s);
  std::vector<at::Tensor>& tensors = s.tensors;
  std::vector<bool>& writes = s.writes;
  std::optional<at::Generator> generator;
  collect_arguments(
      info,
      fn.inputs(),
      /*writes_only=*/false,
      &tensors,
      &writes,
      &generator,
      &s.returned);
  if (info.reshapes && (depth == 0 || nested_reshape_shown(s, fn))) {
    show_reshape(s, fn, /*after=*/false);
  }
  if (depth == 0) {
    top_level_keys(tensors, writes, &s.top_keys, &s.top_written);
  } else {
    // Inside another operator's implementation (see keep_nested_writes):
    // track the generator a nested random operator draws from, and the
    // writes the enclosing operator does not declare.
    if (info.random || generator.has_value()) {
      const c10::Device device = first_device(tensors);
      for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
        if (!it->gate->paused) {
          it->txn->observe_random(device, generator);
        }
      }
    }
    const size_t kept = keep_nested_writes(
        &tensors, &writes, s.top_keys, s.top_written, [&s](StorageKey key) {
          return known_preexisting(s, key);
        });
    if (kept == 0) {
      return;
    }
    generator.reset();
    s.returned.clear();  // (unknown for the kept writes: all count)
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      it->txn->observe_before(
          tensors,
          writes,
          depth == 0 && info.random,
          generator,
          depth > 0,
          s.returned);
    }
  }
}

void show_outputs(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info);

void on_end(const at::RecordFunction& fn, at::ObserverContext* /*ctx*/) {
  ThreadState& s = state();
  const OpInfo* counted = pop_frame(s.frames);
  if (counted == nullptr) {
    return;  // not counted at its start
  }
  const int depth = --s.depth;
  if (s.in_callback || s.stack.empty()) {
    return;
  }
  const OpInfo& info = *counted;
  if (info.reshapes) {
    CallbackGuard guard(s);
    show_reshape(s, fn, /*after=*/true);
  }
  if (depth > 0) {
    return;  // outputs of nested operators are the enclosing operator's
  }
  show_outputs(s, fn, info);
}

// The part of on_end that shows a depth-0 operator's outputs (out of line,
// as show_start).
__attribute__((noinline)) void show_outputs(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info) {
  CallbackGuard guard(s);
  std::vector<at::Tensor>& outputs = s.tensors;
  std::vector<bool>& unused = s.writes;
  outputs.clear();
  unused.clear();
  for (const c10::IValue& v : fn.outputs()) {
    flatten_tensors(v, false, &outputs, &unused);
  }
  for (auto it = s.stack.rbegin(); it != s.stack.rend(); ++it) {
    if (!it->gate->paused) {
      it->txn->observe_after(outputs, info.differentiable);
    }
  }
}

void journal_writes(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info);
void count_metadata_write(ThreadState& s, const at::RecordFunction& fn);

std::unique_ptr<at::ObserverContext> on_watch_start(
    const at::RecordFunction& fn) {
  ThreadState& s = state();
  // Inside a segment its transactions journal what it writes.
  if (s.in_callback || !s.stack.empty() ||
      fn.scope() != at::RecordScope::FUNCTION) {
    return nullptr;
  }
  const OpInfo& info = info_of(s, fn);
  // (Nested operators are looked at too: Note [Write watch].)
  if (!info.op || info.skip || !info.may_write) {
    if (info.metadata_write) {
      count_metadata_write(s, fn);
    }
    return nullptr;  // (Note [Write watch]: what is left unwatched)
  }
  journal_writes(s, fn, info);
  return nullptr;
}

// A write of argument 0's metadata outside segments (resize_, set_, t_):
// nothing to journal, but its version counter moves (out of line: rare).
__attribute__((noinline)) void count_metadata_write(
    ThreadState& s, const at::RecordFunction& fn) {
  CallbackGuard guard(s);
  const auto inputs = fn.inputs();
  if (!inputs.empty() && inputs[0].isTensor()) {
    const at::Tensor& t = inputs[0].toTensor();
    if (detail::declarable(t)) {
      RegionJournal::global().count_write(storage_key(t));
    }
  }
}

// The part of on_watch_start that journals a writing operator's writes (out
// of line, as show_start: most operators write nothing).
__attribute__((noinline)) void journal_writes(
    ThreadState& s, const at::RecordFunction& fn, const OpInfo& info) {
  CallbackGuard guard(s);
  collect_arguments(
      info,
      fn.inputs(),
      /*writes_only=*/true,
      &s.tensors,
      &s.writes,
      nullptr);
  for (const at::Tensor& t : s.tensors) {
    try {
      journal_write_outside_segments(t);
    } catch (...) {
      // Never throw out of a callback; the re-run's start hashes refuse a
      // write that could not be journaled.
    }
  }
}

struct WriteWatch {
  std::mutex mutex;
  int users = 0;
  std::optional<at::CallbackHandle> handle;
};

WriteWatch& write_watch() {
  static WriteWatch w;
  return w;
}

// The write watch's registration: process-wide, with inputs, every operator.
at::CallbackHandle add_watch_callback(
    at::RecordFunctionCallback::StartCallback start) {
  return at::addGlobalCallback(
      at::RecordFunctionCallback(start, nullptr)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

}  // namespace

const OpInfo& operator_info(const at::RecordFunction& fn) {
  return info_of(state(), fn);
}

void flatten_tensors(
    const c10::IValue& v,
    bool write,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes) {
  if (v.isTensor()) {
    tensors->push_back(v.toTensor());
    writes->push_back(write);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) {
      tensors->push_back(t);
      writes->push_back(write);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        tensors->push_back(e.toTensor());
        writes->push_back(write);
      }
    }
  }
}

void collect_arguments(
    const OpInfo& info,
    c10::ArrayRef<const c10::IValue> inputs,
    bool writes_only,
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    std::optional<at::Generator>* generator,
    std::vector<bool>* returned) {
  bool training = false;
  if (info.training_arg >= 0 &&
      static_cast<size_t>(info.training_arg) < inputs.size()) {
    const c10::IValue& t = inputs[info.training_arg];
    training = t.isBool() && t.toBool();
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    bool write = i < info.writes.size() && info.writes[i];
    if (training) {
      for (int e : info.extra) {
        write |= static_cast<size_t>(e) == i;
      }
    }
    if (v.isGenerator()) {
      if (generator != nullptr) {
        *generator = v.toGenerator();
      }
    } else if (write || !writes_only) {
      const size_t before = tensors->size();
      flatten_tensors(v, write, tensors, writes);
      if (returned != nullptr) {  // (kept one per tensor, as `writes`)
        const bool r = i < info.returned.size() && info.returned[i];
        for (size_t k = before; k < tensors->size(); ++k) {
          returned->push_back(r);
        }
      }
    }
  }
}

bool observable_key(const at::Tensor& t, StorageKey* key) {
  if (!t.defined() || t.layout() != at::kStrided || !t.has_storage() ||
      t.is_meta() || t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return false;
  }
  *key = storage_key(t);
  return true;
}

void top_level_keys(
    const std::vector<at::Tensor>& tensors,
    const std::vector<bool>& writes,
    std::vector<StorageKey>* keys,
    std::vector<StorageKey>* written) {
  keys->clear();
  written->clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    StorageKey key = 0;
    if (observable_key(tensors[i], &key)) {
      keys->push_back(key);
      if (writes[i]) {
        written->push_back(key);
      }
    }
  }
}

size_t keep_nested_writes(
    std::vector<at::Tensor>* tensors,
    std::vector<bool>* writes,
    const std::vector<StorageKey>& top_keys,
    const std::vector<StorageKey>& top_written,
    const std::function<bool(StorageKey)>& known) {
  auto has = [](const std::vector<StorageKey>& v, StorageKey k) {
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  size_t kept = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    StorageKey key = 0;
    if ((*writes)[i] && observable_key((*tensors)[i], &key) &&
        ((has(top_keys, key) && !has(top_written, key)) ||
         (known && !has(top_written, key) && known(key)))) {
      (*tensors)[kept] = (*tensors)[i];
      (*writes)[kept] = (*writes)[i];
      ++kept;
    }
  }
  tensors->resize(kept);
  writes->resize(kept);
  return kept;
}

c10::Device first_device(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined()) {
      return t.device();
    }
  }
  return c10::Device(c10::kCPU);
}

void write_watch_acquire() {
  WriteWatch& w = write_watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.users++ == 0) {
    w.handle = add_watch_callback(on_watch_start);
  }
}

void write_watch_release() {
  WriteWatch& w = write_watch();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (--w.users == 0 && w.handle.has_value()) {
    at::removeCallback(*w.handle);
    w.handle.reset();
  }
}

void observer_push(Transaction* txn, std::shared_ptr<ObserverGate> gate) {
  ThreadState& s = state();
  s.stack.push_back({txn, std::move(gate)});
  if (!s.handle.has_value()) {
    s.handle = add_operator_callback(on_start, on_end);
  }
}

at::CallbackHandle add_operator_callback(
    at::RecordFunctionCallback::StartCallback start,
    at::RecordFunctionCallback::EndCallback end) {
  return at::addThreadLocalCallback(
      at::RecordFunctionCallback(start, end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

void observer_pop(Transaction* txn) {
  ThreadState& s = state();
  if (s.stack.empty() || s.stack.back().txn != txn) {
    throw ReplayException(
        ErrorKind::kUnsupported,
        "torch_replay: observation scopes of checkpointed segments must nest "
        "(a segment's scope ended while another one was innermost on this "
        "thread)",
        0);
  }
  s.stack.pop_back();
  if (s.stack.empty() && s.handle.has_value()) {
    at::removeCallback(*s.handle);
    s.handle.reset();
  }
}

namespace {

std::unique_ptr<at::ObserverContext> floor_start(
    const at::RecordFunction& /*fn*/) {
  return nullptr;
}

void floor_end(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
}

// A counted registration: the first `on` registers, the last `off` removes.
struct FloorSwitch {
  int users = 0;
  std::optional<at::CallbackHandle> handle;
};

template <typename Register>
int toggle(FloorSwitch& f, bool on, Register add) {
  if (on && f.users++ == 0) {
    f.handle = add();
  } else if (!on && f.users > 0 && --f.users == 0 && f.handle.has_value()) {
    at::removeCallback(*f.handle);
    f.handle.reset();
  }
  return f.users;
}

}  // namespace

int floor_observer(bool on) {
  // Per thread, as the observer's callback is.
  static thread_local FloorSwitch f;
  return toggle(
      f, on, [] { return add_operator_callback(floor_start, floor_end); });
}

int floor_watch(bool on) {
  static FloorSwitch f;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return toggle(f, on, [] { return add_watch_callback(floor_start); });
}

int observer_depth() {
  return static_cast<int>(state().stack.size());
}

int observer_nesting() {
  return state().depth;
}

int64_t observer_known_operators() {
  return static_cast<int64_t>(state().infos.size());
}

}  // namespace torch_replay::aten
