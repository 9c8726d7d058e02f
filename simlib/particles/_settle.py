r"""Rigid three-site water: SETTLE (Miyamoto & Kollman, J. Comput. Chem. 13, 952 (1992)).

SETTLE solves the three distance constraints of a rigid water molecule (two O-H bonds and
the H-H distance) in closed form, where SHAKE iterates. After an unconstrained drift the
corrections of SHAKE/RATTLE are sums of the *old* bond vectors (the constraint forces act
along them): they lie in the old molecular plane, keep the centre of mass, and carry no
torque about it. In the frame whose :math:`Z` axis is the old plane's normal and whose
origin is the new centre of mass, the :math:`z` coordinates are therefore unchanged, which
fixes the tilt angles :math:`\phi` and :math:`\psi` of the canonical triangle; its
in-plane rotation :math:`\theta` then follows from the zero-torque condition
:math:`\alpha\sin\theta + \beta\cos\theta = \gamma` (their eqs. A1-A11). The velocity
part removes the relative velocity along each of the three constraints by solving a
:math:`3\times 3` linear system for the three impulses (their section "SETTLE for
velocities", the RATTLE velocity stage done exactly).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .._errors import Result
from ._dynamics import Carry, Integrator, inverse_mass, kinetic


def _geometry(m_o, m_h, d_oh, d_hh):
    """The canonical triangle: O at ``(0, ra)``, H at ``(-+rc, -rb)`` about the centre of
    mass, with the masses ``m_o``, ``m_h`` (per molecule)."""
    rc = 0.5 * d_hh
    height = jnp.sqrt(d_oh * d_oh - rc * rc)              # O to the H-H midpoint
    wh = m_h / (m_o + 2.0 * m_h)
    ra = 2.0 * wh * height
    return ra, height - ra, rc, wh


def _dot(a, b):
    return jnp.sum(a * b, axis=-1)


def _unit(a):
    return a / jnp.linalg.norm(a, axis=-1, keepdims=True)


def settle_positions(space, x_old, x_new, molecules, masses, d_oh, d_hh):
    r"""Positions ``x_new`` corrected so that every molecule is rigid again (SETTLE).

    ``molecules`` is ``(w, 3)`` atom indices, oxygen first; ``x_old`` must satisfy the
    constraints. Returns the corrected positions (the atoms of no molecule unchanged) and
    a ``(w,)`` boolean, ``False`` for a molecule that moved too far for a solution (then
    left uncorrected). Miyamoto & Kollman (1992), appendix A.
    """
    o, h1, h2 = molecules[:, 0], molecules[:, 1], molecules[:, 2]
    m = jnp.broadcast_to(jnp.asarray(masses, x_new.dtype), x_new.shape[:1])
    ra, rb, rc, wh = _geometry(m[o], m[h1], jnp.asarray(d_oh, x_new.dtype),
                               jnp.asarray(d_hh, x_new.dtype))
    # old bond vectors from O (the plane), new positions about the new centre of mass
    b0 = space.displacement(x_old[h1], x_old[o])
    c0 = space.displacement(x_old[h2], x_old[o])
    doh2 = space.displacement(x_new[h1], x_new[o])
    doh3 = space.displacement(x_new[h2], x_new[o])
    a1 = -(doh2 + doh3) * wh[:, None]        # O about the COM (no rounding through the COM)
    b1, c1 = doh2 + a1, doh3 + a1
    ez = _unit(jnp.cross(b0, c0))
    ex = _unit(jnp.cross(a1, ez))
    ey = jnp.cross(ez, ex)
    xb0, yb0, xc0, yc0 = _dot(b0, ex), _dot(b0, ey), _dot(c0, ex), _dot(c0, ey)
    xb1, yb1, zb1 = _dot(b1, ex), _dot(b1, ey), _dot(b1, ez)
    xc1, yc1, zc1 = _dot(c1, ex), _dot(c1, ey), _dot(c1, ez)
    za1 = _dot(a1, ez)

    def root(t):                               # sqrt where t > 0, flagged otherwise
        good = t > 0
        return jnp.sqrt(jnp.where(good, t, 1.0)), good

    sinphi = za1 / ra
    cosphi, ok1 = root(1.0 - sinphi * sinphi)
    sinpsi = (zb1 - zc1) / (2.0 * rc * cosphi)
    cospsi, ok2 = root(1.0 - sinpsi * sinpsi)
    ya2 = ra * cosphi
    xb2 = -rc * cospsi
    t1, t2 = -rb * cosphi, rc * sinpsi * sinphi
    yb2, yc2 = t1 - t2, t1 + t2
    alpha = xb2 * (xb0 - xc0) + yb0 * yb2 + yc0 * yc2
    beta = xb2 * (yc0 - yb0) + xb0 * yb2 + xc0 * yc2
    gamma = xb0 * yb1 - xb1 * yb0 + xc0 * yc1 - xc1 * yc0
    al2be2 = alpha * alpha + beta * beta
    disc, ok3 = root(al2be2 - gamma * gamma)
    sinthe = (alpha * gamma - beta * disc) / al2be2
    costhe, ok4 = root(1.0 - sinthe * sinthe)
    ok = ok1 & ok2 & ok3 & ok4 & jnp.isfinite(sinthe)

    def lab(x, y, z):
        return x[:, None] * ex + y[:, None] * ey + z[:, None] * ez

    a3 = lab(-ya2 * sinthe, ya2 * costhe, za1)
    b3 = lab(xb2 * costhe - yb2 * sinthe, xb2 * sinthe + yb2 * costhe, zb1)
    c3 = lab(-xb2 * costhe - yc2 * sinthe, -xb2 * sinthe + yc2 * costhe, zc1)
    keep = ok[:, None]
    x = (x_new.at[o].add(jnp.where(keep, a3 - a1, 0.0))
         .at[h1].add(jnp.where(keep, b3 - b1, 0.0))
         .at[h2].add(jnp.where(keep, c3 - c1, 0.0)))
    return x, ok


def settle_velocities(space, x, v, molecules, masses):
    r"""Velocities ``v`` with each molecule's relative velocity along its three constraints
    removed (the RATTLE velocity stage, solved exactly).

    With :math:`r_k = x_{j_k} - x_{i_k}` for the constraints O-H1, O-H2, H1-H2 and impulses
    :math:`g_l` along them (:math:`v_{i_l} \mathrel{-}= g_l r_l/m_{i_l}`,
    :math:`v_{j_l} \mathrel{+}= g_l r_l/m_{j_l}`), the conditions
    :math:`r_k\cdot(v'_{j_k} - v'_{i_k}) = 0` are the symmetric positive definite system
    :math:`\sum_l (r_k\cdot r_l)\,c_{kl}\,g_l = -r_k\cdot(v_{j_k} - v_{i_k})` (Miyamoto &
    Kollman 1992, "SETTLE for velocities"; Andersen, J. Comput. Phys. 52, 24 (1983)).
    """
    o, h1, h2 = molecules[:, 0], molecules[:, 1], molecules[:, 2]
    m = jnp.broadcast_to(jnp.asarray(masses, v.dtype), v.shape[:1])
    io, ih = 1.0 / m[o], 1.0 / m[h1]
    r = jnp.stack([space.displacement(x[h1], x[o]), space.displacement(x[h2], x[o]),
                   space.displacement(x[h2], x[h1])], axis=1)            # (w, 3, 3)
    rel = jnp.stack([v[h1] - v[o], v[h2] - v[o], v[h2] - v[h1]], axis=1)
    rhs = -jnp.sum(r * rel, axis=-1)                                       # (w, 3)
    zero = jnp.zeros_like(io)
    c = jnp.stack([jnp.stack([io + ih, io, -ih]), jnp.stack([io, io + ih, ih]),
                   jnp.stack([-ih, ih, 2.0 * ih + zero])]).transpose(2, 0, 1)
    a = jnp.einsum("wkd,wld->wkl", r, r) * c
    g = _solve3(a, rhs)                                                    # (w, 3)
    dv_o = -(g[:, 0:1] * r[:, 0] + g[:, 1:2] * r[:, 1]) * io[:, None]
    dv_h1 = (g[:, 0:1] * r[:, 0] - g[:, 2:3] * r[:, 2]) * ih[:, None]
    dv_h2 = (g[:, 1:2] * r[:, 1] + g[:, 2:3] * r[:, 2]) * ih[:, None]
    return v.at[o].add(dv_o).at[h1].add(dv_h1).at[h2].add(dv_h2)


_settle_velocities_jit = jax.jit(settle_velocities)


def _solve3(a, b):
    """``a^-1 b`` for a batch of 3x3 matrices, by the adjugate (Cramer's rule)."""
    c0 = jnp.cross(a[:, 1], a[:, 2])
    c1 = jnp.cross(a[:, 2], a[:, 0])
    c2 = jnp.cross(a[:, 0], a[:, 1])
    det = jnp.sum(a[:, 0] * c0, axis=-1)
    # the inverse's columns are c0, c1, c2 over det: x = (b0 c0 + b1 c1 + b2 c2) / det
    return (b[:, 0:1] * c0 + b[:, 1:2] * c1 + b[:, 2:3] * c2) / det[:, None]


class SettleState(NamedTuple):
    """The thermostat's own state (``None`` without one) and whether every step so far
    found a solution for every molecule (sticky)."""

    thermostat: object
    solved: jax.Array


@jax.tree_util.register_pytree_node_class
class Settle(Integrator):
    r"""Velocity Verlet with rigid three-site water molecules held by SETTLE; NVE, or NVT
    with a thermostat.

    Each step: thermostat(h/2), half kick, drift, SETTLE on the positions (the half-step
    velocities corrected by the same displacement over ``dt``), the force, half kick, SETTLE
    on the velocities, thermostat(h/2). Second order, symplectic and time-reversible on the
    constraint manifold (it is RATTLE with the constraints solved exactly). Both
    thermostats (:class:`Bussi`, :class:`NoseHooverChain`) scale all velocities by one
    factor, which keeps the velocity constraints; their degrees of freedom default to
    :math:`3(n - 1) - 3w` for ``w`` molecules (their ``dof`` argument overrides it). Atoms
    in no molecule (ions) move by plain velocity Verlet. Miyamoto & Kollman, J. Comput.
    Chem. 13, 952 (1992).

    Start from positions and velocities that satisfy the constraints. A molecule that
    moves or turns so far in one step that the analytical solution does not exist ends
    the run with ``Result.SETTLE_FAILED`` (code 23).

    Args:
        molecules: ``(w, 3)`` integer atom indices of each molecule, oxygen first, the two
            hydrogens of equal mass.
        d_oh: The O-H distance; an array leaf.
        d_hh: The H-H distance; an array leaf.
        thermostat: ``None`` (NVE), :class:`Bussi` or :class:`NoseHooverChain`.
    """

    def __init__(self, molecules: ArrayLike, d_oh: float, d_hh: float,
                 thermostat: Integrator | None = None) -> None:
        self.molecules = jnp.asarray(molecules)
        self.d_oh, self.d_hh = d_oh, d_hh
        self.thermostat = thermostat
        mol = self.molecules
        if mol.ndim != 2 or mol.shape[1] != 3 or not jnp.issubdtype(mol.dtype, jnp.integer):
            raise ValueError(f"Settle: molecules must be a (w, 3) integer array (O, H, H), "
                             f"got shape {mol.shape} and dtype {mol.dtype}")
        if not isinstance(mol, jax.core.Tracer):
            flat = np.asarray(mol).ravel()
            if len(np.unique(flat)) != len(flat) or (flat.size and flat.min() < 0):
                raise ValueError("Settle: molecules must hold distinct, non-negative atom "
                                 "indices (an atom in two molecules cannot be settled)")
        for name, d in (("d_oh", d_oh), ("d_hh", d_hh)):
            if not isinstance(d, jax.core.Tracer) and not float(d) > 0:
                raise ValueError(f"Settle: {name} must be positive, got {d!r}")
        if not isinstance(d_oh, jax.core.Tracer) and not isinstance(d_hh, jax.core.Tracer):
            if not float(d_hh) < 2.0 * float(d_oh):
                raise ValueError(f"Settle: d_hh={d_hh!r} must be shorter than 2 d_oh="
                                 f"{2 * float(d_oh)!r} (a triangle)")
        if thermostat is not None and not hasattr(thermostat, "thermostat"):
            raise TypeError(f"Settle: thermostat must be Bussi or NoseHooverChain (a velocity "
                            f"scaling with a `thermostat` method), got {thermostat!r}")

    @property
    def stochastic(self):
        return bool(self.thermostat is not None and self.thermostat.stochastic)

    def tree_flatten(self):
        return (self.molecules, self.d_oh, self.d_hh, self.thermostat), None

    @classmethod
    def tree_unflatten(cls, _, children):
        out = object.__new__(cls)
        out.molecules, out.d_oh, out.d_hh, out.thermostat = children
        return out

    def __repr__(self):
        return (f"Settle({self.molecules.shape[0]} molecules, d_oh={self.d_oh!r}, "
                f"d_hh={self.d_hh!r}, thermostat={self.thermostat!r})")

    def dof(self, positions) -> int:
        """Degrees of freedom: ``thermostat.dof`` if given, else :math:`d(n-1) - 3w`."""
        if self.thermostat is not None and self.thermostat.dof is not None:
            return int(self.thermostat.dof)
        n, d = positions.shape
        return d * (n - 1) - 3 * self.molecules.shape[0]

    def constrain_velocities(self, positions, velocities, masses, space=None):
        """``velocities`` with each molecule's motion along its constraints removed
        (:func:`settle_velocities`): a start state for :func:`simulate` from, say,
        :func:`maxwell_boltzmann` velocities. ``space`` is needed for a periodic box
        (molecules split across it)."""
        from ._space import free
        return _settle_velocities_jit(space or free(), jnp.asarray(positions),
                                      jnp.asarray(velocities), self.molecules,
                                      jnp.asarray(masses))

    def init(self, model, carry: Carry, masses, params):
        own = (None if self.thermostat is None
               else self.thermostat.init(model, carry, masses, params))
        return SettleState(own, jnp.array(True))

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        th, own = self.thermostat, carry.extra.thermostat
        nf = self.dof(carry.positions)
        half = 0.5 * dt
        v = carry.velocities
        keys = (None, None)
        if th is not None:
            if th.stochastic:
                keys = jax.random.split(jax.random.fold_in(key, carry.step))
            v, own = th.thermostat(own, v, masses, nf, half, keys[0])
        inv_m = inverse_mass(masses, v)
        space = model.space
        x0 = carry.positions
        v = v + half * carry.forces * inv_m
        x1 = x0 + dt * v                                    # unwrapped until settled
        x, ok = settle_positions(space, x0, x1, self.molecules, masses, self.d_oh, self.d_hh)
        v = v + (x - x1) / dt
        x = space.wrap(x)
        nbrs = carry.neighbors.update(x) if carry.neighbors is not None else None
        e, f = model.energy_and_forces(x, params, nbrs)
        v = v + half * f * inv_m
        v = settle_velocities(space, x, v, self.molecules, masses)
        if th is not None:
            v, own = th.thermostat(own, v, masses, nf, half, keys[1])
        state = SettleState(own, carry.extra.solved & jnp.all(ok))
        return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                              neighbors=nbrs, step=carry.step + 1, extra=state)

    def observe(self, carry: Carry, masses) -> dict:
        total = carry.potential_energy + kinetic(carry.velocities, masses)
        if self.thermostat is None:
            return dict(conserved=total)
        nf = self.dof(carry.positions)
        return dict(conserved=total + self.thermostat.extended_energy(
            carry.extra.thermostat, nf, carry.velocities.dtype))

    def check(self, carry: Carry) -> jax.Array:
        return jnp.where(carry.extra.solved, jnp.int32(0), jnp.int32(Result.SETTLE_FAILED))
