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

class GeneratorStates {
 public:
  // Starts tracking `gen` (no-op if tracked) and records its state as R0.
  void track(const at::Generator& gen, const std::string& name);
  bool tracks(const at::Generator& gen) const;
  size_t size() const {
    return entries_.size();
  }

  // Records every tracked generator's current state as R_T.
  void record_end();
  // Sets every tracked generator to R0.
  void set_start();
  // Saves / restores the live states (around a replay).
  void save_live();
  void restore_live();
  // The name of the first generator whose state differs from R_T.
  std::optional<std::string> end_mismatch() const;
  // True if some tracked generator ended at another state than it started.
  bool moved() const;
  // True if some tracked generator is now at another state than it started
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
  };
  std::vector<Entry> entries_;
};

// The state of `gen` (a CPU uint8 tensor), read under its lock.
at::Tensor generator_state(const at::Generator& gen);
void set_generator_state(const at::Generator& gen, const at::Tensor& state);
bool same_state(const at::Tensor& a, const at::Tensor& b);

}  // namespace torch_replay::aten
