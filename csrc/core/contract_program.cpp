// The replay-contract interpreter, part 1: programs (types, names, the seeded
// generator). See Note [Replay contract] in replay_contract.h.

#include "core/contract_internal.h"

#include <map>
#include <random>
#include <set>
#include <sstream>

namespace torch_replay::contract {

using namespace detail;  // NOLINT(google-build-using-namespace)

int64_t dtype_size(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : 4;
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      return "float32";
    case DType::kInt32:
      return "int32";
  }
  return "?";
}

std::string nonlin_name(Nonlin nonlin) {
  switch (nonlin) {
    case Nonlin::kIdentity:
      return "identity";
    case Nonlin::kTanh:
      return "tanh";
    case Nonlin::kSin:
      return "sin";
    case Nonlin::kSigmoid:
      return "sigmoid";
  }
  return "?";
}

double rng_uniform(const RngState& state, uint64_t i) {
  uint64_t x = splitmix64(state.key ^ splitmix64(state.counter + i));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

int Program::num_segments() const {
  int n = 1;
  for (const Op& op : ops) {
    n += op.kind == OpKind::kBoundary;
  }
  return n;
}

int64_t Program::num_writes() const {
  int64_t n = 0;
  for (const Op& op : ops) {
    n += op.kind == OpKind::kWrite;
  }
  return n;
}

std::string Program::describe() const {
  std::ostringstream os;
  for (size_t s = 0; s < storages.size(); ++s) {
    os << "storage " << s << ": " << storages[s].nbytes << " bytes\n";
  }
  for (size_t v = 0; v < views.size(); ++v) {
    const View& w = views[v];
    os << "view " << v << ": storage " << w.storage << " "
       << dtype_name(w.dtype) << " +" << w.byte_offset << " x" << w.numel
       << "\n";
  }
  for (const Op& op : ops) {
    if (op.kind == OpKind::kBoundary) {
      os << "---- segment boundary\n";
      continue;
    }
    os << "v" << op.dst_view << "[" << op.dst_start << ":"
       << op.dst_start + op.len << "] = " << nonlin_name(op.nonlin) << "(";
    for (const Operand& o : op.operands) {
      os << o.coef << "*v" << o.view << "[" << o.start << ":"
         << o.start + op.len << "] + ";
    }
    os << op.bias << ")";
    if (op.dropout > 0) {
      os << " dropout " << op.dropout;
    }
    if (op.noise > 0) {
      os << " noise " << op.noise;
    }
    os << "\n";
  }
  return os.str();
}

int64_t Footprint::bytes() const {
  int64_t total = 0;
  for (auto r : ranges) {
    std::sort(r.begin(), r.end());
    int64_t end = std::numeric_limits<int64_t>::min();
    for (auto [b, e] : r) {
      b = std::max(b, end);
      if (e > b) {
        total += e - b;
        end = e;
      }
    }
  }
  return total;
}

// ------------------------------------------------------------ generation

Program generate_program(uint64_t seed, const GeneratorOptions& o) {
  if (o.buffers < 1 || o.min_elems < 2 || o.min_elems > o.max_elems ||
      o.ops < 1 || o.segments < 1 || o.segments > o.ops) {
    invalid(
        "generate_program: need buffers >= 1, 2 <= min_elems <= max_elems, "
        "ops >= 1 and 1 <= segments <= ops");
  }
  for (double r :
       {o.alias_rate, o.overlap_rate, o.rng_rate, o.int_write_rate}) {
    if (!(r >= 0.0 && r <= 1.0)) {
      invalid("generate_program: rates must be in [0, 1]");
    }
  }
  std::mt19937_64 g(splitmix64(seed));
  std::mt19937_64 gi(splitmix64(o.init_seed ? o.init_seed : seed ^ 0xABCDu));
  auto uni = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(g);
  };
  auto pick = [&](int64_t a, int64_t b) {  // inclusive
    return std::uniform_int_distribution<int64_t>(a, b)(g);
  };
  auto coin = [&](double p) { return uni(0.0, 1.0) < p; };

  Program p;
  p.rng = {splitmix64(seed ^ 0x5EEDu), 0};
  std::normal_distribution<double> normal(0.0, 0.8);
  // Storage kinds: 0 float64, 1 float32, 2 int32 (never the first).
  std::vector<int> kinds;
  for (int b = 0; b < o.buffers; ++b) {
    double r = uni(0.0, 1.0);
    kinds.push_back(b == 0 ? 0 : (r < 0.5 ? 0 : (r < 0.85 ? 1 : 2)));
  }
  std::vector<int> float_views, alias_float_views, int_views;
  for (int b = 0; b < o.buffers; ++b) {
    int64_t n = pick(o.min_elems, o.max_elems);
    DType pd = kinds[b] == 0
                   ? DType::kFloat64
                   : (kinds[b] == 1 ? DType::kFloat32 : DType::kInt32);
    Storage s;
    s.nbytes = n * dtype_size(pd);
    s.initial.resize(s.nbytes);
    for (int64_t i = 0; i < n; ++i) {
      double v = pd == DType::kInt32
                     ? static_cast<double>(
                           std::uniform_int_distribution<int>(0, 9)(gi))
                     : normal(gi);
      encode(s.initial.data() + i * dtype_size(pd), pd, v);
    }
    p.storages.push_back(std::move(s));
    int pv = static_cast<int>(p.views.size());
    p.views.push_back({b, pd, 0, n});
    p.primary.push_back(pv);
    (pd == DType::kInt32 ? int_views : float_views).push_back(pv);
    if (pd != DType::kInt32) {
      p.input_storages.push_back(b);
    }
    auto add = [&](DType d, int64_t byte_off) {
      int64_t size = dtype_size(d);
      int64_t numel = (p.storages[b].nbytes - byte_off) / size;
      if (numel < 2) {
        return;
      }
      int id = static_cast<int>(p.views.size());
      p.views.push_back({b, d, byte_off, numel});
      if (d == DType::kInt32) {
        int_views.push_back(id);
      } else {
        alias_float_views.push_back(id);
      }
    };
    int64_t es = dtype_size(pd);
    add(pd, es * pick(1, 2));  // offset alias of the same dtype
    if (kinds[b] == 1) {
      add(DType::kInt32, 0);
      add(DType::kInt32, 4 * pick(1, 2));
    } else if (kinds[b] == 2) {
      add(DType::kFloat32, 0);
    } else if (o.cross_width_aliases) {
      add(DType::kFloat32, 4 * pick(0, 1));
      add(DType::kInt32, 4 * pick(0, 3));
    }
  }

  auto random_view = [&](std::vector<int> pool, int64_t min_len) {
    pool.erase(
        std::remove_if(
            pool.begin(),
            pool.end(),
            [&](int v) { return p.views[v].numel < min_len; }),
        pool.end());
    if (pool.empty()) {
      return -1;
    }
    return pool[pick(0, static_cast<int64_t>(pool.size()) - 1)];
  };
  const Nonlin nonlins[] = {
      Nonlin::kIdentity, Nonlin::kTanh, Nonlin::kSin, Nonlin::kSigmoid};

  std::set<int> boundaries;  // boundary before op index
  while (static_cast<int>(boundaries.size()) < o.segments - 1) {
    boundaries.insert(static_cast<int>(pick(1, o.ops - 1)));
  }
  for (int k = 0; k < o.ops; ++k) {
    if (boundaries.count(k)) {
      Op b;
      b.kind = OpKind::kBoundary;
      p.ops.push_back(b);
    }
    Op op;
    bool int_write = coin(o.int_write_rate) && !int_views.empty();
    int dst = -1;
    if (int_write) {
      dst = random_view(int_views, 1);
    } else if (coin(o.alias_rate) && !alias_float_views.empty()) {
      dst = random_view(alias_float_views, 1);
    }
    if (dst < 0) {
      dst = random_view(float_views, 1);
    }
    const View& dv = p.views[dst];
    op.dst_view = dst;
    op.len = pick(1, std::min<int64_t>(dv.numel, 6));
    op.dst_start = pick(0, dv.numel - op.len);
    int nops = static_cast<int>(pick(1, 3));
    for (int j = 0; j < nops; ++j) {
      Operand a;
      a.coef = uni(0.2, 0.7) * (coin(0.5) ? 1.0 : -1.0);
      if (j == 0 && coin(o.overlap_rate) && dv.numel > op.len) {
        // Same view, shifted: source and destination overlap.
        a.view = dst;
        int64_t lo = std::max<int64_t>(0, op.dst_start - 2);
        int64_t hi = std::min<int64_t>(dv.numel - op.len, op.dst_start + 2);
        a.start = pick(lo, hi);
        if (a.start == op.dst_start) {
          a.start = a.start > lo ? a.start - 1 : a.start + 1;
        }
      } else {
        // A source that does not overlap the destination's bytes.
        auto [db, de] = dst_bytes(p, op);
        bool found = false;
        for (int attempt = 0; attempt < 8 && !found; ++attempt) {
          int v = -1;
          if (coin(o.alias_rate)) {
            std::vector<int> pool = alias_float_views;
            if (coin(0.3)) {
              pool.insert(pool.end(), int_views.begin(), int_views.end());
            }
            v = random_view(pool, op.len);
          }
          if (v < 0) {
            v = random_view(float_views, op.len);
          }
          if (v < 0) {
            break;
          }
          const View& sv = p.views[v];
          int64_t start = pick(0, sv.numel - op.len);
          int64_t sb = sv.byte_offset + start * dtype_size(sv.dtype);
          int64_t se = sb + op.len * dtype_size(sv.dtype);
          if (sv.storage == dv.storage && sb < de && db < se) {
            continue;
          }
          a.view = v;
          a.start = start;
          found = true;
        }
        if (!found) {
          continue;
        }
      }
      op.operands.push_back(a);
    }
    op.bias = uni(-0.3, 0.3);
    op.nonlin = nonlins[pick(0, 3)];
    if (coin(o.rng_rate)) {
      double r = uni(0.0, 1.0);
      if (r < 0.4) {
        op.noise = 0.1;
      } else if (r < 0.8) {
        op.dropout = 0.25;
      } else {
        op.noise = 0.05;
        op.dropout = 0.2;
      }
    }
    p.ops.push_back(std::move(op));
  }
  if (o.ensure_overwrite) {
    // A canary float64 storage t of 6 input elements, and a last op
    //   t[1:5] = tanh(0.9 * t[0:4] + 0.1)
    // that overwrites its own operands: a replay that reads the final storage
    // instead of the versions gets a different gradient for t[1:4]. (It reads
    // nothing else, so that no saturated operand can hide the difference.)
    const int64_t n = 6;
    Storage s;
    s.nbytes = n * 8;
    s.initial.resize(s.nbytes);
    for (int64_t i = 0; i < n; ++i) {
      encode(s.initial.data() + i * 8, DType::kFloat64, normal(gi));
    }
    const int b = static_cast<int>(p.storages.size());
    p.storages.push_back(std::move(s));
    const int tv = static_cast<int>(p.views.size());
    p.views.push_back({b, DType::kFloat64, 0, n});
    p.primary.push_back(tv);
    p.input_storages.push_back(b);
    Op op;
    op.dst_view = tv;
    op.len = 4;
    op.dst_start = 1;
    op.operands.push_back({tv, 0, 0.9});
    op.bias = 0.1;
    op.nonlin = Nonlin::kTanh;
    p.ops.push_back(std::move(op));
  }
  for (size_t s = 0; s < p.storages.size(); ++s) {
    const View& v = p.views[p.primary[s]];
    if (v.dtype == DType::kInt32) {
      continue;
    }
    for (int64_t i = 0; i < v.numel; ++i) {
      p.loss.push_back(
          {p.primary[s], i, uni(0.5, 1.5) * (coin(0.5) ? 1.0 : -1.0)});
    }
  }
  return p;
}

}  // namespace torch_replay::contract
