"""The cohort's JAX family: the same programs under jax.checkpoint (optional; JAX may
be absent)."""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from .cohort_program import CohortModule, CohortSpec, _cohort_inputs, _condition

# ------------------------------------------------------------ cohort, JAX family

JAX_METHODS = (
    "jax-eager",
    "jax-torch-draws",
    "jax-checkpoint",
    "jax-checkpoint-dots",
    "jax-checkpoint-jit",
    "jax-inplace",
    "jax-numpy-checkpoint",
    "jax-holder-eager",
    "jax-holder-checkpoint",
)
"""One execution each per cohort program (see :func:`_run_jax`): ``jax-eager`` is the
reference; ``jax-torch-draws`` checks the lowering against torch eager; the three
``jax-checkpoint*`` are the functional conditions; ``jax-inplace`` and
``jax-numpy-checkpoint`` are in-place executions, ``jax-holder-*`` an impure holder."""
JAX_FUNCTIONAL = ("jax-checkpoint", "jax-checkpoint-dots", "jax-checkpoint-jit")
JAX_TOLERANCE = 1e-12
"""Relative tolerance of the two comparisons that cannot be bitwise: ``jax-torch-draws``
(XLA's and torch's float64 ``tanh``/``sin``/``sigmoid`` are different implementations) and
``jax-checkpoint-jit`` (XLA fuses the compiled program differently from op-by-op eager, and
differently with and without rematerialization: a few ulps). Every other JAX comparison is
bitwise."""


def _jax_condition(spec: CohortSpec, method: str) -> str:
    if method in ("jax-inplace", "jax-numpy-checkpoint"):
        return "in-place"
    if method.startswith("jax-holder"):
        return "impure holder"
    return _condition(spec, True)


def _jax_rejection(exc: Exception) -> bool:
    """True if ``exc`` is JAX refusing the program (not a bug of this suite): a JAX tracer
    error (leaked tracer, array conversion, concretization) or the immutable-array TypeError."""
    import jax

    if isinstance(exc, jax.errors.JAXTypeError):
        return True
    return isinstance(exc, TypeError) and "immutable" in str(exc)


def _jax_constants(spec: CohortSpec) -> dict[str, Any]:
    """The torch program's initial values (parameter, input, buffers, linspace constants) as
    NumPy arrays, so both frameworks start from the same bytes."""
    module = CohortModule(spec)
    d, dt = spec.d, torch.float64
    return {
        "w": module.w.detach().numpy().copy(),
        "x": _cohort_inputs(spec).detach().numpy().copy(),
        "state": {k: b.numpy().copy() for k, b in module.named_buffers()},
        "local_state": torch.linspace(-1.0, 1.0, d + 2, dtype=dt).numpy(),
        "local_q": torch.linspace(0.5, -0.5, d, dtype=dt).numpy(),
        "loss_w": torch.linspace(0.5, 1.5, d, dtype=dt).numpy(),
    }


def _torch_draws(spec: CohortSpec) -> tuple[Any, Any]:
    """The noise and the dropout scale torch eager draws in segment A: the first draws of the
    explicit generator and of the default generator seeded as in :func:`_run_cohort`."""
    d = spec.d
    noise = None
    if spec.explicit_noise:
        g = torch.Generator().manual_seed(spec.seed + 1)
        noise = torch.rand(d, generator=g, dtype=torch.float64).numpy()
    torch.manual_seed(spec.seed + 3)
    mask = F.dropout(torch.ones(d, dtype=torch.float64), spec.dropout, training=True)
    return noise, mask.numpy()


def _jax_segments(spec: CohortSpec, c: dict[str, Any], write: str = "functional", buf0=None):
    """The program lowered to JAX: ``segment_a(w, x, state, keys, draws) -> (y, stats, keys)``
    and ``segment_b(y, state) -> (z, state)``, the same math as :class:`CohortModule`.

    ``write="functional"`` writes with ``x.at[i].set(v)`` (a new array); ``"inplace"`` writes
    ``buf[i] = v`` like the torch code, on a JAX array (``buf0=None``) or on the NumPy buffer
    ``buf0``. Random draws come from explicit keys ``(default, noise)``, split once per draw
    like the torch program's two generators, unless ``draws = (noise, mask)`` is given.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    d = spec.d
    fs = {"tanh": jnp.tanh, "sin": jnp.sin, "sigmoid": jax.nn.sigmoid}

    def put(arr, idx, val):
        if write == "functional":
            return arr.at[idx].set(val)
        arr[idx] = val  # JAX arrays refuse; NumPy refuses a tracer
        return arr

    def segment_a(w, x, state, keys, draws):
        h = w @ x
        buf = put(jnp.zeros(d + 2, h.dtype) if buf0 is None else buf0, slice(0, d), h)
        if spec.kind == "hidden":
            st, stats, q = state["hidden"], state["stats"], state["queue"][0]
        else:
            st, stats = jnp.asarray(c["local_state"]), jnp.zeros(d + 2, jnp.float32)
            q = jnp.asarray(c["local_q"])
        for op in spec.ops:
            if op[0] == "mix":
                _, a, b, n, f, c1, c2, bias = op
                buf = put(
                    buf, slice(b, b + n), fs[f](c1 * buf[a : a + n] + c2 * st[a : a + n] + bias)
                )
            elif op[0] == "alias32":
                _, a, n = op
                val = lax.stop_gradient(buf[a : a + n]).astype(jnp.float32)
                stats = put(stats, slice(a, a + n), val)
                counter = lax.bitcast_convert_type(stats, jnp.int32)  # typed alias
                stats = lax.bitcast_convert_type(counter.at[d + 1].add(1), jnp.float32)
            else:  # "rawcopy": the functional copy reads the source before writing
                buf = put(buf, slice(1, 1 + op[1]), buf[0 : op[1]])
        y = buf[:d] + q * 0.5
        kd, kn = keys
        if draws is None:
            noise = None
            if spec.explicit_noise:
                kn, sub = jax.random.split(kn)
                noise = jax.random.uniform(sub, (d,), jnp.float64)
            kd, sub = jax.random.split(kd)
            keep = jax.random.bernoulli(sub, 1 - spec.dropout, (d,))
            mask = keep.astype(jnp.float64) / (1 - spec.dropout)
        else:
            noise, mask = draws
        if spec.explicit_noise:
            y = y + spec.explicit_noise * noise
        return jnp.tanh(y) * mask, stats, (kd, kn)

    def segment_b(y, state):
        if spec.kind == "hidden":
            m, yd = spec.momentum, lax.stop_gradient(y)
            hidden = state["hidden"].at[:d].set(state["hidden"][:d] * m + (1 - m) * yd)
            counter = lax.bitcast_convert_type(state["stats"], jnp.int32).at[0].add(1)
            state = {
                "hidden": hidden,
                "stats": lax.bitcast_convert_type(counter, jnp.float32),
                "queue": state["queue"].at[state["ptr"] % 3].set(yd),
                "ptr": state["ptr"] + 1,
            }
        return jnp.sin(y) * 0.5, state

    return segment_a, segment_b


def _run_jax(spec: CohortSpec, method: str, c: dict[str, Any]) -> dict[str, Any]:
    """One JAX execution of ``spec``: forward through both segments, value and gradient
    w.r.t. ``(x, w)``, then one more draw from each key (the world moves on, as in torch).
    Raises whatever JAX raises."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    d = spec.d
    keys0 = (jax.random.PRNGKey(spec.seed + 3), jax.random.PRNGKey(spec.seed + 1))
    state0 = {k: jnp.asarray(v) for k, v in c["state"].items()}
    loss_w = jnp.asarray(c["loss_w"])
    w, x = jnp.asarray(c["w"]), jnp.asarray(c["x"])
    policy = {
        "jax-checkpoint-dots": jax.checkpoint_policies.dots_saveable,
    }.get(method)
    wrap = (lambda f: jax.checkpoint(f, policy=policy)) if "checkpoint" in method else None
    draws = None
    if method == "jax-torch-draws":
        draws = tuple(None if v is None else jnp.asarray(v) for v in _torch_draws(spec))
    if method.startswith("jax-holder"):
        seg_a, seg_b = _jax_segments(spec, c)
        holder = types.SimpleNamespace(state=dict(state0), keys=keys0)  # impure holder

        def a_impure(w, x):
            y, stats, holder.keys = seg_a(w, x, holder.state, holder.keys, None)
            if spec.kind == "hidden":
                holder.state["stats"] = stats
            return y

        def b_impure(y):
            z, holder.state = seg_b(y, holder.state)
            return z

        if wrap:
            a_impure, b_impure = wrap(a_impure), wrap(b_impure)

        def loss_fn(x, w):
            y = a_impure(w, x)
            return (y * loss_w).sum() + b_impure(y).sum(), None

    else:
        if method in ("jax-inplace", "jax-numpy-checkpoint"):
            buf0 = np.zeros(d + 2) if method == "jax-numpy-checkpoint" else None
            seg_a, seg_b = _jax_segments(spec, c, write="inplace", buf0=buf0)
        else:
            seg_a, seg_b = _jax_segments(spec, c)
        if wrap:
            seg_a, seg_b = wrap(seg_a), wrap(seg_b)

        def loss_fn(x, w):
            y, stats, keys = seg_a(w, x, state0, keys0, draws)
            state = {**state0, "stats": stats} if spec.kind == "hidden" else state0
            z, state = seg_b(y, state)
            return (y * loss_w).sum() + z.sum(), (state, keys)

    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    if method == "jax-checkpoint-jit":
        grad_fn = jax.jit(grad_fn)
    (loss, aux), grads = grad_fn(x, w)
    if method.startswith("jax-holder"):
        state, keys = holder.state, holder.keys
    else:
        state, keys = aux
    keys = tuple(jax.random.split(k)[0] for k in keys)  # later draws move the keys
    return {
        "loss": np.asarray(loss),
        "grads": [np.asarray(g) for g in grads],
        "state": {k: np.asarray(v) for k, v in state.items()},
        "rng": [np.asarray(k) for k in keys],
    }


def _torch_as_jax(ref: dict[str, Any]) -> dict[str, Any]:
    """Torch eager's result in :func:`_run_jax`'s format (generator states left out: torch
    generators and threefry keys are not comparable)."""
    import numpy as np

    dtypes = {"hidden": np.float64, "stats": np.float32, "queue": np.float64, "ptr": np.int64}
    state = {
        k: np.frombuffer(b, dt).copy()
        for (k, dt), b in zip(dtypes.items(), ref["state"], strict=True)
    }
    return {
        "loss": ref["loss"].numpy(),
        "grads": [g.numpy() for g in ref["grads"]],
        "state": state,
        "rng": None,
    }


def _jax_compare(
    spec: CohortSpec, ref: dict[str, Any], got: dict[str, Any], tol: float | None
) -> dict[str, Any]:
    """Outcome of one execution against a reference in :func:`_run_jax`'s format.

    ``tol=None``: bitwise (loss, gradients, every state array, both keys). Otherwise loss,
    gradients and float64 state within ``tol`` relative (``|a - b| <= tol * max(1, |b|)``),
    the float32 statistics within one ulp except the int32 counters (exact), the pointer and
    the keys exact. ``grad_diff`` is the largest relative gradient difference."""
    import numpy as np

    def rel(a, b) -> float:
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        return float((abs(a - b) / np.maximum(1.0, abs(b))).max())

    def same(a, b) -> bool:
        return np.asarray(a).tobytes() == np.asarray(b).tobytes()

    pairs = list(zip(ref["grads"], got["grads"], strict=True))
    diff = max(rel(g, r) for r, g in pairs)
    rs, gs = ref["state"], got["state"]
    bitwise = (
        same(ref["loss"], got["loss"])
        and all(same(r, g) for r, g in pairs)
        and all(same(rs[k].ravel(), gs[k].ravel()) for k in rs)
    )
    keys_ok = ref["rng"] is None or all(
        same(r, g) for r, g in zip(ref["rng"], got["rng"], strict=True)
    )
    if tol is None:
        ok = bitwise
    else:
        d = spec.d
        ri = rs["stats"].view(np.int32).astype(np.int64)
        gi = gs["stats"].view(np.int32).astype(np.int64)
        ok = (
            rel(got["loss"], ref["loss"]) <= tol
            and diff <= tol
            and all(rel(gs[k], rs[k]) <= tol for k in ("hidden", "queue"))
            and abs(ri[:d] - gi[:d]).max() <= 1
            and same(ri[d:], gi[d:])
            and same(rs["ptr"].ravel(), gs["ptr"].ravel())
        )
    return {
        "outcome": "matched" if ok and keys_ok else "wrong",
        "grad_diff": diff,
        "bitwise": bool(bitwise and keys_ok),
    }


def _cohort_jax(spec: CohortSpec, torch_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every JAX execution of one program (float64). ``torch_ref`` is torch eager's result
    (for overlapping-copy programs, which torch rejects, the program with the copy made
    through a temporary)."""
    c = _jax_constants(spec)
    records = []
    ref = _run_jax(spec, "jax-eager", c)
    for method in JAX_METHODS:
        rec: dict[str, Any] = {
            "family": "jax",
            "seed": spec.seed,
            "kind": spec.kind,
            "method": method,
            "condition": _jax_condition(spec, method),
        }
        if method == "jax-eager":
            rec.update(outcome="reference", grad_diff=0.0)
            records.append(rec)
            continue
        rec["reference"] = "torch-eager" if method == "jax-torch-draws" else "jax-eager"
        if method == "jax-torch-draws" and spec.kind == "overlap":
            rec["reference"] = "torch-eager, overlapping copy through a temporary"
        try:
            got = _run_jax(spec, method, c)
        except Exception as exc:
            if not _jax_rejection(exc):
                raise  # a bug of this suite, not a finding
            rec["outcome"] = "rejected"
            rec["error"] = type(exc).__name__
            rec["message"] = str(exc).splitlines()[0][:200]
        else:
            if method == "jax-torch-draws":
                rec.update(_jax_compare(spec, _torch_as_jax(torch_ref), got, JAX_TOLERANCE))
            else:
                tol = JAX_TOLERANCE if method == "jax-checkpoint-jit" else None
                rec.update(_jax_compare(spec, ref, got, tol))
        records.append(rec)
    return records
