#pragma once

// Generator positions of a segment (R0 at its start, R_T at its end), and the
// live positions saved around a replay. A generator is tracked from its first
// use: its state at that moment is its state at the segment's start, since
// nothing in the segment drew from it before.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace torch_replay::aten {

// Note [Generator draws by thread]
// A generator is process-wide, but the segment's own draws are what its
// re-run must reproduce. So each tracked generator is marked drawn when an
// operator of the segment's forward (on the segment's thread) draws from
// it. Only drawn generators are set to R0 for the re-run, compared with R_T
// after it, and put back to their live state. A generator the forward never
// drew from is left alone: another thread drawing meanwhile (an augmentation
// thread) neither fails the segment nor sees its stream replayed; the re-run
// must then draw from it nothing either (a Dropout in eval mode at forward
// and in train mode at backward), else RngMismatchError.
class GeneratorStates {
 public:
  // Starts tracking `gen` (no-op if tracked) and records its state as R0.
  void track(const at::Generator& gen, const std::string& name);
  bool tracks(const at::Generator& gen) const;
  // An operator of the forward (the re-run) drew from `gen` (no-op if it
  // is not tracked).
  void mark_drawn(const at::Generator& gen);
  void mark_replay_drawn(const at::Generator& gen);
  size_t size() const {
    return entries_.size();
  }

  // Records every tracked generator's current state as R_T.
  void record_end();
  // Sets every drawn generator to R0.
  void set_start();
  // Saves / restores the live states of the drawn generators (around a
  // replay).
  void save_live();
  void restore_live();
  // The name of the first drawn generator whose state differs from R_T, or
  // of one the re-run drew from although the forward did not.
  std::optional<std::string> end_mismatch() const;
  // True if some drawn generator ended at another state than it started.
  bool moved() const;
  // True if some drawn generator is now at another state than it started
  // (valid before record_end, e.g. in the middle of a forward).
  bool moved_now() const;
  // Devices of the tracked generators.
  std::vector<c10::Device> devices() const;
  const std::vector<std::string> names() const;

 private:
  struct Entry {
    at::Generator gen;
    std::string name;
    at::Tensor start, end, live;
    bool drawn = false;
    bool replay_drawn = false;
  };
  Entry* find(const at::Generator& gen);
  std::vector<Entry> entries_;
};

// The state of `gen` (a CPU uint8 tensor), read under its lock.
at::Tensor generator_state(const at::Generator& gen);
void set_generator_state(const at::Generator& gen, const at::Tensor& state);
bool same_state(const at::Tensor& a, const at::Tensor& b);

}  // namespace torch_replay::aten
