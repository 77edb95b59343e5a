#pragma once

// The scheduling model of design.md §3.2: units (kernel calls) that produce
// and consume buffers, and the live bytes of a unit order.
//
// Note [Schedule memory model]
// Graph inputs (producer -1) are live from the start. A buffer is allocated
// when its producer runs; while a unit runs, its inputs and outputs are all
// live; a buffer is freed right after its last consumer runs (right after its
// producer if it has none), never if it is an output. An input that is neither
// consumed nor an output is dead before the first step and never counted.
//
// A schedule is a chain of downsets {} = S_0 < S_1 < ... < S_n (executed
// units). Between steps the live bytes are the *resident* bytes
//
//   res(S) = sum size(b) over b with (b is an input or producer(b) in S)
//                             and (b is an output or a consumer of b is
//                                  not in S)
//
// and running unit u from downset S costs
//
//   cost(S, u) = res(S) + out(u)      (out(u): bytes of every buffer u makes)
//
// because u's inputs are resident (u is not in S). The peak of an order is
// the largest step cost. res is submodular on the lattice of downsets (a
// modular term minus the supermodular indicator "all consumers of b are in
// S"); min_cut_bounds.h and capacity_search.h rely on this.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace torch_replay::schedule {

// Errors: the core throws torch_replay::ReplayException (core/status.h) with
// ErrorKind::kInvalidArgument for caller errors (bad sizes, indices, cycles, a
// non-topological order, a problem too large for the exhaustive solver) and
// ErrorKind::kInternal for broken invariants.

// A set of units as a dense bitset. Small and copyable; all binary operations
// require both operands to have the same universe size.
class UnitSet {
 public:
  UnitSet() = default;
  explicit UnitSet(int universe)
      : universe_(universe), words_((universe + 63) / 64, 0) {}

  int universe() const {
    return universe_;
  }
  bool contains(int u) const {
    return (words_[u >> 6] >> (u & 63)) & 1u;
  }
  void insert(int u) {
    words_[u >> 6] |= uint64_t{1} << (u & 63);
  }
  void erase(int u) {
    words_[u >> 6] &= ~(uint64_t{1} << (u & 63));
  }
  int count() const;
  bool empty() const;
  bool intersects(const UnitSet& other) const;
  bool is_subset_of(const UnitSet& other) const;
  UnitSet& operator|=(const UnitSet& other);
  UnitSet& operator&=(const UnitSet& other);
  // this := this \ other
  UnitSet& subtract(const UnitSet& other);
  bool operator==(const UnitSet& other) const {
    return words_ == other.words_;
  }
  bool operator!=(const UnitSet& other) const {
    return !(*this == other);
  }
  const std::vector<uint64_t>& words() const {
    return words_;
  }
  std::vector<int> elements() const;
  // Calls f(u) for every element, in increasing order.
  template <typename F>
  void for_each(F&& f) const {
    for (size_t w = 0; w < words_.size(); ++w) {
      uint64_t bits = words_[w];
      while (bits != 0) {
        int b = __builtin_ctzll(bits);
        f(static_cast<int>(w * 64 + b));
        bits &= bits - 1;
      }
    }
  }

 private:
  int universe_ = 0;
  std::vector<uint64_t> words_;
};

struct UnitSetHash {
  size_t operator()(const UnitSet& s) const;
};

// Plain description of a problem, as the Python API receives it.
struct ProblemSpec {
  std::vector<int64_t> sizes;                    // bytes of each buffer
  std::vector<int> producer;                     // unit writing it, -1 = input
  std::vector<std::vector<int>> consumers;       // units reading it
  std::vector<int> outputs;                      // buffers live until the end
  int num_units = 0;                             // units are 0 .. num_units-1
  std::vector<std::pair<int, int>> extra_edges;  // (u, v): u runs before v
};

// A validated scheduling problem (see Note [Schedule memory model]).
// Copyable value type; every query is const and thread-compatible.
class Problem {
 public:
  // Validates `spec` and builds the precedence DAG (producer -> consumer for
  // every buffer, plus extra_edges). Throws ReplayException(kInvalidArgument)
  // when a size is negative, an index is out of range, a buffer lists its
  // producer as a consumer, an extra edge is a self-loop, or the precedences
  // have a cycle. Duplicate consumers, outputs and edges are merged.
  explicit Problem(ProblemSpec spec);

  int num_units() const {
    return num_units_;
  }
  int num_buffers() const {
    return static_cast<int>(sizes_.size());
  }
  int64_t size(int b) const {
    return sizes_[b];
  }
  int producer(int b) const {
    return producer_[b];
  }
  const std::vector<int>& consumers(int b) const {
    return consumers_[b];
  }
  bool is_output(int b) const {
    return is_output_[b];
  }
  // True when b ever occupies memory between steps (an output, or a buffer
  // with at least one consumer).
  bool is_resident_kind(int b) const {
    return is_output_[b] || !consumers_[b].empty();
  }
  // Buffers written / read by unit u.
  const std::vector<int>& produced(int u) const {
    return produced_[u];
  }
  const std::vector<int>& consumed(int u) const {
    return consumed_[u];
  }
  // Direct predecessors / successors in the precedence DAG (deduplicated).
  const std::vector<int>& preds(int u) const {
    return preds_[u];
  }
  const std::vector<int>& succs(int u) const {
    return succs_[u];
  }
  // Strict ancestors / descendants of u.
  const UnitSet& ancestors(int u) const {
    return ancestors_[u];
  }
  const UnitSet& descendants(int u) const {
    return descendants_[u];
  }
  bool comparable(int u, int v) const {
    return u == v || ancestors_[u].contains(v) || descendants_[u].contains(v);
  }
  // A topological order of the units (smallest index first among ready ones).
  const std::vector<int>& topological_order() const {
    return topo_;
  }
  // Bytes of every buffer unit u produces (counted at u's own step).
  int64_t out_bytes(int u) const {
    return out_bytes_[u];
  }
  // Resident bytes of inputs at the start, before any unit runs.
  int64_t initial_resident() const {
    return initial_resident_;
  }
  // Sum of all buffer sizes (an upper bound of every peak).
  int64_t total_bytes() const {
    return total_bytes_;
  }

  // res(S) of Note [Schedule memory model]. Precondition: `executed` is a
  // downset over num_units() units (not checked).
  int64_t resident(const UnitSet& executed) const;
  // res(S + {u}) - res(S) when u is ready in S. Precondition: u not in S and
  // every predecessor of u in S.
  int64_t resident_delta(const UnitSet& executed, int u) const;

  // True when `order` is a permutation of the units that respects every
  // precedence. On false, `why` (if given) says what is wrong.
  bool is_valid_order(const std::vector<int>& order, std::string* why) const;
  // Peak bytes of `order`. Throws ReplayException(kInvalidArgument) unless
  // is_valid_order(order).
  int64_t peak(const std::vector<int>& order) const;
  // Cost of each step of `order` (same precondition and error as peak()).
  std::vector<int64_t> step_costs(const std::vector<int>& order) const;

 private:
  int num_units_;
  std::vector<int64_t> sizes_;
  std::vector<int> producer_;
  std::vector<std::vector<int>> consumers_;
  std::vector<char> is_output_;
  std::vector<std::vector<int>> produced_, consumed_;
  std::vector<std::vector<int>> preds_, succs_;
  std::vector<UnitSet> ancestors_, descendants_;
  std::vector<int> topo_;
  std::vector<int64_t> out_bytes_;
  int64_t initial_resident_ = 0;
  int64_t total_bytes_ = 0;
};

}  // namespace torch_replay::schedule
