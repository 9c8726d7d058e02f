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

from ._adjoint import AbstractAdjoint
from ._arguments import Problem, check_callable, check_field, complete, describe, normalise
from ._brownian import BrownianPath, BrownianSteps, VirtualBrownianPath, levels_for
from ._control import PIDController
from ._run import fixed_count, run_adaptive, run_fixed
from ._solution import SaveAt, Solution
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._solver._implicit import configure as configure_linear_solver
from ._solver._sde import NOISE_TYPES, AbstractSDESolver

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


def _noise_shape(noise: str, f: VectorField, g: VectorField, y0: PyTree, args: Any,
                 tdtype: Any) -> tuple[int, ...]:
    """Check ``f`` and ``g`` against ``y0`` and return the Brownian path's flat shape."""
    check_field(f, y0, args, tdtype)
    if noise in ("diagonal", "scalar"):
        check_field(g, y0, args, tdtype, name="diffusion", like=f" for noise={noise!r}")
        return () if noise == "scalar" else (
            sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(y0)),)
    try:
        out = jax.eval_shape(g, jax.ShapeDtypeStruct((), tdtype), y0, args)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling diffusion(t0, y0, args) failed: {err}") from err
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(y0):
        raise ValueError(f"diffusion must return the same pytree structure as y0: y0 is "
                         f"{jax.tree_util.tree_structure(y0)}, diffusion returned "
                         f"{jax.tree_util.tree_structure(out)}")
    ys, outs = jax.tree_util.tree_leaves(y0), jax.tree_util.tree_leaves(out)
    ms = {b.shape[-1] if b.ndim == a.ndim + 1 and b.shape[:-1] == a.shape else None
          for a, b in zip(ys, outs, strict=True)}
    if None in ms or len(ms) != 1:
        raise ValueError(
            "diffusion must return, for noise='general', each leaf shaped like y0's "
            f"leaf followed by (m,) with the same m: y0 is {describe(y0)}, diffusion "
            f"returned {describe(out)}")
    return (ms.pop(),)


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


def solve_sde(f: VectorField, y0: PyTree, t0: Any, t1: Any, *, solver: AbstractSolver,
              diffusion: VectorField | None, key: Any, noise: str | None,
              brownian: str | None, dt: Any, rtol: Any, atol: Any, args: Any,
              saveat: SaveAt, max_steps: int, throw: bool, adjoint: AbstractAdjoint | None,
              events: Any, progress: bool = False, controller: PIDController | None = None,
              jac_sparsity: Any = None, jac_bandwidth: Any = None,
              linear_solver: Any = None) -> Solution:
    """The SDE branch of :func:`simlib.solve` (arguments as there): ``dy = f dt + g dW``
    on the fixed-step driver (Brownian path: a :class:`BrownianPath` on the tree of the
    span, or :class:`BrownianSteps`) or the adaptive one (a :class:`VirtualBrownianPath`).
    Checks its arguments eagerly, naming the bad one."""
    noise, brownian = _check_sde_options(solver, diffusion, key, noise, brownian, dt, rtol,
                                         atol, events, jac_sparsity=jac_sparsity,
                                         jac_bandwidth=jac_bandwidth,
                                         linear_solver=linear_solver)
    p = normalise("solve", f, y0, t0, t1, solver=solver, dt=dt, rtol=rtol, atol=atol,
                  args=args, saveat=saveat, max_steps=max_steps, throw=throw,
                  adjoint=adjoint, events=None, progress=progress, controller=controller,
                  sde=True)
    shape = _noise_shape(noise, f, diffusion, p.y0, args, p.tdtype)
    if solver.additive_noise_only and _diffusion_depends_on_state(diffusion, p.y0, args,
                                                                   p.tdtype):
        raise ValueError(
            f"{type(solver).__name__}() needs additive noise, but diffusion(t, y, args) "
            "depends on y: use Milstein() or StochasticHeun() (or EulerMaruyama()) for "
            "multiplicative noise; with additive noise, write g without y (e.g. "
            "sigma * jnp.ones_like(y))")
    p = complete(p, key)
    if p.adaptive:
        return _solve_adaptive(p, diffusion, key, noise, shape)
    return _solve_fixed(p, diffusion, key, noise, brownian, shape)


def _check_sde_options(solver: AbstractSolver, diffusion: Any, key: Any, noise: Any,
                       brownian: Any, dt: Any, rtol: Any, atol: Any, events: Any,
                       **linear: Any) -> tuple[str, str]:
    """The SDE's own options (``diffusion``, ``key``, ``noise``, ``brownian``) checked
    against each other and the solver, with what an SDE cannot take (events, the implicit
    solvers' linear algebra); ``(noise, brownian)`` with their defaults filled in."""
    name = type(solver).__name__
    if diffusion is None and not isinstance(solver, AbstractSDESolver):
        given = next(name for name, x in (("key", key), ("noise", noise),
                                          ("brownian", brownian)) if x is not None)
        raise ValueError(f"{given} is an SDE option, but diffusion was not given and "
                         f"{name} is an ODE method; for an SDE give "
                         "diffusion=g and an SDE method, for an ODE leave out "
                         "key, noise and brownian")
    if key is None:
        raise ValueError("key is required for an SDE (diffusion=...): give a JAX key, e.g. "
                         "key=jax.random.key(0); one key gives one Brownian path")
    if diffusion is None:
        raise ValueError(f"{name} is an SDE method: give diffusion=g, "
                         "g(t, y, args) the noise coefficient")
    check_callable(diffusion, "diffusion")
    if not isinstance(solver, AbstractSDESolver):
        raise ValueError(
            f"diffusion was given, but solver {name}() is an ODE method; use "
            "an SDE method: EulerMaruyama(), Milstein(), StochasticHeun() or SRA1()")
    # the SDE methods solve no linear systems: refused as for an explicit ODE method
    configure_linear_solver(solver, None, None, None, None, **linear)
    noise = "diagonal" if noise is None else noise
    brownian = "tree" if brownian is None else brownian
    if not isinstance(brownian, str) or brownian not in BROWNIAN:
        raise ValueError(f"brownian must be one of {', '.join(map(repr, BROWNIAN))}, "
                         f"got {brownian!r}")
    if noise not in NOISE_TYPES:
        raise ValueError(f"noise must be one of {', '.join(map(repr, NOISE_TYPES))}, "
                         f"got {noise!r}")
    if noise not in solver.noise_types:
        raise ValueError(f"noise={noise!r} is not supported by {name}() "
                         f"(it takes {', '.join(map(repr, solver.noise_types))}); "
                         "EulerMaruyama() and StochasticHeun() take every noise type")
    if rtol is not None or atol is not None:
        if not solver.adaptive:
            raise ValueError(
                f"rtol/atol were given, but {name}() has no error estimate; "
                "StochasticHeun() is the adaptive SDE method (Stratonovich), or give dt "
                "without tolerances for a fixed step")
        if brownian == "steps":
            raise ValueError(
                "brownian='steps' cannot drive an adaptive solve (a rejected step would "
                "redraw its increment from the same normal, biasing the path); use the "
                "default brownian='tree' with rtol/atol")
    elif dt is None:
        raise ValueError(f"{name} needs a step size: give dt")
    if events is not None:
        raise ValueError("events are not supported for SDEs")
    return noise, brownian


def _solve_fixed(p: Problem, diffusion: VectorField, key: Any, noise: str, brownian: str,
                 shape: tuple[int, ...]) -> Solution:
    """A fixed-step SDE solve, the path a :class:`BrownianPath` deep enough for one leaf
    per step (or :class:`BrownianSteps`)."""
    n_iter, n_grid = fixed_count(p)
    if n_grid is not None:
        levels = levels_for(float(p.t0), float(p.t1), float(p.dt))
    else:  # at most max_steps steps: a leaf of T / 2^levels is at most one step long
        levels = int(math.ceil(math.log2(p.max_steps)))
    # every step ends on a node when the grid is the tree's leaves; else precompute the
    # bridge normals of every leaf rather than hashing them step by step
    on_nodes = n_grid is not None and p.mode != "ts" and n_grid == 2 ** levels
    if brownian == "steps":
        path = BrownianSteps(key, shape, dtype=p.tdtype)
    else:
        path = BrownianPath(key, p.t0, p.t1, shape, levels=levels, area=p.solver.needs_area,
                            dtype=p.tdtype, precompute=not on_nodes)
    p = p._replace(f=_SDEField(p.f, diffusion), args=_SDEArgs(p.args, path, noise))
    return run_fixed(p, n_iter, n_grid)


VIRTUAL_LEVELS = {8: 20, 4: 14}
"""Depth of an adaptive solve's :class:`VirtualBrownianPath` by the time dtype's size: a
leaf is ``(t1 - t0) / 2^levels`` long (float32 resolves positions to ~2^-24 of the span)."""


def _solve_adaptive(p: Problem, diffusion: VectorField, key: Any, noise: str,
                    shape: tuple[int, ...]) -> Solution:
    """An adaptive SDE solve on the adaptive driver of ODEs, the path a
    :class:`VirtualBrownianPath` (queried at any time, consistent with the tree)."""
    levels = VIRTUAL_LEVELS[jnp.dtype(p.tdtype).itemsize]
    path = VirtualBrownianPath(key, p.t0, p.t1, shape, levels=levels, dtype=p.tdtype)
    dt = p.dt
    if dt is None:  # the first step; the controller takes it from there
        dt = (jnp.asarray(p.t1, p.tdtype) - jnp.asarray(p.t0, p.tdtype)) / 100
    p = p._replace(f=_SDEField(p.f, diffusion), args=_SDEArgs(p.args, path, noise), dt=dt)
    return run_adaptive(p)
