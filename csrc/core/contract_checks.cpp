// The replay-contract interpreter, part 4: the checks behind the suites
// (numeric, bytes and engines on the shipped preservation engines, complex
// step). See Note [Replay contract] in replay_contract.h.

#include "core/contract_internal.h"

#include "core/preservation_engine.h"

namespace torch_replay::contract {

using namespace detail;  // NOLINT(google-build-using-namespace)

namespace {

// Calls f(j) for each input coordinate j the trace gives a number (design.md
// §2.1), and counts the coordinates of both kinds into the result r.
template <typename Result, typename F>
void each_supported(const Trace& tr, Result& r, F&& f) {
  for (int j = 0; j < tr.num_inputs; ++j) {
    if (tr.unsupported[j]) {
      ++r.unsupported;
      continue;
    }
    ++r.coordinates;
    f(j);
  }
}

}  // namespace

NumericResult check_numeric(const Program& p) {
  NumericResult r;
  Trace tr = trace_program(p);
  double graph_loss = evaluate_graph<double>(tr, tr.input_values);
  ByteState again = initial_state(p);
  run_ops(p, 0, static_cast<int>(p.ops.size()), again);
  r.outputs_exact = same_bits(graph_loss, tr.loss_value) &&
                    same_bits(loss_from_bytes(p, again), tr.loss_value) &&
                    again == tr.final_state;
  std::vector<double> rev = reverse_gradient(tr, recorded_values(tr));
  std::vector<double> jac = forward_jacobian(tr);
  std::vector<double> ctrl = reverse_gradient_final_storage(p, tr);
  double ctrl_vs_rev = 0.0;
  each_supported(tr, r, [&](int j) {
    r.max_grad_mismatch = std::max(r.max_grad_mismatch, diff(rev[j], jac[j]));
    r.control_mismatch = std::max(r.control_mismatch, diff(ctrl[j], jac[j]));
    ctrl_vs_rev = std::max(ctrl_vs_rev, diff(ctrl[j], rev[j]));
  });
  r.control_detected = ctrl_vs_rev > 1e-12;
  return r;
}

namespace {

// The interpreter as a client of the shipped preservation engines (Note
// [Preservation engines]): storage s is key s + 1, its bytes those of the
// state the resolver is bound to, on the host byte device.
StorageKey key_of(int storage) {
  return static_cast<StorageKey>(storage) + 1;
}

Resolver resolver_of(ByteState& st) {
  return [&st](StorageKey key) -> StorageRef {
    std::vector<uint8_t>& b = st.bytes.at(key - 1);
    return {b.data(), static_cast<int64_t>(b.size()), &host_device()};
  };
}

RangeSet range_of(int64_t begin, int64_t end) {
  RangeSet r;
  r.add(begin, end);
  return r;
}

// One segment's forward under `engine`: every storage is declared; before
// each op, its operand reads and its destination write are shown to the
// engine, and the write to the journal's watch, as the ATen observer does.
void forward_segment(
    const Program& p,
    int segment,
    ByteState& st,
    PreservationEngine& engine,
    RegionJournal& journal) {
  const Resolver resolve = resolver_of(st);
  for (size_t b = 0; b < st.bytes.size(); ++b) {
    const StorageKey key = key_of(static_cast<int>(b));
    engine.declare(key, resolve(key));
  }
  for_each_segment_op(p, segment, [&](int k, const Op& op) {
    for (const Operand& o : op.operands) {
      auto [b, e] = operand_bytes(p, op, o);
      const StorageKey key = key_of(p.views[o.view].storage);
      engine.access(key, resolve(key), range_of(b, e), Access::kRead);
    }
    auto [db, de] = dst_bytes(p, op);
    const StorageKey key = key_of(p.views[op.dst_view].storage);
    const RangeSet dst = range_of(db, de);
    engine.access(key, resolve(key), dst, Access::kWrite);
    journal.record_if_watched(key, resolve(key), dst);
    execute_op(p, k, st);
  });
  engine.end_forward();
}

// A forward of every segment, each under its own engine of `kind`.
struct EngineRun {
  RegionJournal journal;  // outlives the engines (declared first)
  std::vector<std::unique_ptr<PreservationEngine>> engines;
  std::vector<ByteState> start, end;
  ByteState final_state;
};

void run_with_engines(
    const Program& p, torch_replay::EngineKind kind, EngineRun& run) {
  ByteState st = initial_state(p);
  for (int s = 0; s < p.num_segments(); ++s) {
    run.start.push_back(st);
    run.engines.push_back(make_engine(kind, run.journal));
    forward_segment(p, s, st, *run.engines.back(), run.journal);
    run.end.push_back(st);
  }
  run.final_state = st;
}

// The re-run protocol of the ATen Transaction on interpreter bytes: saves
// the live bytes the restore and the re-run will rewrite (`fp`: the
// segment's footprint), asks the engine for B0. Returns the refused storage
// (0 if none).
StorageKey begin_rerun(
    PreservationEngine& engine,
    const Footprint& fp,
    ByteState& live,
    RegionStore& saved) {
  const Resolver resolve = resolver_of(live);
  for (const auto& [key, ranges] : engine.restored_regions()) {
    saved.save(key, resolve(key), ranges);
  }
  for (size_t b = 0; b < fp.ranges.size(); ++b) {
    RangeSet r;
    for (auto [lo, hi] : fp.ranges[b]) {
      r.add(lo, hi);
    }
    if (!r.empty()) {
      const StorageKey key = key_of(static_cast<int>(b));
      saved.save(key, resolve(key), r);
    }
  }
  const StorageKey bad = engine.restore_start(resolve);
  if (bad != 0) {
    saved.restore_all(resolve);
    saved.clear();
  }
  return bad;
}

void finish_rerun(ByteState& live, RegionStore& saved, const RngState& rng) {
  saved.restore_all(resolver_of(live));
  saved.clear();
  live.rng = rng;
}

}  // namespace

BytesResult check_bytes(const Program& p) {
  BytesResult r;
  const int nseg = p.num_segments();
  r.segments = nseg;
  r.storage_ops = p.num_writes();
  std::vector<Footprint> fps(nseg);
  for (int s = 0; s < nseg; ++s) {
    fps[s] = segment_footprint(p, s);
  }
  auto replay = [&](int s, ByteState from) {
    auto [first, last] = segment_ops(p, s);
    run_ops(p, first, last, from);
    return from;
  };
  using torch_replay::EngineKind;
  for (EngineKind kind :
       {EngineKind::kSnapshot,
        EngineKind::kJournal,
        EngineKind::kReadset,
        EngineKind::kGuard}) {
    EngineRun run;
    run_with_engines(p, kind, run);
    ByteState live = run.final_state;
    // Newest segment first, as backward runs them.
    for (int s = nseg - 1; s >= 0; --s) {
      const Footprint& fp = fps[s];
      RegionStore saved;
      const RngState live_rng = live.rng;
      const StorageKey bad = begin_rerun(*run.engines[s], fp, live, saved);
      live.rng = run.start[s].rng;
      const ByteState& b0 = run.start[s];
      const ByteState& bt = run.end[s];
      switch (kind) {
        case EngineKind::kSnapshot:
          // Every byte is B0 again; the re-run reaches (B_T, R_T).
          r.snapshot_ok += bad == 0 && live == b0 && replay(s, live) == bt;
          break;
        case EngineKind::kJournal:
          // The undo reached B0 exactly (the log holds every later write).
          r.undo_ok += bad == 0 && live == b0 && replay(s, live) == bt;
          break;
        case EngineKind::kReadset: {
          ByteState end = replay(s, live);
          r.readset_ok += bad == 0 &&
                          hash_footprint(live, fp) == hash_footprint(b0, fp) &&
                          hash_footprint(end, fp) == hash_footprint(bt, fp) &&
                          end.rng == bt.rng;
          break;
        }
        case EngineKind::kGuard:
          if (bad != 0) {
            ++r.guard_refused;
          } else {
            ByteState end = replay(s, live);
            r.guard_ok += hash_footprint(end, fp) == hash_footprint(bt, fp) &&
                          end.rng == bt.rng;
          }
          break;
        case EngineKind::kAuto:
          break;
      }
      finish_rerun(live, saved, live_rng);
    }
    // Redo: putting the live bytes back after each re-run ends where the
    // forward ended.
    if (kind == EngineKind::kJournal && live == run.final_state) {
      r.redo_ok = nseg;
    }
    if (kind == EngineKind::kSnapshot) {
      for (int s = 0; s < nseg; ++s) {
        // Wrong generator state: one draw further.
        ByteState wrong = run.start[s];
        wrong.rng.counter += 1;
        r.wrong_rng_detected += replay(s, wrong) != run.end[s];
        // Control: re-run from the final bytes (generator restored).
        ByteState c = run.final_state;
        c.rng = run.start[s].rng;
        r.no_restore_wrong += hash_footprint(replay(s, c), fps[s]) !=
                              hash_footprint(run.end[s], fps[s]);
      }
    }
  }
  return r;
}

// The interpreter's comparison points around the shipped engines' names
// (Note [Preservation engines]): "eager" keeps every activation, "none"
// restores only the generator, as torch.utils.checkpoint does.
std::string engine_kind_name(EngineKind e) {
  switch (e) {
    case EngineKind::kEager:
      return "eager";
    case EngineKind::kSnapshot:
      return torch_replay::engine_name(torch_replay::EngineKind::kSnapshot);
    case EngineKind::kJournal:
      return torch_replay::engine_name(torch_replay::EngineKind::kJournal);
    case EngineKind::kReadset:
      return torch_replay::engine_name(torch_replay::EngineKind::kReadset);
    case EngineKind::kGuard:
      return torch_replay::engine_name(torch_replay::EngineKind::kGuard);
    case EngineKind::kNone:
      return "none";
  }
  return "?";
}

EngineKind parse_engine_kind(const std::string& name) {
  std::string valid;
  for (EngineKind e :
       {EngineKind::kEager,
        EngineKind::kSnapshot,
        EngineKind::kJournal,
        EngineKind::kReadset,
        EngineKind::kGuard,
        EngineKind::kNone}) {
    if (engine_kind_name(e) == name) {
      return e;
    }
    valid += (valid.empty() ? "" : ", ") + engine_kind_name(e);
  }
  invalid("engine must be one of " + valid + "; got '" + name + "'");
}

EngineResult check_engine(const Program& p, EngineKind engine) {
  EngineResult r;
  Trace tr = trace_program(p);
  const NodeValues recorded = recorded_values(tr);
  const std::vector<double> eager = reverse_gradient(tr, recorded);
  const std::vector<double> jac = forward_jacobian(tr);
  const int nseg = p.num_segments();
  std::vector<Footprint> fps(nseg), exposed(nseg);
  for (int s = 0; s < nseg; ++s) {
    fps[s] = segment_footprint(p, s);
    exposed[s] = exposed_reads(p, s);
  }
  // kNone (torch.utils.checkpoint) restores only the generator: its forward
  // runs with the guard, which keeps nothing, and its refusals are ignored.
  const bool none = engine == EngineKind::kNone;
  const bool eager_mode = engine == EngineKind::kEager;
  const torch_replay::EngineKind kind =
      none || eager_mode ? torch_replay::EngineKind::kGuard
                         : torch_replay::parse_engine(engine_kind_name(engine));

  // The forward, each segment under its own engine (the shipped classes).
  EngineRun run;
  run_with_engines(p, kind, run);
  if (eager_mode) {
    r.retained_bytes = static_cast<int64_t>(tr.nodes.size()) * 2 * 8;
  } else if (kind == torch_replay::EngineKind::kJournal) {
    r.retained_bytes = run.journal.bytes();  // one shared log
  } else if (!none) {
    for (const auto& e : run.engines) {
      r.retained_bytes += e->retained_bytes();
    }
  }
  std::vector<uint64_t> end_hash(nseg), exposed_hash(nseg);
  for (int s = 0; s < nseg; ++s) {
    end_hash[s] = hash_footprint(run.end[s], fps[s]);
    exposed_hash[s] = hash_footprint(run.start[s], exposed[s]);
  }

  // Backward: newest segment first. Returns false if a re-run failed its
  // check (an engine bug) and sets r.refused if the engine refuses.
  auto backward = [&](ByteState& live, std::vector<double>& grad) {
    if (eager_mode) {
      grad = reverse_gradient(tr, recorded);
      return true;
    }
    NodeValues vals = recorded;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (size_t k = 0; k < tr.nodes.size(); ++k) {
      if (tr.nodes[k].op >= 0) {  // dropped activations
        vals.z[k] = vals.mask[k] = vals.value[k] = nan;
      }
    }
    bool ok = true;
    for (int s = nseg - 1; s >= 0; --s) {
      RegionStore saved;
      const RngState live_rng = live.rng;
      if (none) {
        for (size_t b = 0; b < fps[s].ranges.size(); ++b) {
          RangeSet rs;
          for (auto [lo, hi] : fps[s].ranges[b]) {
            rs.add(lo, hi);
          }
          const StorageKey key = key_of(static_cast<int>(b));
          saved.save(key, resolver_of(live)(key), rs);
        }
      } else if (begin_rerun(*run.engines[s], fps[s], live, saved) != 0) {
        r.refused = true;
        return true;
      }
      live.rng = run.start[s].rng;
      if (!none && hash_footprint(live, exposed[s]) != exposed_hash[s]) {
        ok = false;
      }
      replay_segment_values(p, tr, s, live, vals);
      if (!none && (hash_footprint(live, fps[s]) != end_hash[s] ||
                    live.rng != run.end[s].rng)) {
        ok = false;
      }
      finish_rerun(live, saved, live_rng);
    }
    grad = reverse_gradient(tr, vals);
    return ok;
  };
  ByteState live = run.final_state;
  std::vector<double> g1, g2;
  bool ok1 = backward(live, g1);
  r.state_restored = live == run.final_state;
  if (r.refused) {
    return r;
  }
  bool ok2 = backward(live, g2);
  r.repeat_identical = ok2 && live == run.final_state;
  for (int j = 0; j < tr.num_inputs; ++j) {
    r.repeat_identical = r.repeat_identical && same_bits(g1[j], g2[j]);
    if (tr.unsupported[j]) {
      continue;
    }
    r.max_grad_error = std::max(r.max_grad_error, diff(g1[j], jac[j]));
    r.max_diff_eager = std::max(r.max_diff_eager, diff(g1[j], eager[j]));
  }
  if (!ok1) {
    r.max_grad_error = std::numeric_limits<double>::infinity();
  }
  return r;
}

ComplexStepResult check_complex_step(const Program& p) {
  ComplexStepResult r;
  Trace tr = trace_program(p);
  std::vector<double> cs = complex_step_gradient(tr, 1e-30);
  std::vector<double> rev = reverse_gradient(tr, recorded_values(tr));
  each_supported(tr, r, [&](int j) {
    r.max_mismatch = std::max(r.max_mismatch, diff(cs[j], rev[j]));
  });
  return r;
}

}  // namespace torch_replay::contract
