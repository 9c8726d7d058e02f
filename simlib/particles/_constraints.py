r"""Holonomic bond constraints: RATTLE (velocity Verlet with SHAKE on positions and velocities).

Each constraint :math:`\sigma_k = |x_i - x_j|^2 - d_k^2 = 0` (a rigid bond) is enforced by
Lagrange multipliers found iteratively, one bond at a time (Gauss-Seidel), to a relative
tolerance: SHAKE (Ryckaert, Ciccotti & Berendsen, J. Comput. Phys. 23, 327 (1977)) after the
drift, and RATTLE's velocity stage (Andersen, J. Comput. Phys. 52, 24 (1983)), which
removes each bond's relative velocity along it, after the second kick. The scheme is
second order, symplectic and time-reversible on the constraint manifold.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from .._errors import Result
from ._dynamics import Carry, Integrator


class ConstraintState(NamedTuple):
    """Iterations of the last step's SHAKE and RATTLE stages, and whether every step so far
    converged (sticky)."""

    iterations: jax.Array
    converged: jax.Array


@jax.tree_util.register_pytree_node_class
class Rattle(Integrator):
    r"""Velocity Verlet with rigid bonds (NVE on the constraint manifold).

    SHAKE, for the positions after the drift: for each bond :math:`(i, j)` with old vector
    :math:`r^0_{ij}` and new :math:`s_{ij}`,
    :math:`g = (s^2 - d^2) / (2\, s\cdot r^0 (1/m_i + 1/m_j))`,
    :math:`x_i \mathrel{-}= g r^0/m_i`, :math:`x_j \mathrel{+}= g r^0/m_j` (and the half-step
    velocities by the same over ``dt``); RATTLE, for the velocities after the second kick:
    :math:`k = r\cdot v_{ij} / (d^2 (1/m_i + 1/m_j))`, :math:`v_i \mathrel{-}= k r/m_i`,
    :math:`v_j \mathrel{+}= k r/m_j`. Sweeps over the bonds repeat until
    :math:`\max |s^2 - d^2| / d^2` and :math:`\max |r\cdot v_{ij}| / d^2` are below
    ``tolerance`` (at most ``max_iterations`` sweeps; a step that does not converge fails
    the run with ``Result.CONSTRAINTS_NOT_CONVERGED``). Ryckaert, Ciccotti & Berendsen,
    J. Comput. Phys. 23, 327 (1977); Andersen, J. Comput. Phys. 52, 24 (1983).

    The start state should satisfy the constraints (positions and velocities); the
    temperature then has :math:`d(n - 1) - n_{bonds}` degrees of freedom.

    Args:
        bonds: ``(m, 2)`` integer array of constrained pairs.
        lengths: ``(m,)`` bond lengths (or a scalar); an array leaf.
        tolerance: Relative tolerance of the constraints.
        max_iterations: Most sweeps over the bonds per stage.
    """

    def __init__(self, bonds: ArrayLike, lengths: ArrayLike, tolerance: float = 1e-13,
                 max_iterations: int = 1000) -> None:
        self.bonds = jnp.asarray(bonds)
        self.lengths = lengths
        self.tolerance = float(tolerance)
        self.max_iterations = int(max_iterations)
        if self.bonds.ndim != 2 or self.bonds.shape[1] != 2 or not jnp.issubdtype(
                self.bonds.dtype, jnp.integer):
            raise ValueError(f"Rattle: bonds must be an (m, 2) integer array, got shape "
                             f"{self.bonds.shape} and dtype {self.bonds.dtype}")

    def tree_flatten(self):
        return (self.bonds, self.lengths), (self.tolerance, self.max_iterations)

    @classmethod
    def tree_unflatten(cls, static, children):
        out = object.__new__(cls)
        out.bonds, out.lengths = children
        out.tolerance, out.max_iterations = static
        return out

    def __repr__(self):
        return f"Rattle({self.bonds.shape[0]} bonds, tolerance={self.tolerance})"

    def init(self, model, carry: Carry, masses, params):
        return ConstraintState(jnp.zeros((2,), jnp.int32), jnp.array(True))

    def _setup(self, masses, like):
        n = like.shape[0]
        m = jnp.broadcast_to(jnp.asarray(masses, like.dtype), (n,))
        d2 = jnp.broadcast_to(jnp.asarray(self.lengths, like.dtype) ** 2,
                              (self.bonds.shape[0],))
        return 1.0 / m, d2

    def _sweeps(self, update, error, state):
        """Repeat ``update`` (one Gauss-Seidel sweep) until ``error(state) < tolerance``."""
        def cond(c):
            k, s = c
            return (k < self.max_iterations) & (error(s) >= self.tolerance)

        def body(c):
            k, s = c
            return k + 1, update(s)

        k, state = lax.while_loop(cond, body, (jnp.int32(0), state))
        return state, k, error(state) < self.tolerance

    def _shake(self, space, x_old, x, v, inv_m, d2, dt):
        i, j = self.bonds[:, 0], self.bonds[:, 1]
        r_old = space.displacement(x_old[i], x_old[j])                # (m, d)

        def one(b, xv):
            x, v = xv
            s = space.displacement(x[i[b]], x[j[b]])
            w = inv_m[i[b]] + inv_m[j[b]]
            g = (jnp.dot(s, s) - d2[b]) / (2.0 * jnp.dot(s, r_old[b]) * w)
            dx = g * r_old[b]
            x = x.at[i[b]].add(-dx * inv_m[i[b]]).at[j[b]].add(dx * inv_m[j[b]])
            v = v.at[i[b]].add(-dx * inv_m[i[b]] / dt).at[j[b]].add(dx * inv_m[j[b]] / dt)
            return x, v

        def error(xv):
            s = space.displacement(xv[0][i], xv[0][j])
            return jnp.max(jnp.abs(jnp.sum(s * s, axis=-1) - d2) / d2)

        (x, v), k, ok = self._sweeps(lambda xv: lax.fori_loop(0, len(d2), one, xv), error,
                                     (x, v))
        return x, v, k, ok

    def _rattle(self, space, x, v, inv_m, d2):
        i, j = self.bonds[:, 0], self.bonds[:, 1]
        r = space.displacement(x[i], x[j])

        def one(b, v):
            k = jnp.dot(r[b], v[i[b]] - v[j[b]]) / (d2[b] * (inv_m[i[b]] + inv_m[j[b]]))
            dv = k * r[b]
            return v.at[i[b]].add(-dv * inv_m[i[b]]).at[j[b]].add(dv * inv_m[j[b]])

        def error(v):
            return jnp.max(jnp.abs(jnp.sum(r * (v[i] - v[j]), axis=-1)) / d2)

        v, k, ok = self._sweeps(lambda v: lax.fori_loop(0, len(d2), one, v), error, v)
        return v, k, ok

    def constrain_positions(self, space, x_old, x, v, masses, dt):
        """SHAKE: ``x`` (after an unconstrained drift from ``x_old``) and the velocities
        ``v`` that moved it corrected onto the bonds; returns ``(x, v, converged)``."""
        inv_m, d2 = self._setup(masses, x_old)
        x, v, _, ok = self._shake(space, x_old, x, v, inv_m, d2, dt)
        return x, v, ok

    def constrain_velocities_on(self, space, x, v, masses):
        """RATTLE's velocity stage at positions ``x``; returns ``(v, converged)``."""
        inv_m, d2 = self._setup(masses, x)
        v, _, ok = self._rattle(space, x, v, inv_m, d2)
        return v, ok

    def molecules(self) -> np.ndarray:
        """The bonded clusters (connected components of ``bonds``) as rows of atom indices,
        padded with -1: the rigid bodies a barostat scales by their centres of mass."""
        bonds = np.asarray(self.bonds)
        parent = {}

        def find(a):
            while parent.setdefault(a, a) != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for i, j in bonds:
            parent[find(int(i))] = find(int(j))
        groups = {}
        for a in sorted(parent):
            groups.setdefault(find(a), []).append(a)
        rows = sorted(groups.values())
        k = max((len(r) for r in rows), default=0)
        return np.array([r + [-1] * (k - len(r)) for r in rows], dtype=np.int64).reshape(-1, k)

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        x0, v = carry.positions, carry.velocities
        inv_m, d2 = self._setup(masses, x0)
        inv_col = inv_m[:, None]
        v = v + (0.5 * dt) * carry.forces * inv_col
        x = x0 + dt * v                                   # unwrapped until the bonds hold
        x, v, k1, ok1 = self._shake(model.space, x0, x, v, inv_m, d2, dt)
        x = model.space.wrap(x)
        nbrs = carry.neighbors.update(x) if carry.neighbors is not None else None
        e, f = model.energy_and_forces(x, params, nbrs)
        v = v + (0.5 * dt) * f * inv_col
        v, k2, ok2 = self._rattle(model.space, x, v, inv_m, d2)
        state = ConstraintState(jnp.stack([k1, k2]), carry.extra.converged & ok1 & ok2)
        return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                              neighbors=nbrs, step=carry.step + 1, extra=state)

    def check(self, carry: Carry) -> jax.Array:
        return jnp.where(carry.extra.converged, jnp.int32(0),
                         jnp.int32(Result.CONSTRAINTS_NOT_CONVERGED))
