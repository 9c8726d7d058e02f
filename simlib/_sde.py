"""``solve(..., diffusion=g, key=key, noise=...)``: SDEs on the fixed-step driver.

The SDE ``dy = f(t, y, args) dt + g(t, y, args) dW`` runs through the same jitted
fixed-step core as an ODE (``_fixed.py``: ``SaveAt``, ``throw``, ``vmap``, the adjoints):
the driver's vector field is :class:`_SDEField`, returning the pair ``(f, g)``, and its
``args`` are :class:`_SDEArgs`, carrying the user's ``args``, the :class:`BrownianPath`
built from ``key`` and the noise type. The stochastic method (``_solver/_sde.py``) takes
the increments from the path. See docs/sde.md and docs/design.md.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._adjoint import AbstractAdjoint, Reversible
from ._auto import AUTOMATIC
from ._brownian import BrownianPath, BrownianSteps, VirtualBrownianPath, levels_for
from ._control import PIDController
from ._fixed import fixed_iterations, grid_count
from ._fixed import fixed_jit as _fixed_jit
from ._solution import SaveAt, Solution
from ._solver._base import AbstractSolver
from ._solver._sde import NOISE_TYPES, AbstractSDESolver
from ._util import inside_trace, is_tracer, time_dtype
from ._validate import (
    Checks,
    check_args,
    check_resolution,
    check_save_times,
    check_state,
    check_times,
)

__all__ = ["solve_sde"]


class _SDEField:
    """The driver's vector field for an SDE: ``(t, y, a) -> (f(t, y, a.args), g(t, y,
    a.args))``, each cast to the state's dtypes. Hashes by ``(f, g)`` so jit caches hit."""

    def __init__(self, f, g):
        self.f, self.g = f, g

    def __call__(self, t, y, a):
        drift = jax.tree_util.tree_map(lambda o, x: o.astype(x.dtype), self.f(t, y, a.args), y)
        diff = jax.tree_util.tree_map(lambda o, x: o.astype(x.dtype), self.g(t, y, a.args), y)
        return drift, diff

    def __hash__(self) -> int:
        return hash((_SDEField, self.f, self.g))

    def __eq__(self, other) -> bool:
        return isinstance(other, _SDEField) and (other.f, other.g) == (self.f, self.g)


class _SDEArgs:
    """The driver's ``args`` for an SDE: the user's ``args``, the path, the noise type."""

    def __init__(self, args, path, noise):
        self.args, self.path, self.noise = args, path, noise


jax.tree_util.register_pytree_node(
    _SDEArgs, lambda a: ((a.args, a.path), a.noise),
    lambda noise, leaves: _SDEArgs(leaves[0], leaves[1], noise))


def _noise_shape(noise, f, g, y0, args, tdtype) -> tuple[int, ...]:
    """Check ``f`` and ``g`` against ``y0`` and return the Brownian path's flat shape."""
    from ._solve import _describe

    t = jax.ShapeDtypeStruct((), tdtype)
    for name, fn in (("f", f), ("diffusion", g)):
        try:
            out = jax.eval_shape(fn, t, y0, args)
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise TypeError(f"calling {name}(t0, y0, args) failed: {err}") from err
        if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(y0):
            raise ValueError(f"{name} must return the same pytree structure as y0: y0 is "
                             f"{jax.tree_util.tree_structure(y0)}, {name} returned "
                             f"{jax.tree_util.tree_structure(out)}")
        ys, outs = jax.tree_util.tree_leaves(y0), jax.tree_util.tree_leaves(out)
        if name == "f" or noise in ("diagonal", "scalar"):
            if any(a.shape != b.shape for a, b in zip(ys, outs, strict=True)):
                what = "like y0" if name == "f" else f"like y0 for noise={noise!r}"
                raise ValueError(f"{name} must return arrays shaped {what}: y0 is "
                                 f"{_describe(y0)}, {name} returned {_describe(out)}")
        else:
            ms = {b.shape[-1] if b.ndim == a.ndim + 1 and b.shape[:-1] == a.shape else None
                  for a, b in zip(ys, outs, strict=True)}
            if None in ms or len(ms) != 1:
                raise ValueError(
                    "diffusion must return, for noise='general', each leaf shaped like y0's "
                    f"leaf followed by (m,) with the same m: y0 is {_describe(y0)}, diffusion "
                    f"returned {_describe(out)}")
            return (ms.pop(),)
    if noise == "scalar":
        return ()
    return (sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(y0)),)


BROWNIAN = ("tree", "steps")


def _diffusion_depends_on_state(g, y0, args, tdtype) -> bool | None:
    """Whether ``g(t, y, args)`` reads ``y``: a dependency walk over the jaxpr of ``g`` in
    ``y`` (structural, so ``0 * y`` counts as reading it). ``None`` if ``g`` cannot be traced
    on its own (e.g. ``args`` holds objects that are not arrays)."""
    def spec(x):
        return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))

    try:
        closed = jax.make_jaxpr(lambda t, y, a: g(t, y, a))(
            jax.ShapeDtypeStruct((), tdtype), jax.tree_util.tree_map(spec, y0),
            jax.tree_util.tree_map(spec, args))
    except Exception:  # noqa: BLE001 - no verdict, no check
        return None
    jaxpr = closed.jaxpr
    n_y = len(jax.tree_util.tree_leaves(y0))
    reads = set(jaxpr.invars[1:1 + n_y])
    for eqn in jaxpr.eqns:  # in order; sub-jaxprs (cond, pjit, ...) conservatively
        if any(v in reads for v in eqn.invars if not hasattr(v, "val")):
            reads.update(eqn.outvars)
    return any(v in reads for v in jaxpr.outvars if not hasattr(v, "val"))


def solve_sde(f, y0, t0, t1, *, solver: AbstractSolver, diffusion, key, noise, brownian, dt,
              rtol, atol,
              args: Any, saveat: SaveAt, max_steps: int, throw: bool,
              adjoint: AbstractAdjoint | None, events, progress: bool = False,
              controller: PIDController | None = None) -> Solution:
    """The SDE branch of :func:`simlib.solve` (arguments as there); checks its arguments
    eagerly, naming the bad one."""
    from ._solve import _as_array_tree, _bar, _check_scalar, _raise_if_failed, _tolerances

    if key is None:
        raise ValueError("key is required for an SDE (diffusion=...): give a JAX key, e.g. "
                         "key=jax.random.key(0); one key gives one Brownian path")
    if diffusion is None:
        raise ValueError(f"{type(solver).__name__} is an SDE method: give diffusion=g, "
                         "g(t, y, args) the noise coefficient")
    if not callable(diffusion):
        raise TypeError(f"diffusion must be callable as g(t, y, args), got {diffusion!r}")
    if not isinstance(solver, AbstractSDESolver):
        raise ValueError(
            f"diffusion was given, but solver {type(solver).__name__}() is an ODE method; use "
            "an SDE method: EulerMaruyama(), Milstein(), StochasticHeun() or SRA1()")
    noise = "diagonal" if noise is None else noise
    brownian = "tree" if brownian is None else brownian
    if not isinstance(brownian, str) or brownian not in BROWNIAN:
        raise ValueError(f"brownian must be one of {', '.join(map(repr, BROWNIAN))}, "
                         f"got {brownian!r}")
    if noise not in NOISE_TYPES:
        raise ValueError(f"noise must be one of {', '.join(map(repr, NOISE_TYPES))}, "
                         f"got {noise!r}")
    if noise not in solver.noise_types:
        raise ValueError(f"noise={noise!r} is not supported by {type(solver).__name__}() "
                         f"(it takes {', '.join(map(repr, solver.noise_types))}); "
                         "EulerMaruyama() and StochasticHeun() take every noise type")
    checks = Checks("solve")
    adaptive = rtol is not None or atol is not None
    if adaptive:
        if not solver.adaptive:
            raise ValueError(
                f"rtol/atol were given, but {type(solver).__name__}() has no error estimate; "
                "StochasticHeun() is the adaptive SDE method (Stratonovich), or give dt "
                "without tolerances for a fixed step")
        if brownian == "steps":
            raise ValueError(
                "brownian='steps' cannot drive an adaptive solve (a rejected step would "
                "redraw its increment from the same normal, biasing the path); use the "
                "default brownian='tree' with rtol/atol")
        rtol, atol = _tolerances(rtol, atol, checks)
    elif dt is None:
        raise ValueError(f"{type(solver).__name__} needs a step size: give dt")
    if events is not None:
        raise ValueError("events are not supported for SDEs")
    if adjoint is not None and not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(f"adjoint must be a simlib adjoint, got {adjoint!r}")
    if isinstance(adjoint, Reversible):
        raise ValueError("adjoint=Reversible() is not supported for SDEs; use Direct(), "
                         "Checkpointed() or ForwardMode()")
    if not isinstance(saveat, SaveAt):
        raise TypeError(f"saveat must be a simlib.SaveAt, got {saveat!r}")
    if not isinstance(max_steps, int | np.integer) or max_steps <= 0:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    max_steps = int(max_steps)
    mode = saveat.mode()

    y0 = _as_array_tree(y0, "y0")
    for name, x in (("t0", t0), ("t1", t1), ("dt", dt)):
        _check_scalar(x, name)
    check_state(checks, y0)
    check_times(checks, t0, t1, dt, forward_only=True)
    check_args(checks, args)
    concrete = not is_tracer((t0, t1, dt, saveat.ts))
    tdtype = time_dtype(y0)
    shape = _noise_shape(noise, f, diffusion, y0, args, tdtype)
    if solver.additive_noise_only and _diffusion_depends_on_state(diffusion, y0, args, tdtype):
        raise ValueError(
            f"{type(solver).__name__}() needs additive noise, but diffusion(t, y, args) "
            "depends on y: use Milstein() or StochasticHeun() (or EulerMaruyama()) for "
            "multiplicative noise; with additive noise, write g without y (e.g. "
            "sigma * jnp.ones_like(y))")
    check_resolution(checks, t0, t1, dt, tdtype)

    if mode == "ts":
        ts = jnp.asarray(saveat.ts, tdtype)
        if ts.ndim != 1 or ts.shape[0] == 0:
            raise ValueError(f"saveat.ts must be a non-empty 1-D array, got shape {ts.shape}")
        check_save_times(checks, saveat.ts, t0, t1)
        n_save = int(ts.shape[0])
    else:
        ts, n_save = None, 0

    traced = is_tracer((y0, t0, t1, dt, rtol, atol, args, saveat.ts, key)) or inside_trace()
    # the run's own failures and the traced argument checks share one in-graph check
    in_graph_check = bool(throw) and traced and not checks.pending
    if adaptive:
        return _solve_adaptive(f, diffusion, solver, y0, t0, t1, dt, rtol, atol, key, noise,
                               shape, tdtype, args, saveat, mode, ts, n_save, max_steps,
                               throw, traced, in_graph_check, adjoint, progress, checks,
                               controller)

    if concrete:
        levels = levels_for(float(t0), float(t1), float(dt))
        n_grid_host = grid_count(float(t0), float(t1), float(dt))
        n_grid = jnp.asarray(n_grid_host, jnp.int32)
        n_iter = fixed_iterations(float(t0), float(t1), float(dt),
                                  None if ts is None else np.asarray(saveat.ts, np.float64))
    else:  # at most max_steps steps: a leaf of T / 2^levels is at most one step long
        levels = int(math.ceil(math.log2(max_steps)))
        n_grid, n_iter, n_grid_host = None, max_steps + n_save, -1
    # every step ends on a node when the grid is the tree's leaves; else precompute the
    # bridge normals of every leaf rather than hashing them step by step
    on_nodes = concrete and mode != "ts" and n_grid_host == 2 ** levels
    if brownian == "steps":
        path = BrownianSteps(key, shape, dtype=tdtype)
    else:
        path = BrownianPath(key, t0, t1, shape, levels=levels, area=solver.needs_area,
                            dtype=tdtype, precompute=not on_nodes)

    every = -(-n_iter // 100) if progress and not traced and n_iter > 0 else 0
    with _bar(every, n_iter, "step") as bar:
        sol = _fixed_jit(_SDEField(f, diffusion), solver, mode, saveat.t0, n_iter, n_save,
                         in_graph_check, max_steps, AUTOMATIC if adjoint is None else adjoint,
                         y0, t0, t1, dt, n_grid, ts, _SDEArgs(args, path, noise),
                         progress=every)
        if every:
            jax.block_until_ready(sol)
            bar.set(n_iter)
    sol = checks.apply(sol, throw=bool(throw), t1=t1, max_steps=max_steps)
    if throw and not traced:
        _raise_if_failed(sol, t1, max_steps)
    return sol


VIRTUAL_LEVELS = {8: 20, 4: 14}
"""Depth of an adaptive solve's :class:`VirtualBrownianPath` by the time dtype's size: a
leaf is ``(t1 - t0) / 2^levels`` long (float32 resolves positions to ~2^-24 of the span)."""


def _solve_adaptive(f, diffusion, solver, y0, t0, t1, dt, rtol, atol, key, noise, shape,
                    tdtype, args, saveat, mode, ts, n_save, max_steps, throw, traced,
                    in_graph_check, adjoint, progress, checks,
                    controller: PIDController | None = None) -> Solution:
    """An adaptive SDE solve on the adaptive driver of ODEs, the path a
    :class:`VirtualBrownianPath` (queried at any time, consistent with the tree)."""
    from ._adaptive import adaptive_jit
    from ._solve import _bar, _raise_if_failed

    levels = VIRTUAL_LEVELS[jnp.dtype(tdtype).itemsize]
    path = VirtualBrownianPath(key, t0, t1, shape, levels=levels, dtype=tdtype)
    if dt is None:  # the first step; the controller takes it from there
        dt = (jnp.asarray(t1, tdtype) - jnp.asarray(t0, tdtype)) / 100
    every = max(64, min(4096, max_steps // 100)) if progress and not traced else 0
    with _bar(every, abs(float(t1) - float(t0)) if every else 0.0, "t") as bar:
        sol = adaptive_jit(_SDEField(f, diffusion), solver, mode, saveat.t0, n_save,
                           in_graph_check, max_steps, AUTOMATIC if adjoint is None else adjoint,
                           y0, t0, t1, dt, rtol, atol, ts, _SDEArgs(args, path, noise),
                           progress=every, controller=controller)
        if every:
            jax.block_until_ready(sol)
            bar.set(abs(float(sol.stats["t_final"]) - float(t0)))
    sol = checks.apply(sol, throw=bool(throw), t1=t1, max_steps=max_steps)
    if throw and not traced:
        _raise_if_failed(sol, t1, max_steps)
    return sol
