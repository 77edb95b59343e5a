// The replay-contract interpreter, part 2: the byte machine (running ops on
// storage bytes, footprints, hashes). See Note [Replay contract] in
// replay_contract.h.

#include "core/contract_internal.h"

namespace torch_replay::contract {

using namespace detail;  // NOLINT(google-build-using-namespace)

ByteState initial_state(const Program& p) {
  ByteState st;
  for (const Storage& s : p.storages) {
    st.bytes.push_back(s.initial);
  }
  st.rng = p.rng;
  return st;
}

void run_ops(
    const Program& p,
    int first,
    int last,
    ByteState& st,
    std::vector<JournalEntry>* journal) {
  for (int k = first; k < last; ++k) {
    const Op& op = p.ops[k];
    if (op.kind == OpKind::kBoundary) {
      continue;
    }
    JournalEntry e;
    auto [b, end] = dst_bytes(p, op);
    int s = p.views[op.dst_view].storage;
    if (journal) {
      e.op = k;
      e.storage = s;
      e.begin = b;
      e.before.assign(st.bytes[s].begin() + b, st.bytes[s].begin() + end);
      e.rng_before = st.rng;
    }
    execute_op(p, k, st);
    if (journal) {
      e.after.assign(st.bytes[s].begin() + b, st.bytes[s].begin() + end);
      e.rng_after = st.rng;
      journal->push_back(std::move(e));
    }
  }
}

std::pair<int, int> segment_ops(const Program& p, int segment) {
  int seg = 0, first = 0;
  for (int k = 0; k < static_cast<int>(p.ops.size()); ++k) {
    if (p.ops[k].kind == OpKind::kBoundary) {
      if (seg == segment) {
        return {first, k};
      }
      ++seg;
      first = k + 1;
    }
  }
  if (seg != segment) {
    invalid("segment_ops: no such segment");
  }
  return {first, static_cast<int>(p.ops.size())};
}

Footprint segment_footprint(const Program& p, int segment) {
  Footprint fp;
  fp.ranges.resize(p.storages.size());
  for_each_segment_op(p, segment, [&](int, const Op& op) {
    fp.ranges[p.views[op.dst_view].storage].push_back(dst_bytes(p, op));
    for (const Operand& o : op.operands) {
      fp.ranges[p.views[o.view].storage].push_back(operand_bytes(p, op, o));
    }
  });
  return fp;
}

Footprint exposed_reads(const Program& p, int segment) {
  Footprint fp;
  fp.ranges.resize(p.storages.size());
  std::vector<std::vector<bool>> written(p.storages.size());
  for (size_t s = 0; s < p.storages.size(); ++s) {
    written[s].assign(p.storages[s].nbytes, false);
  }
  for_each_segment_op(p, segment, [&](int, const Op& op) {
    for (const Operand& o : op.operands) {
      const View& v = p.views[o.view];
      auto [b, e] = operand_bytes(p, op, o);
      for (int64_t i = b; i < e; ++i) {
        if (!written[v.storage][i]) {
          fp.ranges[v.storage].push_back({i, i + 1});
        }
      }
    }
    auto [db, de] = dst_bytes(p, op);
    int s = p.views[op.dst_view].storage;
    std::fill(written[s].begin() + db, written[s].begin() + de, true);
  });
  return fp;
}

uint64_t hash_footprint(const ByteState& st, const Footprint& fp) {
  uint64_t h = 1469598103934665603ull;
  for (size_t s = 0; s < fp.ranges.size(); ++s) {
    for (auto [b, e] : fp.ranges[s]) {
      for (int64_t i = b; i < e; ++i) {
        h = (h ^ st.bytes[s][i]) * 1099511628211ull;
      }
      h = splitmix64(h ^ static_cast<uint64_t>(b * 131 + e));
    }
  }
  return h;
}

double read_value(
    const Program& p, const ByteState& st, int view, int64_t index) {
  return decode(element_ptr(p, st, view, index), p.views[view].dtype);
}

double loss_from_bytes(const Program& p, const ByteState& st) {
  double loss = 0.0;
  for (const LossTerm& t : p.loss) {
    loss = loss + t.weight * read_value(p, st, t.view, t.index);
  }
  return loss;
}

}  // namespace torch_replay::contract
