"""The output of a particle run: :class:`Trajectory`, and its assembly from saved frames.

A run saves, every ``save_every`` steps, a record ``(positions, velocities, potential
energy, kinetic energy, the integrator's observations)``; :func:`assemble` puts the start
in front of the records and the final carry, the failure record and the counters behind.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _summary
from ._dynamics import State, kinetic
from ._neighbors import NeighborList


class Trajectory(NamedTuple):
    """Saved frames of a particle simulation.

    Attributes:
        times: ``(n_frames,)`` times ``t = step * dt`` of the frames (frame 0 is the start).
        positions: ``(n_frames, n, d)`` positions (wrapped into a periodic box).
        velocities: ``(n_frames, n, d)``.
        potential_energy: ``(n_frames,)``.
        kinetic_energy: ``(n_frames,)``.
        final: The :class:`State` after the last step.
        neighbors: The neighbour list after the last step (``None`` without one).
        result: A :class:`~simlib.Result` code (0 on success).
        stats: ``n_steps``, ``n_builds`` (builds of the neighbour list since it was
            allocated, this call included), ``n_reallocations`` (in this call),
            ``failed_step`` (the step of the first failure, -1 if none) and
            ``failed_atom`` (the atom a non-finite or unstable failure names, -1 if none).
        extras: The integrator's per-frame records, a dict of ``(n_frames, ...)`` arrays:
            always ``conserved`` (:attr:`conserved`); ``box`` for a barostat.
    """

    times: jax.Array
    positions: jax.Array
    velocities: jax.Array
    potential_energy: jax.Array
    kinetic_energy: jax.Array
    final: State
    neighbors: NeighborList | None
    result: jax.Array
    stats: dict
    extras: dict | None = None

    @property
    def total_energy(self) -> jax.Array:
        return self.potential_energy + self.kinetic_energy

    @property
    def conserved(self) -> jax.Array:
        """``(n_frames,)`` the integrator's conserved quantity: the total energy for
        :class:`NVE`, the extended energy for :class:`NoseHooverChain`, the effective
        energy (total energy plus the heat the thermostat took out) for :class:`Bussi`
        and :class:`StochasticCellRescaling`; for :class:`Langevin` the total energy,
        which it does not conserve."""
        return self.extras["conserved"]

    @property
    def box(self) -> jax.Array | None:
        """``(n_frames, d)`` box side lengths under a barostat (``None`` otherwise)."""
        return (self.extras or {}).get("box")

    status, status_counts = _summary.status_properties("Trajectory")

    def __repr__(self) -> str:
        fields = _summary.result_fields(self.result)
        x = self.positions
        if np.ndim(x) >= 3:
            n_frames, n, d = np.shape(x)[-3:]
            when = _summary.span(self.times) or "=" + _summary.no_values(self.times)
            fields.append(("frames", f"{n_frames} of {n} atoms in {d}D, t{when}"))
        for name in ("positions", "velocities"):
            fields.append((name, _summary.shape(getattr(self, name))))
        fields.append(("energy", energy_summary(self.potential_energy, self.kinetic_energy)))
        if self.neighbors is not None:
            fields.append(("neighbors", repr(self.neighbors)))
        stats = self.stats if isinstance(self.stats, dict) else {}
        fields.append(("stats", _summary.stats(stats, order=(
            "n_steps", "n_builds", "n_reallocations", "failed_step", "failed_atom"))))
        return _summary.block("Trajectory", fields)


def energy_summary(potential, kinetic_energy) -> str:
    """``E(0)=-512.3, max |E/E(0) - 1|=1.2e-05`` over the frames (ranges when batched)."""
    pe, ke = _summary.concrete(potential), _summary.concrete(kinetic_energy)
    if pe is None or ke is None or pe.size == 0:
        return _summary.no_values(potential) if pe is None or ke is None else "no frames"
    e = pe + ke
    e0 = e[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        drift = np.max(np.abs(e - e0[..., None]), axis=-1) / np.abs(e0)
    return f"E(0)={_summary.value(e0)}, max |E/E(0) - 1|={_summary.value(drift)}"


def assemble(integrator, carry0, records, carry, masses, dt, save_every, code, failure, builds,
              reallocations):
    x, v, e, k, extras = records
    x = jnp.concatenate([carry0.positions[None], x])
    v = jnp.concatenate([carry0.velocities[None], v])
    e = jnp.concatenate([carry0.potential_energy[None], e])
    k = jnp.concatenate([kinetic(carry0.velocities, masses)[None], k])
    extras = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]),
                                    integrator.observe(carry0, masses), extras)
    times = jnp.arange(x.shape[0], dtype=x.dtype) * (save_every * dt)
    stats = dict(n_steps=carry.step, n_builds=builds, n_reallocations=reallocations,
                 failed_step=failure.step, failed_atom=failure.atom)
    return Trajectory(times, x, v, e, k, State(carry.positions, carry.velocities, masses),
                      carry.neighbors, code, stats, extras)


def builds(nbrs) -> jax.Array:
    """The builds of the list since it was allocated (0 without a list)."""
    return np.int32(0) if nbrs is None else nbrs.n_builds


def concatenate(pieces: list) -> tuple:
    """The records of consecutive chunks, joined along the frame axis."""
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *pieces)


def empty_records(integrator, carry, masses) -> tuple:
    """Records of no frames, shaped like a run's from ``carry`` (a run of 0 steps)."""
    x = carry.positions
    extras = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None][:0],
                                    integrator.observe(carry, masses))
    return (x[None][:0], carry.velocities[None][:0], carry.potential_energy[None][:0],
            kinetic(carry.velocities, masses)[None][:0], extras)
