#pragma once

// Note [Replay contract]
// The reference semantics of design.md §2.1, independent of torch: a small
// interpreter of programs over typed buffers that share storage.
//
//   storage 0: [ b0 b1 b2 b3 b4 b5 b6 b7 | b8 ... ]   raw bytes
//   view  A  : float64 elements 0..n          (the storage's primary view)
//   view  B  : float64 elements 1..n-1        (an offset alias, same dtype)
//   view  C  : float32 / int32 over the same bytes (a typed alias)
//
// An op writes `len` elements of one destination view; element i is
//   z_i = m_i * (sum_j c_j * src_j[s_j + i] + bias) + sigma * u_i
//   v_i = store_dtype(f(z_i))
// where f is the nonlinearity, m_i a dropout mask and u_i noise, both drawn
// from an explicit counter-based generator R = (key, counter). Every operand
// is read at the version valid *before the op's own write* (all reads happen
// before any write), so overlapping source and destination ranges are
// well-defined and cannot be answered from the final buffer.
//
// Every written element is a version node keeping its operand version ids,
// coefficients, sampled mask / noise and nonlinearity. Reading bytes that the
// last writer produced through another dtype or element boundary yields a
// constant node ("reinterpreted bytes"); reading an int32 node as a float
// operand keeps the node, but an int32 write is not differentiable. Reverse
// accumulation is  vbar[p(k)] += vbar[k] * f'_k(z_k) * m_k * c_{k,p}  and
// stops at int32 nodes; an input whose influence on the loss passes through
// an int32 write or reinterpreted bytes gets no gradient value: it is
// classified "unsupported" (design.md §2.1), never given a number.
//
// Segment boundaries split the ops into segments. The byte rule: replaying a
// segment's ops from its start bytes B0 and generator state R0 must give its
// recorded end state, P(B0, R0) = (B_T, R_T), compared on storage bytes (not
// one view's values) and on the generator state. The preservation engines
// that make (B0, R0) available again are modelled on bytes: whole snapshot,
// region journal (undo newest first, redo to come back), read-set (the bytes
// of the segment's footprint) and guard (keep nothing, refuse unless the
// bytes the segment reads before writing them are still B0).
//
// The interpreter lives in four files: contract_program.cpp (programs and the
// seeded generator), contract_bytes.cpp (the byte machine), contract_graph.cpp
// (the version graph and its derivatives) and contract_checks.cpp (the checks
// behind `python -m torch_replay.suites`; its byte and engine checks drive the
// shipped engines of Note [Preservation engines]).

#include <bitset>
#include <complex>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torch_replay::contract {

// Each options / result struct below is followed by fields(), its members
// by name, once: the Python binding (csrc/python/bind_contract.cpp) reads
// and writes them through it instead of copying field by field.
template <typename S, typename T>
constexpr std::pair<const char*, T S::*> field(
    const char* name, T S::* member) {
  return {name, member};
}

constexpr int kMaxInputs = 512;
using InputSet = std::bitset<kMaxInputs>;

enum class DType : uint8_t { kFloat64, kFloat32, kInt32 };
int64_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);

enum class Nonlin : uint8_t { kIdentity, kTanh, kSin, kSigmoid };
std::string nonlin_name(Nonlin nonlin);

struct Storage {
  int64_t nbytes = 0;
  // Bytes at program start.
  std::vector<uint8_t> initial;
};

// A contiguous 1-D view: `numel` elements of `dtype` starting at
// `byte_offset` (a multiple of the dtype size) of storage `storage`.
struct View {
  int storage = 0;
  DType dtype = DType::kFloat64;
  int64_t byte_offset = 0;
  int64_t numel = 0;
};

struct Operand {
  int view = 0;
  int64_t start = 0;
  double coef = 1.0;
};

enum class OpKind : uint8_t { kWrite, kBoundary };

struct Op {
  OpKind kind = OpKind::kWrite;
  int dst_view = 0;
  int64_t dst_start = 0;
  int64_t len = 0;
  std::vector<Operand> operands;
  double bias = 0.0;
  Nonlin nonlin = Nonlin::kIdentity;
  // > 0: each element draws u in [-1, 1) and adds noise * u.
  double noise = 0.0;
  // > 0: each element draws r in [0, 1); m = r < dropout ? 0 : 1/(1-dropout).
  double dropout = 0.0;
};

struct RngState {
  uint64_t key = 0;
  uint64_t counter = 0;
  bool operator==(const RngState& o) const {
    return key == o.key && counter == o.counter;
  }
  bool operator!=(const RngState& o) const {
    return !(*this == o);
  }
};

// Counter-based generator: the i-th draw is a pure function of (key,
// counter + i). Draws in [0, 1).
double rng_uniform(const RngState& state, uint64_t i);

struct LossTerm {
  int view = 0;
  int64_t index = 0;
  double weight = 1.0;
};

struct Program {
  std::vector<Storage> storages;
  std::vector<View> views;
  // primary[s]: the view through which storage s was initialised.
  std::vector<int> primary;
  std::vector<Op> ops;
  RngState rng;
  // Inputs: every element of the float primary views of these storages.
  std::vector<int> input_storages;
  // The scalar output: sum of weight * value read at the end.
  std::vector<LossTerm> loss;

  int num_segments() const;
  // Number of ops (not counting boundaries) and storage bytes written.
  int64_t num_writes() const;
  std::string describe() const;
};

struct GeneratorOptions {
  int buffers = 3;
  // Elements of a storage's primary view.
  int min_elems = 6;
  int max_elems = 16;
  int ops = 12;
  int segments = 3;
  // Probability that an operand / destination goes through an alias view.
  double alias_rate = 0.3;
  // Probability that an op's destination overlaps one of its sources.
  double overlap_rate = 0.3;
  // Probability that an op draws noise / a dropout mask.
  double rng_rate = 0.3;
  // Probability that an op writes through an int32 view.
  double int_write_rate = 0.1;
  // Also float32 / int32 views over float64 storages (bytes only: reading
  // half a double as float32 gives arbitrary values, NaN included).
  bool cross_width_aliases = false;
  // Add a float64 canary storage and end with a nonlinear op that overwrites
  // its own operands there (so a replay that reads the final storage instead
  // of versions is detectable in every program).
  bool ensure_overwrite = true;
  // Seed of the initial bytes (0: derived from the program seed). Two
  // values give two inputs of the same program.
  uint64_t init_seed = 0;
};
constexpr auto fields(const GeneratorOptions*) {
  using O = GeneratorOptions;
  return std::make_tuple(
      field("buffers", &O::buffers),
      field("min_elems", &O::min_elems),
      field("max_elems", &O::max_elems),
      field("ops", &O::ops),
      field("segments", &O::segments),
      field("alias_rate", &O::alias_rate),
      field("overlap_rate", &O::overlap_rate),
      field("rng_rate", &O::rng_rate),
      field("int_write_rate", &O::int_write_rate),
      field("cross_width_aliases", &O::cross_width_aliases),
      field("ensure_overwrite", &O::ensure_overwrite),
      field("init_seed", &O::init_seed));
}

// Preconditions: buffers >= 1, 2 <= min_elems <= max_elems, ops >= 1,
// 1 <= segments <= ops, rates in [0, 1]. Throws ReplayException otherwise.
Program generate_program(uint64_t seed, const GeneratorOptions& options);

// ------------------------------------------------------------ byte machine

struct ByteState {
  std::vector<std::vector<uint8_t>> bytes;
  RngState rng;
  bool operator==(const ByteState& o) const {
    return bytes == o.bytes && rng == o.rng;
  }
  bool operator!=(const ByteState& o) const {
    return !(*this == o);
  }
};

// Byte ranges [begin, end) per storage.
struct Footprint {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges;
  int64_t bytes() const;
};

// One destructive write: the bytes it overwrote and wrote, with the
// generator state around it.
struct JournalEntry {
  int op = 0;
  int storage = 0;
  int64_t begin = 0;
  std::vector<uint8_t> before, after;
  RngState rng_before, rng_after;
};

ByteState initial_state(const Program& program);
// Runs ops [first, last) of `program` (boundaries are skipped) on `state`.
// Appends one entry per write to `journal` when it is not null.
// Precondition: `state` has the program's storage sizes.
void run_ops(
    const Program& program,
    int first,
    int last,
    ByteState& state,
    std::vector<JournalEntry>* journal = nullptr);
// [first, last) op index range of segment s.
std::pair<int, int> segment_ops(const Program& program, int segment);
// Bytes read or written by the ops of segment s.
Footprint segment_footprint(const Program& program, int segment);
// Bytes segment s reads before it writes them itself: what must still equal
// B0 for a replay from the live bytes to be exact (the guard's check).
Footprint exposed_reads(const Program& program, int segment);
uint64_t hash_footprint(const ByteState& state, const Footprint& fp);
// Float value of element `index` of view `view` in `state`.
double read_value(
    const Program& program, const ByteState& state, int view, int64_t index);
double loss_from_bytes(const Program& program, const ByteState& state);

// ----------------------------------------------------------- version graph

struct Node {
  int op = -1;  // -1: a leaf (initial element or reinterpreted bytes)
  int segment = 0;
  DType dtype = DType::kFloat64;
  Nonlin nonlin = Nonlin::kIdentity;
  bool integer = false;
  int input = -1;  // leaf: input coordinate, or -1 for a constant
  double bias = 0.0;
  double noise_term = 0.0;                      // sigma * u, sampled
  double mask = 1.0;                            // sampled
  std::vector<std::pair<int, double>> parents;  // version id, coefficient
  double z = 0.0;
  double value = 0.0;
  // Inputs this value depends on differentiably / through an int32 write or
  // reinterpreted bytes.
  InputSet dep, udep;
};

struct Trace {
  std::vector<Node> nodes;
  // Loss terms resolved to version ids.
  std::vector<std::pair<int, double>> loss;
  int num_inputs = 0;
  // Per input: view and index (its primary view element).
  std::vector<std::pair<int, int64_t>> inputs;
  std::vector<double> input_values;
  // Per op: id of the node written for its element 0 (its `len` nodes are
  // consecutive), -1 for a boundary.
  std::vector<int> op_first_node;
  // First node of each segment, plus nodes.size() at the end.
  std::vector<int> segment_nodes;
  ByteState final_state;
  double loss_value = 0.0;  // read from the final bytes
  // Per input: its gradient passes an int32 write / reinterpreted bytes.
  std::vector<bool> unsupported;
};

// Runs the program on bytes while building its version graph.
// Throws ReplayException if it has more than kMaxInputs inputs.
Trace trace_program(const Program& program);

// Per node, the replayable values (z, mask, noise term, value).
struct NodeValues {
  std::vector<double> z, mask, noise_term, value;
};
NodeValues recorded_values(const Trace& trace);
// Re-runs ops of `segment` from `state` (which is advanced) and returns the
// node values of that segment's nodes in the segment's node range of `out`.
void replay_segment_values(
    const Program& program,
    const Trace& trace,
    int segment,
    ByteState& state,
    NodeValues& out);

// Evaluates every node from the input values alone (no bytes), in T =
// double or std::complex<double>. Returns the loss.
template <typename T>
T evaluate_graph(const Trace& trace, const std::vector<T>& inputs);

// Reverse accumulation over the version graph with the given node values.
std::vector<double> reverse_gradient(
    const Trace& trace, const NodeValues& values);
// Control: f'_k evaluated at operands read from the *final* storage instead
// of their versions.
std::vector<double> reverse_gradient_final_storage(
    const Program& program, const Trace& trace);
// Forward-mode Jacobian of the loss (one tangent per input).
std::vector<double> forward_jacobian(const Trace& trace);
// Complex-step derivative of the loss for each input (step h).
std::vector<double> complex_step_gradient(const Trace& trace, double h);

// ------------------------------------------------------------------ checks

struct NumericResult {
  bool outputs_exact = false;  // graph evaluation == loss from bytes, bitwise
  double max_grad_mismatch = 0.0;  // reverse vs forward-mode, supported only
  int coordinates = 0;
  int unsupported = 0;
  bool control_detected = false;  // final-storage control differs
  double control_mismatch = 0.0;
};
constexpr auto fields(const NumericResult*) {
  using R = NumericResult;
  return std::make_tuple(
      field("outputs_exact", &R::outputs_exact),
      field("max_grad_mismatch", &R::max_grad_mismatch),
      field("coordinates", &R::coordinates),
      field("unsupported", &R::unsupported),
      field("control_detected", &R::control_detected),
      field("control_mismatch", &R::control_mismatch));
}
NumericResult check_numeric(const Program& program);

struct BytesResult {
  int segments = 0;
  int snapshot_ok = 0;
  int undo_ok = 0;  // undo reached B0 and the replay reached (B_T, R_T)
  int redo_ok = 0;  // redo came back to the final state
  int readset_ok = 0;
  int guard_ok = 0;
  int guard_refused = 0;  // footprint changed later: guard refuses
  int wrong_rng_detected = 0;
  int no_restore_wrong = 0;  // control: replay from the final bytes
  int64_t storage_ops = 0;
};
constexpr auto fields(const BytesResult*) {
  using R = BytesResult;
  return std::make_tuple(
      field("segments", &R::segments),
      field("snapshot_ok", &R::snapshot_ok),
      field("undo_ok", &R::undo_ok),
      field("redo_ok", &R::redo_ok),
      field("readset_ok", &R::readset_ok),
      field("guard_ok", &R::guard_ok),
      field("guard_refused", &R::guard_refused),
      field("wrong_rng_detected", &R::wrong_rng_detected),
      field("no_restore_wrong", &R::no_restore_wrong),
      field("storage_ops", &R::storage_ops));
}
BytesResult check_bytes(const Program& program);

enum class EngineKind { kEager, kSnapshot, kJournal, kReadset, kGuard, kNone };
std::string engine_kind_name(EngineKind engine);
EngineKind parse_engine_kind(const std::string& name);

struct EngineResult {
  bool refused = false;           // guard: state changed; never a value
  double max_grad_error = 0.0;    // vs forward-mode Jacobian, supported only
  double max_diff_eager = 0.0;    // vs eager reverse accumulation
  bool state_restored = false;    // live state after backward == final state
  bool repeat_identical = false;  // second backward gives identical grads
  int64_t retained_bytes = 0;
};
constexpr auto fields(const EngineResult*) {
  using R = EngineResult;
  return std::make_tuple(
      field("refused", &R::refused),
      field("max_grad_error", &R::max_grad_error),
      field("max_diff_eager", &R::max_diff_eager),
      field("state_restored", &R::state_restored),
      field("repeat_identical", &R::repeat_identical),
      field("retained_bytes", &R::retained_bytes));
}
// Checkpointed backward: each segment is replayed (newest first) from the
// state its engine restores, and its nodes' values are taken from the
// replay. kNone restores only the generator (torch.utils.checkpoint).
EngineResult check_engine(const Program& program, EngineKind engine);

struct ComplexStepResult {
  int coordinates = 0;
  int unsupported = 0;
  double max_mismatch = 0.0;
};
constexpr auto fields(const ComplexStepResult*) {
  using R = ComplexStepResult;
  return std::make_tuple(
      field("coordinates", &R::coordinates),
      field("unsupported", &R::unsupported),
      field("max_mismatch", &R::max_mismatch));
}
ComplexStepResult check_complex_step(const Program& program);

}  // namespace torch_replay::contract
