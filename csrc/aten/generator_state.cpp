#include "aten/generator_state.h"

#include <cstring>
#include <mutex>

namespace torch_replay::aten {

at::Tensor generator_state(const at::Generator& gen) {
  at::Generator g = gen;  // a handle to the same generator
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_generator_state(const at::Generator& gen, const at::Tensor& state) {
  at::Generator g = gen;
  std::lock_guard<std::mutex> lock(g.mutex());
  // set_state copies out of `state`, so the recorded tensor stays valid.
  g.set_state(state);
}

bool same_state(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

void GeneratorStates::track(const at::Generator& gen, const std::string& name) {
  if (tracks(gen)) {
    return;
  }
  entries_.push_back({gen, name, generator_state(gen), {}, {}});
}

GeneratorStates::Entry* GeneratorStates::find(const at::Generator& gen) {
  for (auto& e : entries_) {
    if (e.gen.unsafeGetGeneratorImpl() == gen.unsafeGetGeneratorImpl()) {
      return &e;
    }
  }
  return nullptr;
}

void GeneratorStates::mark_drawn(const at::Generator& gen) {
  if (Entry* e = find(gen)) {
    e->drawn = true;
  }
}

void GeneratorStates::mark_replay_drawn(const at::Generator& gen) {
  if (Entry* e = find(gen)) {
    e->replay_drawn = true;
  }
}

bool GeneratorStates::tracks(const at::Generator& gen) const {
  for (const auto& e : entries_) {
    if (e.gen.unsafeGetGeneratorImpl() == gen.unsafeGetGeneratorImpl()) {
      return true;
    }
  }
  return false;
}

void GeneratorStates::record_end() {
  for (auto& e : entries_) {
    e.end = generator_state(e.gen);
  }
}

void GeneratorStates::set_start() {
  for (auto& e : entries_) {
    if (e.drawn) {
      set_generator_state(e.gen, e.start);
    }
  }
}

void GeneratorStates::save_live() {
  for (auto& e : entries_) {
    e.replay_drawn = false;
    if (e.drawn) {
      e.live = generator_state(e.gen);
    }
  }
}

void GeneratorStates::restore_live() {
  for (auto& e : entries_) {
    if (e.live.defined()) {
      set_generator_state(e.gen, e.live);
      e.live = at::Tensor();
    }
  }
}

std::optional<std::string> GeneratorStates::end_mismatch() const {
  for (const auto& e : entries_) {
    if (e.drawn ? !same_state(generator_state(e.gen), e.end) : e.replay_drawn) {
      return e.name;
    }
  }
  return std::nullopt;
}

bool GeneratorStates::moved() const {
  for (const auto& e : entries_) {
    if (e.drawn && !same_state(e.start, e.end)) {
      return true;
    }
  }
  return false;
}

bool GeneratorStates::moved_now() const {
  for (const auto& e : entries_) {
    if (e.drawn && !same_state(e.start, generator_state(e.gen))) {
      return true;
    }
  }
  return false;
}

std::vector<c10::Device> GeneratorStates::devices() const {
  std::vector<c10::Device> out;
  for (const auto& e : entries_) {
    out.push_back(e.gen.device());
  }
  return out;
}

const std::vector<std::string> GeneratorStates::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) {
    out.push_back(e.name);
  }
  return out;
}

}  // namespace torch_replay::aten
