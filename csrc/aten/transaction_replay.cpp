// The replay half of the Transaction (Note [Replay protocol], steps 1-4):
// check, restore, re-run under the observer, verify, put the live bytes back.

#include <ATen/Context.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "aten/byte_devices.h"
#include "aten/tensor_bytes.h"
#include "aten/transaction.h"
#include "aten/write_watch.h"
#include "core/status.h"

namespace torch_replay::aten {

using namespace detail;  // NOLINT(google-build-using-namespace)

// ----------------------------------------------------------------- replay

void Transaction::check_unchanged() const {
  auto check = [this](const Watched& w, const char* what) {
    const int64_t now = counter_version(w.counter);
    if (now != w.version) {
      std::ostringstream os;
      os << "a tensor the checkpointed segment " << what
         << " was modified in place after the forward (version " << w.version
         << " -> " << now
         << "), so the re-run would compute different values. Declare it in "
            "state= so its forward value is preserved";
      if (!options_.preserve_reads) {
        // (The refusing levels; "preserve" would have journaled the read.)
        os << " (or set tr.config.detect = \"preserve\" to preserve every "
              "undeclared tensor a segment reads)";
      }
      os << ", or do not modify it before backward.";
      fail(ErrorKind::kStateMutation, os.str(), w.key);
    }
  };
  for (const auto& w : saved_) {
    check(w, "saved for backward");
  }
  for (const auto& [impl, w] : reads_) {
    check(w, "read");
  }
  for (const auto& w : reads_of_freed_) {
    check(w, "read");
  }
  // Note [Sparse tensors]: their parts, by their bytes.
  const StorageKey bad = sparse_reads_.first_mismatch([this](StorageKey key) {
    auto it = external_.find(key);
    return it == external_.end() ? StorageRef{} : resolve_weak(it->second);
  });
  if (bad != 0) {
    fail(
        ErrorKind::kStateMutation,
        "a sparse tensor the checkpointed segment read was modified after the "
        "forward (its values or indices changed, e.g. through t.values()), "
        "so the re-run would compute different values. Do not modify it "
        "before backward, pass a copy to the segment, or declare its parts "
        "(values and indices) in state=.",
        bad);
  }
}

void Transaction::check_accounted() const {
  const RegionJournal& journal = RegionJournal::global();
  for (const Accounted& a : accounted_) {
    const int64_t moved = counter_version(a.counter) - a.version;
    const int64_t shown = journal.writes_shown(a.key) - a.shown;
    if (moved <= shown) {
      continue;
    }
    const std::string name = name_of(a.key);
    std::ostringstream os;
    os << (name.empty() ? std::string("a tensor the checkpointed segment read")
                        : "declared state '" + name + "'")
       << " was written after the forward by a write that bypassed the "
          "dispatcher (its version counter moved "
       << moved << " time(s), " << shown
       << " of them by writes torch_replay saw): a torch.compile'd function "
          "or another kernel writing it in place. ";
    if (name.empty()) {
      os << "tr.config.detect='preserve' journals only the writes it sees, so "
            "its forward value cannot be restored. Declare it in state= "
            "with engine='readset' or 'snapshot' (they restore their copy "
            "however the bytes changed), or update it after backward.";
    } else {
      os << "engine='" << engine()
         << "' cannot undo such a write. Use engine='readset' or "
            "'snapshot' for this segment (they restore their copy however the "
            "bytes changed), or update it after backward.";
    }
    fail(ErrorKind::kStateMutation, os.str(), a.key);
  }
}

void Transaction::prune_journal_registry() {
  const std::set<StorageKey> in_use = RegionJournal::global().keys_in_use();
  auto& reg = journal_registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (auto it = reg.storages.begin(); it != reg.storages.end();) {
    it = in_use.count(it->first) ? std::next(it) : reg.storages.erase(it);
  }
}

void Transaction::begin_replay() {
  require_phase(phase_ == Phase::kForwardDone, "start the re-run");
  check_unchanged();
  check_accounted();
  live_.clear();
  replay_internal_.clear();
  replay_versions_.clear();
  // (Storages a ReshapeRecord owns are hidden from the byte restores: the
  // record sets their live allocation aside whole; Note [Storage-changing
  // writes].)
  const Resolver r = byte_resolver();
  // 1. Save the live bytes of everything the restore below rewrites.
  for (const PreservationEngine* e : {engine_.get(), reads_engine_.get()}) {
    if (e == nullptr) {
      continue;
    }
    for (const auto& [key, ranges] : e->restored_regions()) {
      StorageRef ref = r(key);
      if (ref.base != nullptr) {
        live_.save(key, ref, ranges);
      }
    }
  }
  for (StorageKey key : implicit_.keys()) {
    StorageRef ref = r(key);
    if (ref.base != nullptr && !reshaped(key)) {  // (gone: nothing to keep)
      live_.save(key, ref, implicit_.saved(key));
    }
  }
  for (auto& [key, d] : declared_) {
    for (const auto& t : d.tensors) {
      remember_version(t);
    }
  }
  generators_.save_live();
  untracked_live_.clear();
  replay_verified_ = false;
  if (!options_
           .preserve_rng_state) {  // Note [Generators after a failed re-run]
    std::vector<c10::Device> devices = devices_seen_;
    devices.emplace_back(c10::kCPU);
    for (const auto& device : devices) {
      at::Generator gen = device.is_cpu()
                              ? at::detail::getDefaultCPUGenerator()
                              : at::globalContext().defaultGenerator(device);
      const bool seen = std::any_of(
          untracked_live_.begin(), untracked_live_.end(), [&](const auto& e) {
            return e.first == gen;
          });
      if (!seen && !generators_.tracks(gen)) {
        untracked_live_.emplace_back(gen, generator_state(gen));
      }
    }
  }
  replay_transient_bytes_ = std::max(replay_transient_bytes_, live_.bytes());
  // 2. Put B0 back, proving it where the engine kept only hashes.
  try {
    for (auto& rec : reshaped_) {
      rec.begin_replay();
    }
    StorageKey bad = engine_->restore_start(r);
    if (bad != 0) {
      const bool guard = engine_->kind() == EngineKind::kGuard;
      fail(
          ErrorKind::kStateMutation,
          "declared state '" + name_of(bad) + "' was modified after the " +
              "forward by a write that engine='" + engine() +
              "' cannot undo (" +
              (guard ? "the guard engine keeps nothing"
                     : "a write that bypassed the dispatcher (the memory of "
                       ".numpy(), a raw pointer, a compiled kernel writing "
                       "an input) is not journaled") +
              "); use engine='readset' or 'snapshot' for this segment",
          bad);
    }
    if (reads_engine_) {
      bad = reads_engine_->restore_start(r);
      if (bad != 0) {
        fail(
            ErrorKind::kStateMutation,
            "a tensor the checkpointed segment read was modified after the "
            "forward by a write that bypassed the dispatcher (the memory of "
            ".numpy(), a raw pointer, a compiled kernel writing an input), "
            "so its forward value cannot be restored "
            "(tr.config.detect='preserve' journals only dispatcher writes). "
            "Declare it in state= with engine='readset' or 'snapshot'.",
            bad);
      }
    }
    implicit_.restore_all(r);
    generators_.set_start();
  } catch (...) {
    live_.restore_all(r);
    for (auto it = reshaped_.rbegin(); it != reshaped_.rend(); ++it) {
      it->finish_replay();
    }
    generators_.restore_live();
    live_.clear();
    throw;
  }
  phase_ = Phase::kReplay;
}

void Transaction::remember_version(const at::Tensor& t) {
  // The counter itself (shared by a base and its views), so that a write
  // through a temporary view is put back after the view died; once per
  // write, not once per TensorImpl address: a dead view's address may be
  // reused by a view of another tensor. finish_replay restores newest
  // first, so each counter ends at its oldest remembered version.
  c10::VariableVersion counter = t.unsafeGetTensorImpl()->version_counter();
  const int64_t version = counter_version(counter);
  replay_versions_.emplace_back(std::move(counter), version);
}

void Transaction::replay_access(
    const at::Tensor& t, StorageKey key, const RangeSet& fp, bool write) {
  const bool declared = declared_.count(key) > 0;
  auto fpit = footprint_.find(key);
  const bool known = declared || fpit != footprint_.end();
  if (write) {
    if (!known && !external_.count(key)) {
      return;  // a storage the replay made itself
    }
    if (!known) {
      // Keep the live bytes first (Note [C++ observer]: the write happens
      // even though it is refused), so that finish_replay puts them back.
      written_external_.insert_or_assign(key, External(t));
      live_.save(key, ref_of(t.storage()), fp);
      remember_version(t);
      fail(
          ErrorKind::kStateMutation,
          "the re-run writes " + describe(t) +
              ", a tensor the forward did not write: the segment is not "
              "deterministic in the state it touches. Declare that state in "
              "state= or make the segment deterministic.",
          key);
    }
    if (!reshaped(key)) {  // (else its record keeps the live state)
      live_.save(key, resolve(key), fp);
      if (!options_.verify_bytes) {
        // B_T of bytes the forward only read is their start, which they
        // still hold: hashed before the re-run overwrites them (Note
        // [Verification levels]).
        auto w = writes_.find(key);
        const RangeSet fresh = w == writes_.end() ? fp : fp.subtract(w->second);
        if (!fresh.empty()) {
          end_hashes_.add(key, resolve(key), fresh);
        }
      }
    }
    remember_version(t);
  }
  if (declared && engine_->kind() != EngineKind::kSnapshot &&
      (fpit == footprint_.end() || !fpit->second.contains(fp))) {
    fail(
        ErrorKind::kStateMutation,
        "the re-run touches bytes of declared state '" + name_of(key) +
            "' that the forward did not touch, so they are not preserved by "
            "engine='" +
            engine() +
            "': the segment's control flow depends on state that changed. "
            "Use engine='snapshot' or declare the state it depends on.",
        key);
  }
}

namespace {

// For a sparse tensor, whether `pred` holds for any of its strided parts
// (Note [Sparse tensors]); nullopt for a strided tensor.
template <typename Pred>
std::optional<bool> any_sparse_part(const at::Tensor& t, Pred pred) {
  std::vector<at::Tensor> parts;
  if (!sparse_parts(t, &parts)) {
    return std::nullopt;
  }
  return std::any_of(parts.begin(), parts.end(), pred);
}

}  // namespace

bool Transaction::restores(const at::Tensor& t) const {
  if (auto any = any_sparse_part(t, [this](auto& p) { return restores(p); })) {
    return *any;
  }
  return observable(t) && live_.saved(storage_key(t)).bytes() > 0;
}

bool Transaction::overwritten_later(const at::Tensor& t) const {
  if (auto any = any_sparse_part(
          t, [this](auto& p) { return overwritten_later(p); })) {
    return *any;
  }
  if (!observable(t)) {
    return false;
  }
  auto it = writes_.find(storage_key(t));
  return it != writes_.end() && it->second.overlaps(footprint_of(t));
}

void Transaction::verify_replay() {
  require_phase(phase_ == Phase::kReplay, "verify the re-run");
  // Sizes first: the hashes below read the bytes the forward's end had.
  for (const auto& rec : reshaped_) {
    if (!rec.reproduced()) {
      fail(
          ErrorKind::kStateMutation,
          "the re-run did not leave " +
              quoted_name(rec.start_key(), "a tensor the segment resized") +
              " with the size, storage and bytes the forward left it "
              "with: the segment depends on state that changed and is not "
              "declared, or is not deterministic. Declare that state in "
              "state=.",
          rec.start_key());
    }
  }
  StorageKey bad = end_hashes_.first_mismatch(resolver());
  if (bad != 0) {
    fail(
        ErrorKind::kStateMutation,
        "the re-run did not reproduce the forward's end state of " +
            quoted_name(bad, "a tensor it writes") +
            " (P(B0,R0) != (B_T,R_T) on storage bytes): the segment depends "
            "on state that changed and is not declared, or is not "
            "deterministic. Declare that state in state=.",
        bad);
  }
  if (auto gen = generators_.end_mismatch()) {
    fail(
        ErrorKind::kRngMismatch,
        "the re-run left " + *gen +
            " at a different position than the forward did: it drew a "
            "different number of random values, so every later draw would "
            "diverge. Declare the state that decides how much it draws.",
        0);
  }
  replay_verified_ = true;
}

void Transaction::finish_replay() {
  if (phase_ != Phase::kReplay) {
    return;
  }
  live_.restore_all(resolver());
  for (auto it = reshaped_.rbegin(); it != reshaped_.rend(); ++it) {
    it->finish_replay();
  }
  generators_.restore_live();
  if (!replay_verified_) {  // Note [Generators after a failed re-run]
    for (const auto& [gen, state] : untracked_live_) {
      set_generator_state(gen, state);
    }
  }
  untracked_live_.clear();
  for (auto it = replay_versions_.rbegin(); it != replay_versions_.rend();
       ++it) {
    if (it->first.enabled() && counter_version(it->first) != it->second) {
      it->first.set_version(it->second);
    }
  }
  replay_transient_bytes_ = std::max(replay_transient_bytes_, live_.bytes());
  live_.clear();
  replay_versions_.clear();
  replay_internal_.clear();
  phase_ = Phase::kForwardDone;
}

void Transaction::release() {
  if (phase_ == Phase::kReleased) {
    return;
  }
  if (engine_) {
    engine_->release();
  }
  if (reads_engine_) {
    reads_engine_->release();
  }
  if (watching_writes_) {
    write_watch_release();
    watching_writes_ = false;
  }
  // Only a transaction that put keys in the registry (a journal segment's
  // declared storages, preserved reads) can leave entries to prune.
  const bool registered =
      !preserved_.empty() ||
      (!declared_.empty() &&
       (requested_ == EngineKind::kJournal || requested_ == EngineKind::kAuto));
  if (registered) {
    prune_journal_registry();
  }
  accounted_.clear();
  preserved_counters_.clear();
  implicit_.clear();
  sparse_reads_.clear();
  live_.clear();
  reshape_pending_.clear();
  reshaped_.clear();
  phase_ = Phase::kReleased;
}

}  // namespace torch_replay::aten
