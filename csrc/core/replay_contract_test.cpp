#include "core/replay_contract.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/status.h"

namespace torch_replay::contract {
namespace {

// One float64 storage of n elements holding `values`, primary view 0.
Program one_buffer(const std::vector<double>& values) {
  Program p;
  Storage s;
  s.nbytes = static_cast<int64_t>(values.size()) * 8;
  s.initial.resize(s.nbytes);
  std::memcpy(s.initial.data(), values.data(), s.nbytes);
  p.storages.push_back(s);
  p.views.push_back(
      {0, DType::kFloat64, 0, static_cast<int64_t>(values.size())});
  p.primary = {0};
  p.input_storages = {0};
  p.rng = {42, 0};
  return p;
}

Op write(int dst, int64_t start, int64_t len, std::vector<Operand> operands) {
  Op op;
  op.dst_view = dst;
  op.dst_start = start;
  op.len = len;
  op.operands = std::move(operands);
  return op;
}

TEST(ReplayContractTest, CounterGeneratorIsAPureFunctionOfKeyAndCounter) {
  RngState a{7, 10}, b{7, 11}, c{8, 10};
  EXPECT_EQ(rng_uniform(a, 1), rng_uniform(b, 0));
  EXPECT_NE(rng_uniform(a, 0), rng_uniform(c, 0));
  for (int i = 0; i < 100; ++i) {
    double u = rng_uniform(a, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// Overlapping shift, x[1:3] = x[0:2]:
//
//   before  [ 1 | 2 | 3 | 4 ]
//   after   [ 1 | 1 | 2 | 4 ]   (reads the versions before the write)
//
// An element-by-element in-place loop would give [1 1 1 4].
TEST(ReplayContractTest, OverlappingWriteReadsVersionsBeforeItsOwnWrite) {
  Program p = one_buffer({1, 2, 3, 4});
  p.ops.push_back(write(0, 1, 2, {{0, 0, 1.0}}));
  Trace tr = trace_program(p);
  EXPECT_EQ(read_value(p, tr.final_state, 0, 1), 1.0);
  EXPECT_EQ(read_value(p, tr.final_state, 0, 2), 2.0);
  // The node written at element 2 has the *leaf* of element 1 as parent, not
  // the node written at element 1 by the same op.
  const Node& n2 = tr.nodes[tr.op_first_node[0] + 1];
  EXPECT_EQ(n2.parents[0].first, 1);
  EXPECT_EQ(tr.nodes[1].op, -1);
}

// y = tanh(a * x0), then x0 is overwritten: the gradient must use the old x0.
TEST(ReplayContractTest, ReverseAccumulationUsesVersionsNotFinalStorage) {
  Program p = one_buffer({0.7, 0.0});
  const double a = 0.6;
  Op op = write(0, 1, 1, {{0, 0, a}});
  op.nonlin = Nonlin::kTanh;
  p.ops.push_back(op);
  p.ops.push_back(write(0, 0, 1, {{0, 0, 3.0}}));  // x0 <- 3 * x0
  p.loss = {{0, 1, 1.0}};
  Trace tr = trace_program(p);
  std::vector<double> g = reverse_gradient(tr, recorded_values(tr));
  double t = std::tanh(a * 0.7);
  EXPECT_DOUBLE_EQ(g[0], a * (1 - t * t));
  std::vector<double> ctrl = reverse_gradient_final_storage(p, tr);
  double tf = std::tanh(a * (3.0 * 0.7));
  EXPECT_DOUBLE_EQ(ctrl[0], a * (1 - tf * tf));
  EXPECT_NE(ctrl[0], g[0]);
  EXPECT_EQ(forward_jacobian(tr)[0], g[0]);
}

TEST(ReplayContractTest, TypedAliasSharesBytes) {
  // float32 storage with an int32 view over the same bytes.
  Program p;
  Storage s;
  s.nbytes = 8;
  s.initial.assign(8, 0);
  p.storages.push_back(s);
  p.views.push_back({0, DType::kFloat32, 0, 2});
  p.views.push_back({0, DType::kInt32, 0, 2});
  p.primary = {0};
  p.input_storages = {0};
  Op op = write(0, 0, 1, {});
  op.bias = 1.5;
  p.ops.push_back(op);
  p.loss = {{0, 0, 1.0}};
  Trace tr = trace_program(p);
  float f = 1.5f;
  int32_t bits;
  std::memcpy(&bits, &f, 4);
  EXPECT_EQ(read_value(p, tr.final_state, 1, 0), static_cast<double>(bits));
}

TEST(ReplayContractTest, GradientThroughIntegerWriteIsUnsupported) {
  // x (float64, input) -> c (int32 storage) -> x[1]: the path passes an
  // integer write, so x0 gets no gradient value.
  Program p = one_buffer({2.2, 0.0, 0.5});
  Storage c;
  c.nbytes = 4;
  c.initial.assign(4, 0);
  p.storages.push_back(c);
  p.views.push_back({1, DType::kInt32, 0, 1});
  p.primary.push_back(1);
  p.ops.push_back(write(1, 0, 1, {{0, 0, 1.0}}));  // c = round(x0)
  p.ops.push_back(write(0, 1, 1, {{1, 0, 1.0}, {0, 2, 1.0}}));
  p.loss = {{0, 1, 1.0}};
  Trace tr = trace_program(p);
  EXPECT_EQ(read_value(p, tr.final_state, 0, 1), 2.0 + 0.5);
  EXPECT_TRUE(tr.unsupported[0]);
  EXPECT_FALSE(tr.unsupported[2]);
  EXPECT_EQ(reverse_gradient(tr, recorded_values(tr))[2], 1.0);
}

TEST(ReplayContractTest, ReplayFromWrongGeneratorStateIsDetected) {
  Program p = one_buffer({0.1, 0.2, 0.3});
  Op op = write(0, 0, 3, {{0, 0, 1.0}});
  op.noise = 0.1;
  p.ops.push_back(op);
  ByteState a = initial_state(p), b = initial_state(p);
  b.rng.counter += 1;
  run_ops(p, 0, 1, a);
  run_ops(p, 0, 1, b);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rng.counter, 3u);
}

// Against central differences, independent of every AD code path.
TEST(ReplayContractTest, GradientsMatchCentralDifferences) {
  GeneratorOptions o;
  o.buffers = 2;
  o.int_write_rate = 0.0;
  int tested = 0;
  for (uint64_t seed = 1; seed <= 400 && tested < 20; ++seed) {
    Program p = generate_program(seed, o);
    // Only float64 programs: float32 rounding defeats a 1e-6 step.
    bool f64 = true;
    for (const View& v : p.views) {
      f64 = f64 && v.dtype == DType::kFloat64;
    }
    if (!f64) {
      continue;
    }
    ++tested;
    Trace tr = trace_program(p);
    std::vector<double> g = reverse_gradient(tr, recorded_values(tr));
    for (int j = 0; j < tr.num_inputs; ++j) {
      if (tr.unsupported[j] || tr.nodes.empty()) {
        continue;
      }
      const auto [view, index] = tr.inputs[j];
      const View& v = p.views[view];
      if (v.dtype != DType::kFloat64) {
        continue;  // float32 inputs cannot be perturbed by 1e-6 exactly
      }
      double fd[2];
      for (int side = 0; side < 2; ++side) {
        Program q = p;
        double x;
        std::memcpy(&x, q.storages[v.storage].initial.data() + index * 8, 8);
        x += side == 0 ? 1e-6 : -1e-6;
        std::memcpy(q.storages[v.storage].initial.data() + index * 8, &x, 8);
        ByteState st = initial_state(q);
        run_ops(q, 0, static_cast<int>(q.ops.size()), st);
        fd[side] = loss_from_bytes(q, st);
      }
      EXPECT_NEAR((fd[0] - fd[1]) / 2e-6, g[j], 1e-6)
          << "seed " << seed << " input " << j << "\n"
          << p.describe();
    }
  }
  EXPECT_EQ(tested, 20);
}

TEST(ReplayContractTest, GeneratedProgramsPassTheNumericCheck) {
  GeneratorOptions o;
  int detected = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    NumericResult r = check_numeric(generate_program(seed, o));
    EXPECT_TRUE(r.outputs_exact) << seed;
    EXPECT_LE(r.max_grad_mismatch, 1e-15) << seed;
    detected += r.control_detected;
  }
  EXPECT_EQ(detected, 200);
}

TEST(ReplayContractTest, GeneratedProgramsPassTheByteCheck) {
  GeneratorOptions o;
  o.cross_width_aliases = true;
  o.alias_rate = 0.6;
  o.ensure_overwrite = false;
  int refused = 0, guarded = 0, control_wrong = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Program p = generate_program(seed, o);
    BytesResult r = check_bytes(p);
    EXPECT_EQ(r.snapshot_ok, r.segments) << seed;
    EXPECT_EQ(r.undo_ok, r.segments) << seed;
    EXPECT_EQ(r.redo_ok, r.segments) << seed;
    EXPECT_EQ(r.readset_ok, r.segments) << seed;
    EXPECT_EQ(r.guard_ok + r.guard_refused, r.segments) << seed;
    EXPECT_EQ(r.wrong_rng_detected, r.segments) << seed;
    refused += r.guard_refused;
    guarded += r.guard_ok;
    control_wrong += r.no_restore_wrong;
  }
  EXPECT_GT(guarded, 0);
  // Later segments do overwrite earlier footprints in this family: the guard
  // refuses and a replay without restoring is wrong.
  EXPECT_GT(refused, 0);
  EXPECT_GT(control_wrong, 0);
}

TEST(ReplayContractTest, EnginesGiveTheEagerGradient) {
  GeneratorOptions o;
  o.ensure_overwrite = false;
  GeneratorOptions small = o;  // few ops over many buffers: often guardable
  small.buffers = 5;
  small.ops = 3;
  small.segments = 3;
  int guard_refused = 0, guard_exact = 0, none_wrong = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    Program p = generate_program(seed, seed % 2 ? small : o);
    for (EngineKind e :
         {EngineKind::kEager,
          EngineKind::kSnapshot,
          EngineKind::kJournal,
          EngineKind::kReadset,
          EngineKind::kGuard}) {
      EngineResult r = check_engine(p, e);
      if (r.refused) {
        EXPECT_EQ(e, EngineKind::kGuard);
        ++guard_refused;
        continue;
      }
      guard_exact += e == EngineKind::kGuard;
      EXPECT_EQ(r.max_diff_eager, 0.0) << seed << engine_kind_name(e);
      EXPECT_LE(r.max_grad_error, 1e-15) << seed << engine_kind_name(e);
      EXPECT_TRUE(r.state_restored);
      EXPECT_TRUE(r.repeat_identical);
    }
    none_wrong += check_engine(p, EngineKind::kNone).max_diff_eager > 0;
  }
  EXPECT_GT(guard_refused, 0);
  EXPECT_GT(guard_exact, 0);
  EXPECT_GT(none_wrong, 0);
}

TEST(ReplayContractTest, ComplexStepMatchesReverseMode) {
  GeneratorOptions o;
  int coords = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    ComplexStepResult r = check_complex_step(generate_program(seed, o));
    EXPECT_LE(r.max_mismatch, 1e-15) << seed;
    coords += r.coordinates;
  }
  EXPECT_GT(coords, 1000);
}

TEST(ReplayContractTest, GeneratorKnobs) {
  GeneratorOptions o;
  o.alias_rate = 0.0;
  o.overlap_rate = 0.0;
  o.rng_rate = 0.0;
  o.int_write_rate = 0.0;
  o.ensure_overwrite = false;
  o.segments = 4;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Program p = generate_program(seed, o);
    EXPECT_EQ(p.num_segments(), 4);
    for (const Op& op : p.ops) {
      if (op.kind == OpKind::kBoundary) {
        continue;
      }
      EXPECT_EQ(op.noise, 0.0);
      EXPECT_EQ(op.dropout, 0.0);
      EXPECT_NE(p.views[op.dst_view].dtype, DType::kInt32);
      EXPECT_EQ(p.views[op.dst_view].byte_offset, 0);  // a primary view
      const View& dv = p.views[op.dst_view];
      int64_t db = op.dst_start * dtype_size(dv.dtype);
      int64_t de = db + op.len * dtype_size(dv.dtype);
      for (const Operand& a : op.operands) {
        const View& sv = p.views[a.view];
        EXPECT_EQ(sv.byte_offset, 0);
        int64_t sb = a.start * dtype_size(sv.dtype);
        int64_t se = sb + op.len * dtype_size(sv.dtype);
        // No source overlaps the destination's bytes.
        EXPECT_TRUE(sv.storage != dv.storage || se <= db || de <= sb);
      }
    }
  }
  // Same seed, same program; different init_seed, same ops, other bytes.
  Program a = generate_program(9, GeneratorOptions{});
  Program b = generate_program(9, GeneratorOptions{});
  EXPECT_EQ(a.describe(), b.describe());
  GeneratorOptions other;
  other.init_seed = 12345;
  Program c = generate_program(9, other);
  EXPECT_EQ(a.describe(), c.describe());
  EXPECT_NE(a.storages[0].initial, c.storages[0].initial);
}

TEST(ReplayContractTest, InvalidOptionsThrow) {
  GeneratorOptions o;
  o.min_elems = 10;
  o.max_elems = 3;
  EXPECT_THROW(generate_program(0, o), ReplayException);
  GeneratorOptions r;
  r.rng_rate = 1.5;
  EXPECT_THROW(generate_program(0, r), ReplayException);
  EXPECT_THROW(parse_engine_kind("bogus"), ReplayException);
}

}  // namespace
}  // namespace torch_replay::contract
