// The replay-contract interpreter, part 3: the version graph (trace,
// evaluation, reverse and forward mode, complex step). See Note [Replay
// contract] in replay_contract.h.

#include <set>

#include "core/contract_internal.h"

namespace torch_replay::contract {

using namespace detail;  // NOLINT(google-build-using-namespace)

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
  for_each_segment_op(p, segment, [&](int k, const Op& op) {
    OpValues vals = execute_op(p, k, st);
    int base = tr.op_first_node[k];
    for (int64_t i = 0; i < op.len; ++i) {
      out.z[base + i] = vals.z[i];
      out.mask[base + i] = vals.mask[i];
      out.noise_term[base + i] = vals.noise_term[i];
      out.value[base + i] = vals.value[i];
    }
  });
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

}  // namespace torch_replay::contract
