r"""Energy minimisation with FIRE (fast inertial relaxation engine).

Bitzek, Koskinen, Gähler, Moseler & Gumbsch, Phys. Rev. Lett. 97, 170201 (2006): MD with
unit masses, a velocity mixed towards the force direction,
:math:`v \leftarrow (1-\alpha) v + \alpha |v| \hat F`, and an adaptive step that grows
while the power :math:`P = F\cdot v` stays positive and is cut (velocities zeroed) when it
turns negative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from .._errors import Result, check_in_graph, raise_on_failure
from ._energy import Energy, as_energy
from ._space import Space, check_run_box


class MinimizeResult(NamedTuple):
    """Outcome of :func:`minimize`.

    Attributes:
        positions: The relaxed positions.
        energy: The energy there.
        max_force: The largest force component there.
        n_steps: FIRE steps taken.
        converged: Whether ``max_force < ftol`` was reached within ``max_steps``.
        neighbors: The neighbour list at the end (``None`` without one).
        result: A :class:`~simlib.Result` code: ``SUCCESSFUL`` (converged or not: see
            ``converged``), ``NONFINITE_STATE`` (the energy or forces are not finite), or
            for a traced box that the eager check would refuse ``BOX_TOO_SMALL`` (a side
            below twice ``r_cut``) or ``INVALID_BOX``.
    """

    positions: jax.Array
    energy: jax.Array
    max_force: jax.Array
    n_steps: jax.Array
    converged: jax.Array
    neighbors: object
    result: jax.Array


def minimize(energy: Energy | Callable[..., jax.Array], positions: ArrayLike, params: Any, *,
             space: Space, neighbors: Any = None, ftol: float = 1e-6,
             max_steps: int = 10_000, dt_start: float = 0.01, dt_max: float = 0.1,
             n_min: int = 5, f_inc: float = 1.1, f_dec: float = 0.5, alpha_start: float = 0.1,
             f_alpha: float = 0.99, throw: bool = True) -> MinimizeResult:
    """Relax ``positions`` to a local energy minimum with FIRE (jittable).

    Stops when the largest force component is below ``ftol`` or after ``max_steps``. The
    defaults are the paper's. The neighbour list is updated as particles move; check
    ``result.neighbors.overflow`` (or use a generous capacity) for large rearrangements.

    A periodic box must be at least twice the energy's ``r_cut`` (and the list's
    ``r_cut + skin``) on every side: a concrete box is refused with a ``ValueError``, a
    traced one (under ``jit``/``vmap``) ends in ``Result.BOX_TOO_SMALL`` or
    ``INVALID_BOX``. A non-finite energy or force ends in ``Result.NONFINITE_STATE``.
    With ``throw=True`` (default) a failure raises :class:`~simlib.SolverError`;
    otherwise it is in ``result.result``.
    """
    energy = as_energy(energy)
    positions = jnp.asarray(positions)
    if positions.ndim != 2:
        raise ValueError(f"minimize: positions must have shape (n, d), got {positions.shape}")
    box_code = check_run_box(energy, space, neighbors, positions.shape[1], "minimize")
    x0 = space.wrap(positions)
    dtype = x0.dtype
    nbrs0 = neighbors.update(x0) if neighbors is not None else None

    def forces(x, nbrs):
        return energy.energy_and_forces(x, params, nbrs)

    e0, f0 = forces(x0, nbrs0)
    init = (x0, jnp.zeros_like(x0), f0, e0, nbrs0, jnp.asarray(dt_start, dtype),
            jnp.asarray(alpha_start, dtype), jnp.int32(0), jnp.int32(0))

    def not_done(c):
        return (jnp.max(jnp.abs(c[2])) >= ftol) & (c[7] < max_steps)

    def body(c):
        x, v, f, e, nbrs, dt, alpha, step, since_negative = c
        power = jnp.sum(f * v)
        f_norm = jnp.sqrt(jnp.sum(f * f))
        v_norm = jnp.sqrt(jnp.sum(v * v))
        v = (1 - alpha) * v + alpha * v_norm * f / jnp.where(f_norm > 0, f_norm, 1.0)
        positive = power > 0
        grow = positive & (since_negative > n_min)
        dt = jnp.where(grow, jnp.minimum(dt * f_inc, dt_max), jnp.where(positive, dt, dt * f_dec))
        alpha = jnp.where(grow, alpha * f_alpha, jnp.where(positive, alpha, alpha_start))
        since_negative = jnp.where(positive, since_negative + 1, 0)
        v = jnp.where(positive, v, 0.0)
        # Semi-implicit Euler MD step with unit masses.
        v = v + dt * f
        x = space.shift(x, dt * v)
        nbrs = nbrs.update(x) if nbrs is not None else None
        e, f = forces(x, nbrs)
        return x, v, f, e, nbrs, dt, alpha, step + 1, since_negative

    x, _, f, e, nbrs, _, _, step, _ = lax.while_loop(not_done, body, init)
    max_force = jnp.max(jnp.abs(f))
    finite = jnp.isfinite(lax.stop_gradient(e)) & jnp.isfinite(lax.stop_gradient(max_force))
    code = jnp.where(finite, jnp.int32(Result.SUCCESSFUL), jnp.int32(Result.NONFINITE_STATE))
    if box_code is not None:       # a bad box comes first: it explains everything after it
        code = jnp.where(box_code != 0, box_code, code)
    out = MinimizeResult(x, e, max_force, step, max_force < ftol, nbrs, code)
    if not throw:
        return out
    at = jnp.where(code == Result.NONFINITE_STATE, step, 0)
    if isinstance(code, jax.core.Tracer):
        return check_in_graph(out, code, at.astype(dtype), at, max_steps, max_steps,
                              caller="minimize")
    raise_on_failure(code, float(at), int(at), float(max_steps), max_steps, caller="minimize")
    return out

