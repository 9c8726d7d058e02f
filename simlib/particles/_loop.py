"""The step loop of a particle run: a scan over saved frames of a scan over steps.

Built from the parts a loop of one's own uses too: :meth:`Integrator.start` (the first
carry, jax-md's ``init_fn``), :meth:`Integrator.step` (one step, its ``apply_fn``) and the
health checks of :mod:`._health` after every step. :func:`frames` is the whole traced loop
of :func:`simulate`, and its eager driver runs it chunk by chunk (:mod:`._chunked`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._adjoint import AbstractAdjoint, Steps
from ._dynamics import Carry, Integrator, State, kinetic
from ._health import Failure, checked_status, initial_checks, merge, move_limit
from ._model import Model


def start(model: Model, state: State, params, neighbors, integrator: Integrator) -> Carry:
    """The first carry of a run: :meth:`Integrator.start`."""
    return integrator.start(model, state, params, neighbors)


def frames(model: Model, integrator: Integrator, carry: Carry, masses, params, dt, key,
           n_frames: int, save_every: int, adjoint: AbstractAdjoint,
           steps: Steps | None = None):
    """Run ``n_frames * save_every`` steps; return ``(carry, code, Failure)`` and the
    per-frame records. Every step is checked (:func:`status`); the first failure sticks.
    ``steps``: the same run described by its step and that step's inverse, for a strategy
    that runs the steps its own way (:meth:`~simlib.AbstractAdjoint.scan`)."""
    step = integrator.step
    outer, inner = adjoint.nested(n_frames, save_every)
    limit = move_limit(model, carry.neighbors, carry.positions.dtype)

    def checked(c):
        new, atom = checked_status(integrator, c, masses, dt, limit)
        return new, Failure(jnp.where(new != 0, c.step, -1), atom)

    def one_step(state, _):
        c, code, failure = state
        c = step(model, c, masses, params, dt, key)
        code, failure = merge((code, failure), checked(c))
        return (c, code, failure), None

    def one_frame(state, _):
        state, _ = inner.scan(one_step, state, save_every)
        c = state[0]
        record = (c.positions, c.velocities, c.potential_energy, kinetic(c.velocities, masses),
                  integrator.observe(c, masses))
        return state, record

    init = (carry, *checked(carry))
    return outer.scan(one_frame, init, n_frames, steps=steps)


def begin(model: Model, integrator: Integrator, state: State, params, neighbors, masses,
          dt) -> tuple[Carry, jax.Array, Failure]:
    """The first carry (one force evaluation) and the start's failure, in one call."""
    carry0 = start(model, state, params, neighbors, integrator)
    code, failure = initial_checks(model, integrator, carry0, state.positions, masses, dt)
    return carry0, code, failure
