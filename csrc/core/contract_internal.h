#pragma once

// Internal helpers shared by the replay-contract interpreter's files
// (contract_program, contract_bytes, contract_graph, contract_checks): element
// encoding, the op semantics of Note [Replay contract], and comparisons. Not a
// public header.

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/replay_contract.h"
#include "core/status.h"

namespace torch_replay::contract::detail {

[[noreturn]] inline void invalid(const std::string& msg) {
  throw ReplayException(ErrorKind::kInvalidArgument, msg);
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline double decode(const uint8_t* p, DType dtype) {
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

inline int32_t to_int32(double v) {
  if (!(v == v)) {
    return 0;
  }
  // Saturates to [0, 2^30]: reinterpreted as float32 such a value is finite
  // (a negative int32 would be a NaN pattern).
  constexpr double kLimit = 1073741824.0;
  return static_cast<int32_t>(std::nearbyint(std::clamp(v, 0.0, kLimit)));
}

// The value an element of `dtype` holds after storing v.
inline double store_value(DType dtype, double v) {
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

inline void encode(uint8_t* p, DType dtype, double v) {
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

inline double nonlin_derivative(Nonlin f, double z) {
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

inline const uint8_t* element_ptr(
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
inline OpValues execute_op(const Program& p, int k, ByteState& st) {
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

// [begin, end) bytes of storage p.views[o.view].storage that operand o of op
// reads.
inline std::pair<int64_t, int64_t> operand_bytes(
    const Program& p, const Op& op, const Operand& o) {
  const View& v = p.views[o.view];
  const int64_t s = dtype_size(v.dtype);
  const int64_t b = v.byte_offset + o.start * s;
  return {b, b + op.len * s};
}

// Calls f(k, op) for each operation k of `segment`, in program order,
// boundaries skipped.
template <typename F>
void for_each_segment_op(const Program& p, int segment, F&& f) {
  auto [first, last] = segment_ops(p, segment);
  for (int k = first; k < last; ++k) {
    if (p.ops[k].kind != OpKind::kBoundary) {
      f(k, p.ops[k]);
    }
  }
}

inline std::pair<int64_t, int64_t> dst_bytes(const Program& p, const Op& op) {
  const View& v = p.views[op.dst_view];
  int64_t s = dtype_size(v.dtype);
  int64_t b = v.byte_offset + op.dst_start * s;
  return {b, b + op.len * s};
}

inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

// |a - b| with NaN == NaN (same bits) and a NaN against a number = inf.
inline double diff(double a, double b) {
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

}  // namespace torch_replay::contract::detail
