#include "core/replay_contract.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/preservation_engine.h"
#include "core/status.h"

// See Note [Replay contract] in replay_contract.h.

namespace torch_replay::contract {

namespace {

[[noreturn]] void invalid(const std::string& msg) {
  throw ReplayException(ErrorKind::kInvalidArgument, msg);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double decode(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
  }
  return 0.0;
}

int32_t to_int32(double v) {
  if (!(v == v)) {
    return 0;
  }
  // Saturates to [0, 2^30]: reinterpreted as float32 such a value is finite
  // (a negative int32 would be a NaN pattern).
  constexpr double kLimit = 1073741824.0;
  return static_cast<int32_t>(std::nearbyint(std::clamp(v, 0.0, kLimit)));
}

// The value an element of `dtype` holds after storing v.
double store_value(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat64:
      return v;
    case DType::kFloat32:
      return static_cast<double>(static_cast<float>(v));
    case DType::kInt32:
      return static_cast<double>(to_int32(v));
  }
  return v;
}

void encode(uint8_t* p, DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat64:
      std::memcpy(p, &v, 8);
      return;
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::kInt32: {
      int32_t i = to_int32(v);
      std::memcpy(p, &i, 4);
      return;
    }
  }
}

template <typename T>
T apply_nonlin(Nonlin f, const T& z) {
  switch (f) {
    case Nonlin::kIdentity:
      return z;
    case Nonlin::kTanh:
      return std::tanh(z);
    case Nonlin::kSin:
      return std::sin(z);
    case Nonlin::kSigmoid:
      return 0.5 + 0.5 * std::tanh(0.5 * z);
  }
  return z;
}

double nonlin_derivative(Nonlin f, double z) {
  switch (f) {
    case Nonlin::kIdentity:
      return 1.0;
    case Nonlin::kTanh: {
      double t = std::tanh(z);
      return 1.0 - t * t;
    }
    case Nonlin::kSin:
      return std::cos(z);
    case Nonlin::kSigmoid: {
      double t = std::tanh(0.5 * z);
      return 0.25 * (1.0 - t * t);
    }
  }
  return 1.0;
}

// z = mask * (sum_j c_j x_j + bias) + noise_term, in one fixed order shared
// by the byte machine and the graph evaluator.
template <typename T>
T combine(
    const std::vector<double>& coefs,
    const T* xs,
    double bias,
    double mask,
    double noise_term) {
  T s = T(0.0);
  for (size_t j = 0; j < coefs.size(); ++j) {
    s = s + coefs[j] * xs[j];
  }
  s = s + bias;
  return mask * s + noise_term;
}

const uint8_t* element_ptr(
    const Program& p, const ByteState& st, int view, int64_t index) {
  const View& v = p.views[view];
  return st.bytes[v.storage].data() + v.byte_offset +
         index * dtype_size(v.dtype);
}

// Sampled per-element values of one executed op.
struct OpValues {
  std::vector<double> z, mask, noise_term, value;
};

// Executes op k on `st`: all reads, then the draws, then all writes.
OpValues execute_op(const Program& p, int k, ByteState& st) {
  const Op& op = p.ops[k];
  const int64_t n = op.len;
  OpValues out;
  out.z.resize(n);
  out.mask.assign(n, 1.0);
  out.noise_term.assign(n, 0.0);
  out.value.resize(n);
  std::vector<double> coefs;
  for (const Operand& o : op.operands) {
    coefs.push_back(o.coef);
  }
  std::vector<double> xs(n * op.operands.size());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < op.operands.size(); ++j) {
      const Operand& o = op.operands[j];
      xs[i * op.operands.size() + j] = decode(
          element_ptr(p, st, o.view, o.start + i), p.views[o.view].dtype);
    }
  }
  if (op.dropout > 0) {
    for (int64_t i = 0; i < n; ++i) {
      double r = rng_uniform(st.rng, i);
      out.mask[i] = r < op.dropout ? 0.0 : 1.0 / (1.0 - op.dropout);
    }
    st.rng.counter += n;
  }
  if (op.noise > 0) {
    for (int64_t i = 0; i < n; ++i) {
      out.noise_term[i] = op.noise * (2.0 * rng_uniform(st.rng, i) - 1.0);
    }
    st.rng.counter += n;
  }
  const View& dv = p.views[op.dst_view];
  for (int64_t i = 0; i < n; ++i) {
    out.z[i] = combine<double>(
        coefs,
        xs.data() + i * op.operands.size(),
        op.bias,
        out.mask[i],
        out.noise_term[i]);
    out.value[i] = store_value(dv.dtype, apply_nonlin(op.nonlin, out.z[i]));
  }
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* dst = st.bytes[dv.storage].data() + dv.byte_offset +
                   (op.dst_start + i) * dtype_size(dv.dtype);
    encode(dst, dv.dtype, out.value[i]);
  }
  return out;
}

std::pair<int64_t, int64_t> dst_bytes(const Program& p, const Op& op) {
  const View& v = p.views[op.dst_view];
  int64_t s = dtype_size(v.dtype);
  int64_t b = v.byte_offset + op.dst_start * s;
  return {b, b + op.len * s};
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

// |a - b| with NaN == NaN (same bits) and a NaN against a number = inf.
double diff(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::isnan(a) && std::isnan(b)
               ? 0.0
               : std::numeric_limits<double>::infinity();
  }
  if (a == b) {
    return 0.0;
  }
  return std::fabs(a - b);
}

}  // namespace

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

// ------------------------------------------------------------ byte machine

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
  auto [first, last] = segment_ops(p, segment);
  for (int k = first; k < last; ++k) {
    const Op& op = p.ops[k];
    if (op.kind == OpKind::kBoundary) {
      continue;
    }
    auto d = dst_bytes(p, op);
    fp.ranges[p.views[op.dst_view].storage].push_back(d);
    for (const Operand& o : op.operands) {
      const View& v = p.views[o.view];
      int64_t s = dtype_size(v.dtype);
      int64_t b = v.byte_offset + o.start * s;
      fp.ranges[v.storage].push_back({b, b + op.len * s});
    }
  }
  return fp;
}

Footprint exposed_reads(const Program& p, int segment) {
  Footprint fp;
  fp.ranges.resize(p.storages.size());
  std::vector<std::vector<bool>> written(p.storages.size());
  for (size_t s = 0; s < p.storages.size(); ++s) {
    written[s].assign(p.storages[s].nbytes, false);
  }
  auto [first, last] = segment_ops(p, segment);
  for (int k = first; k < last; ++k) {
    const Op& op = p.ops[k];
    if (op.kind == OpKind::kBoundary) {
      continue;
    }
    for (const Operand& o : op.operands) {
      const View& v = p.views[o.view];
      int64_t size = dtype_size(v.dtype);
      int64_t b = v.byte_offset + o.start * size;
      for (int64_t i = b; i < b + op.len * size; ++i) {
        if (!written[v.storage][i]) {
          fp.ranges[v.storage].push_back({i, i + 1});
        }
      }
    }
    auto [db, de] = dst_bytes(p, op);
    int s = p.views[op.dst_view].storage;
    std::fill(written[s].begin() + db, written[s].begin() + de, true);
  }
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

// ----------------------------------------------------------- version graph

Trace trace_program(const Program& p) {
  Trace tr;
  ByteState st = initial_state(p);
  // Per storage byte: the node whose element covers it.
  std::vector<std::vector<int>> owner(p.storages.size());
  std::vector<std::pair<int, int64_t>> where;  // node -> storage, byte offset
  for (size_t s = 0; s < p.storages.size(); ++s) {
    owner[s].assign(p.storages[s].nbytes, -1);
  }
  std::set<int> inputs(p.input_storages.begin(), p.input_storages.end());
  int segment = 0;
  auto new_node = [&](Node n, int storage, int64_t byte) {
    n.segment = segment;
    tr.nodes.push_back(std::move(n));
    where.push_back({storage, byte});
    return static_cast<int>(tr.nodes.size()) - 1;
  };
  for (size_t s = 0; s < p.storages.size(); ++s) {
    const View& v = p.views[p.primary[s]];
    int64_t size = dtype_size(v.dtype);
    for (int64_t i = 0; i < v.numel; ++i) {
      Node n;
      n.dtype = v.dtype;
      n.value = read_value(p, st, p.primary[s], i);
      if (inputs.count(static_cast<int>(s)) && v.dtype != DType::kInt32) {
        if (tr.num_inputs >= kMaxInputs) {
          throw ReplayException(
              ErrorKind::kInvalidArgument,
              "trace_program: more than kMaxInputs input elements");
        }
        n.input = tr.num_inputs++;
        n.dep.set(n.input);
        tr.inputs.push_back({p.primary[s], i});
        tr.input_values.push_back(n.value);
      }
      int id = new_node(std::move(n), static_cast<int>(s), i * size);
      std::fill(
          owner[s].begin() + i * size, owner[s].begin() + (i + 1) * size, id);
    }
  }
  // The version id an element read resolves to (a new constant node when the
  // bytes were written through another dtype or element boundary).
  auto resolve = [&](int view, int64_t index) {
    const View& v = p.views[view];
    int64_t size = dtype_size(v.dtype);
    int64_t b = v.byte_offset + index * size;
    const std::vector<int>& own = owner[v.storage];
    int id = own[b];
    bool whole =
        id >= 0 && where[id].second == b && tr.nodes[id].dtype == v.dtype;
    for (int64_t i = 1; whole && i < size; ++i) {
      whole = own[b + i] == id;
    }
    if (whole) {
      return id;
    }
    Node n;
    n.dtype = v.dtype;
    n.value = read_value(p, st, view, index);
    for (int64_t i = 0; i < size; ++i) {
      int o = own[b + i];
      if (o >= 0) {
        n.udep |= tr.nodes[o].dep | tr.nodes[o].udep;
      }
    }
    return new_node(std::move(n), -1, -1);
  };
  tr.segment_nodes.push_back(0);
  for (int k = 0; k < static_cast<int>(p.ops.size()); ++k) {
    const Op& op = p.ops[k];
    if (op.kind == OpKind::kBoundary) {
      ++segment;
      tr.segment_nodes.push_back(static_cast<int>(tr.nodes.size()));
      tr.op_first_node.push_back(-1);
      continue;
    }
    // All reads before the write: versions valid before this op.
    std::vector<std::vector<int>> parents(op.len);
    for (int64_t i = 0; i < op.len; ++i) {
      for (const Operand& o : op.operands) {
        parents[i].push_back(resolve(o.view, o.start + i));
      }
    }
    OpValues vals = execute_op(p, k, st);
    const View& dv = p.views[op.dst_view];
    int64_t size = dtype_size(dv.dtype);
    tr.op_first_node.push_back(static_cast<int>(tr.nodes.size()));
    std::vector<int> ids;
    for (int64_t i = 0; i < op.len; ++i) {
      Node n;
      n.op = k;
      n.dtype = dv.dtype;
      n.nonlin = op.nonlin;
      n.integer = dv.dtype == DType::kInt32;
      n.bias = op.bias;
      n.noise_term = vals.noise_term[i];
      n.mask = vals.mask[i];
      n.z = vals.z[i];
      n.value = vals.value[i];
      for (size_t j = 0; j < op.operands.size(); ++j) {
        int par = parents[i][j];
        n.parents.push_back({par, op.operands[j].coef});
        n.dep |= tr.nodes[par].dep;
        n.udep |= tr.nodes[par].udep;
      }
      if (n.integer) {
        n.udep |= n.dep;
        n.dep.reset();
      }
      int64_t byte = dv.byte_offset + (op.dst_start + i) * size;
      ids.push_back(new_node(std::move(n), dv.storage, byte));
    }
    for (int64_t i = 0; i < op.len; ++i) {
      auto [s, b] = where[ids[i]];
      std::fill(owner[s].begin() + b, owner[s].begin() + b + size, ids[i]);
    }
  }
  InputSet unsupported;
  for (const LossTerm& t : p.loss) {
    int id = resolve(t.view, t.index);
    tr.loss.push_back({id, t.weight});
    unsupported |= tr.nodes[id].udep;
  }
  tr.segment_nodes.push_back(static_cast<int>(tr.nodes.size()));
  for (int j = 0; j < tr.num_inputs; ++j) {
    tr.unsupported.push_back(unsupported.test(j));
  }
  tr.final_state = st;
  tr.loss_value = loss_from_bytes(p, st);
  return tr;
}

NodeValues recorded_values(const Trace& tr) {
  NodeValues v;
  for (const Node& n : tr.nodes) {
    v.z.push_back(n.z);
    v.mask.push_back(n.mask);
    v.noise_term.push_back(n.noise_term);
    v.value.push_back(n.value);
  }
  return v;
}

void replay_segment_values(
    const Program& p,
    const Trace& tr,
    int segment,
    ByteState& st,
    NodeValues& out) {
  auto [first, last] = segment_ops(p, segment);
  for (int k = first; k < last; ++k) {
    if (p.ops[k].kind == OpKind::kBoundary) {
      continue;
    }
    OpValues vals = execute_op(p, k, st);
    int base = tr.op_first_node[k];
    for (int64_t i = 0; i < p.ops[k].len; ++i) {
      out.z[base + i] = vals.z[i];
      out.mask[base + i] = vals.mask[i];
      out.noise_term[base + i] = vals.noise_term[i];
      out.value[base + i] = vals.value[i];
    }
  }
}

namespace {

double real_part(double x) {
  return x;
}
double real_part(const std::complex<double>& x) {
  return x.real();
}

template <typename T>
T store_like(DType dtype, const T& v);

template <>
double store_like<double>(DType dtype, const double& v) {
  return store_value(dtype, v);
}

template <>
std::complex<double> store_like<std::complex<double>>(
    DType dtype, const std::complex<double>& v) {
  // Rounding keeps the derivative 1 (the AD convention); an int32 write is
  // not differentiable.
  if (dtype == DType::kInt32) {
    return {store_value(dtype, v.real()), 0.0};
  }
  return {store_value(dtype, v.real()), v.imag()};
}

}  // namespace

template <typename T>
T evaluate_graph(const Trace& tr, const std::vector<T>& inputs) {
  std::vector<T> vals(tr.nodes.size());
  std::vector<double> coefs;
  std::vector<T> xs;
  for (size_t k = 0; k < tr.nodes.size(); ++k) {
    const Node& n = tr.nodes[k];
    if (n.op < 0) {
      vals[k] = n.input >= 0 ? inputs[n.input] : T(n.value);
      continue;
    }
    coefs.clear();
    xs.clear();
    for (auto [par, c] : n.parents) {
      coefs.push_back(c);
      xs.push_back(vals[par]);
    }
    T z = combine<T>(coefs, xs.data(), n.bias, n.mask, n.noise_term);
    vals[k] = store_like<T>(n.dtype, apply_nonlin(n.nonlin, z));
  }
  T loss = T(0.0);
  for (auto [id, w] : tr.loss) {
    loss = loss + w * vals[id];
  }
  (void)real_part(loss);
  return loss;
}

template double evaluate_graph<double>(
    const Trace&, const std::vector<double>&);
template std::complex<double> evaluate_graph<std::complex<double>>(
    const Trace&, const std::vector<std::complex<double>>&);

namespace {

std::vector<double> reverse_with(
    const Trace& tr, const std::vector<double>& zs, const NodeValues* v) {
  std::vector<double> vbar(tr.nodes.size(), 0.0), grad(tr.num_inputs, 0.0);
  for (auto [id, w] : tr.loss) {
    vbar[id] += w;
  }
  for (int k = static_cast<int>(tr.nodes.size()) - 1; k >= 0; --k) {
    const Node& n = tr.nodes[k];
    if (vbar[k] == 0.0) {
      continue;
    }
    if (n.op < 0) {
      if (n.input >= 0) {
        grad[n.input] += vbar[k];
      }
      continue;
    }
    if (n.integer) {
      continue;
    }
    double mask = v ? v->mask[k] : n.mask;
    double d = vbar[k] * nonlin_derivative(n.nonlin, zs[k]) * mask;
    for (auto [par, c] : n.parents) {
      vbar[par] += d * c;
    }
  }
  return grad;
}

}  // namespace

std::vector<double> reverse_gradient(const Trace& tr, const NodeValues& v) {
  return reverse_with(tr, v.z, &v);
}

std::vector<double> reverse_gradient_final_storage(
    const Program& p, const Trace& tr) {
  std::vector<double> zs(tr.nodes.size(), 0.0);
  std::vector<double> coefs, xs;
  for (size_t k = 0; k < tr.nodes.size(); ++k) {
    const Node& n = tr.nodes[k];
    if (n.op < 0) {
      continue;
    }
    const Op& op = p.ops[n.op];
    int64_t i = static_cast<int64_t>(k) - tr.op_first_node[n.op];
    coefs.clear();
    xs.clear();
    for (const Operand& o : op.operands) {
      coefs.push_back(o.coef);
      xs.push_back(read_value(p, tr.final_state, o.view, o.start + i));
    }
    zs[k] = combine<double>(coefs, xs.data(), n.bias, n.mask, n.noise_term);
  }
  return reverse_with(tr, zs, nullptr);
}

std::vector<double> forward_jacobian(const Trace& tr) {
  const int m = tr.num_inputs;
  std::vector<double> tangent(tr.nodes.size() * m, 0.0);
  for (size_t k = 0; k < tr.nodes.size(); ++k) {
    const Node& n = tr.nodes[k];
    double* t = tangent.data() + k * m;
    if (n.op < 0) {
      if (n.input >= 0) {
        t[n.input] = 1.0;
      }
      continue;
    }
    if (n.integer) {
      continue;
    }
    double d = nonlin_derivative(n.nonlin, n.z) * n.mask;
    for (auto [par, c] : n.parents) {
      const double* tp = tangent.data() + par * m;
      for (int j = 0; j < m; ++j) {
        t[j] += c * tp[j];
      }
    }
    for (int j = 0; j < m; ++j) {
      t[j] *= d;
    }
  }
  std::vector<double> jac(m, 0.0);
  for (auto [id, w] : tr.loss) {
    for (int j = 0; j < m; ++j) {
      jac[j] += w * tangent[id * m + j];
    }
  }
  return jac;
}

std::vector<double> complex_step_gradient(const Trace& tr, double h) {
  std::vector<double> grad(tr.num_inputs, 0.0);
  std::vector<std::complex<double>> x(tr.num_inputs);
  for (int j = 0; j < tr.num_inputs; ++j) {
    x[j] = tr.input_values[j];
  }
  for (int j = 0; j < tr.num_inputs; ++j) {
    x[j] = {tr.input_values[j], h};
    grad[j] = evaluate_graph<std::complex<double>>(tr, x).imag() / h;
    x[j] = tr.input_values[j];
  }
  return grad;
}

// ------------------------------------------------------------------ checks

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
  for (int j = 0; j < tr.num_inputs; ++j) {
    if (tr.unsupported[j]) {
      ++r.unsupported;
      continue;
    }
    ++r.coordinates;
    r.max_grad_mismatch = std::max(r.max_grad_mismatch, diff(rev[j], jac[j]));
    r.control_mismatch = std::max(r.control_mismatch, diff(ctrl[j], jac[j]));
    ctrl_vs_rev = std::max(ctrl_vs_rev, diff(ctrl[j], rev[j]));
  }
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
  auto [first, last] = segment_ops(p, segment);
  for (int k = first; k < last; ++k) {
    const Op& op = p.ops[k];
    if (op.kind == OpKind::kBoundary) {
      continue;
    }
    for (const Operand& o : op.operands) {
      const View& v = p.views[o.view];
      const int64_t size = dtype_size(v.dtype);
      const int64_t b = v.byte_offset + o.start * size;
      const StorageKey key = key_of(v.storage);
      engine.access(
          key, resolve(key), range_of(b, b + op.len * size), Access::kRead);
    }
    auto [db, de] = dst_bytes(p, op);
    const StorageKey key = key_of(p.views[op.dst_view].storage);
    const RangeSet dst = range_of(db, de);
    engine.access(key, resolve(key), dst, Access::kWrite);
    journal.record_if_watched(key, resolve(key), dst);
    execute_op(p, k, st);
  }
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
  for (int j = 0; j < tr.num_inputs; ++j) {
    if (tr.unsupported[j]) {
      ++r.unsupported;
      continue;
    }
    ++r.coordinates;
    r.max_mismatch = std::max(r.max_mismatch, diff(cs[j], rev[j]));
  }
  return r;
}

}  // namespace torch_replay::contract
