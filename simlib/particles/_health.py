"""Health checks of a particle run: the failure a step, or the start, is reported with.

Every step of :func:`simulate` is checked here (a few O(n) reductions): a non-finite state,
an atom moving further in one step than the run can resolve, a neighbour-list overflow or
missed pairs, the integrator's own check; and the start for a bad traced box or atoms far
outside the box. The first failure of a run sticks (:func:`merge`), with its step and atom
(:class:`Failure`). A loop of one's own can call :func:`status` the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._errors import Result
from ._dynamics import Carry, kinetic
from ._space import check_run_box


class Failure(NamedTuple):
    """Where a run first failed: the step (-1 if none) and the atom named (-1 if none)."""

    step: jax.Array
    atom: jax.Array


def move_limit(model, neighbors, dtype):
    """The longest move an atom may make in one step before the run counts as blown up.

    Half the shortest side of a periodic box (beyond it the minimum image, the list's
    rebuild test and the wrapped trajectory can no longer tell where the atom went), the
    neighbour list's skin (the margin the list was sized with) and the energy's cutoff (a
    step through the whole interaction range is not resolved); ``inf`` when none applies.
    A healthy Lennard-Jones run at ``dt = 0.005`` moves atoms ~0.01 sigma per step.
    """
    limit = jnp.asarray(jnp.inf, dtype)
    if neighbors is not None and neighbors.skin > 0:
        limit = jnp.minimum(limit, neighbors.skin)
    r_cut = getattr(model.energy, "r_cut", None)
    if r_cut is not None:
        limit = jnp.minimum(limit, r_cut)
    if model.space.periodic:
        box = lax.stop_gradient(jnp.asarray(model.space.box, dtype))
        limit = jnp.minimum(limit, 0.5 * jnp.min(box))
    return limit


def status(carry: Carry, masses, dt, limit):
    """The failure code of ``carry`` and the atom it names (cheap: O(n) reductions).

    At one step, the first that applies: non-finite positions or velocities
    (``NONFINITE_STATE``); an atom whose speed carries it further than ``limit`` in one step
    (``UNSTABLE_DYNAMICS``); a neighbour-list overflow, then missed pairs; a non-finite
    potential or kinetic energy (``NONFINITE_STATE``). The atom named is the first with a
    non-finite position or velocity, for a non-finite state; the fastest otherwise.
    """
    x = lax.stop_gradient(carry.positions)
    v = lax.stop_gradient(carry.velocities)
    energies = jnp.isfinite(lax.stop_gradient(carry.potential_energy)) & jnp.isfinite(
        kinetic(v, lax.stop_gradient(masses)))
    finite_atoms = jnp.all(jnp.isfinite(x), axis=-1) & jnp.all(jnp.isfinite(v), axis=-1)
    return classify(jnp.sum(v * v, axis=-1), finite_atoms, energies, carry.neighbors,
                    lax.stop_gradient(dt), limit)


def classify(v2, finite_atoms, energies, neighbors, dt, limit, atom_ids=None, n=None):
    """:func:`status`'s code and atom from its per-atom reductions: squared speeds ``v2``
    and whether each position and velocity is finite, ``(m,)`` each, and whether the
    energies are finite. Entry ``i`` is atom ``i``, or with ``atom_ids`` atom
    ``atom_ids[i]`` (entries naming ``n``, empty slots, are finite and still)."""
    m = v2.shape[0]
    if atom_ids is None:
        atom_ids = jnp.arange(m, dtype=jnp.int32)
        n = m
    atom = atom_ids[jnp.argmax(v2)].astype(jnp.int32) if m else jnp.int32(-1)
    fastest = jnp.max(v2, initial=0.0) if m else jnp.zeros((), v2.dtype)
    code = jnp.where(energies, jnp.int32(Result.SUCCESSFUL), jnp.int32(Result.NONFINITE_STATE))
    if neighbors is not None:
        # An overflow drops pairs, so it explains missed pairs and takes precedence.
        code = jnp.where(neighbors.missed_pairs > 0, Result.NEIGHBOR_LIST_MISSED_PAIRS, code)
        code = jnp.where(neighbors.overflow, Result.NEIGHBOR_LIST_OVERFLOW, code)
    too_far = fastest * (dt * dt) > limit * limit           # nan compares False: see below
    code = jnp.where(too_far, Result.UNSTABLE_DYNAMICS, code)
    finite = jnp.all(finite_atoms)
    code = jnp.where(finite, code, Result.NONFINITE_STATE)
    if m:   # the first non-finite atom (argmax of v2 would name any nan-speed atom)
        first_bad = jnp.min(jnp.where(finite_atoms, n, atom_ids)).astype(jnp.int32)
        atom = jnp.where(finite, atom, first_bad)
    named = (code == Result.UNSTABLE_DYNAMICS) | (code == Result.NONFINITE_STATE)
    return code.astype(jnp.int32), jnp.where(named, atom, -1)


def escaped(space, positions):
    """``UNSTABLE_DYNAMICS`` and the first atom where a starting position lies so far outside
    the periodic box that wrapping it loses its place there (an error over L/1024 from
    the float resolution, eps |x| > L / 1024); ``NONFINITE_STATE`` for a non-finite one."""
    x = lax.stop_gradient(jnp.asarray(positions))
    n = x.shape[0]
    if n == 0:
        return jnp.int32(0), jnp.int32(-1)
    bad_x = ~jnp.all(jnp.isfinite(x), axis=-1)
    code = jnp.where(jnp.any(bad_x), Result.NONFINITE_STATE, Result.SUCCESSFUL)
    atom = jnp.where(jnp.any(bad_x), jnp.argmax(bad_x), -1)
    if space.periodic:
        box = lax.stop_gradient(space.box_vector(x.shape[1], x.dtype))
        far = jnp.any(jnp.abs(x) * jnp.finfo(x.dtype).eps > box / 1024, axis=-1) & ~bad_x
        first = jnp.argmax(far)
        code = jnp.where((code == 0) & jnp.any(far), Result.UNSTABLE_DYNAMICS, code)
        atom = jnp.where((atom < 0) & jnp.any(far), first, atom)
    return code.astype(jnp.int32), atom.astype(jnp.int32)


def merge(first, then):
    """The first failure of two ``(code, Failure)``, ``first`` coming earlier in time."""
    code0, fail0 = first
    code1, fail1 = then
    keep = code0 != 0
    return (jnp.where(keep, code0, code1),
            Failure(jnp.where(keep, fail0.step, fail1.step),
                     jnp.where(keep, fail0.atom, fail1.atom)))


def checked_status(integrator, c, masses, dt, limit):
    """:func:`status`, then the integrator's own check (a box collapse) where that passes."""
    code, atom = status(c, masses, dt, limit)
    own = integrator.check(c)
    use_own = (code == 0) & (own != 0)
    return jnp.where(use_own, own, code), jnp.where(use_own, -1, atom)


def initial(model, positions, neighbors):
    """The start's own failure, at step 0: a traced box that :func:`check_box` refuses
    (``BOX_TOO_SMALL``, ``INVALID_BOX``; it makes every later test meaningless, so it comes
    first), a non-finite position, or one far outside the box."""
    code, atom = escaped(model.space, positions)
    box = check_run_box(model.energy, model.space, neighbors, jnp.shape(positions)[1],
                        "simulate")
    if box is not None:
        code = jnp.where(box != 0, box, code)
        atom = jnp.where(box != 0, -1, atom)
    return code, Failure(jnp.where(code != 0, 0, -1).astype(jnp.int32), atom)

def initial_checks(model, integrator, carry0, positions, masses, dt):
    """The start's failure: its own (:func:`initial`), then the first carry's."""
    limit = move_limit(model, carry0.neighbors, carry0.positions.dtype)
    code, atom = checked_status(integrator, carry0, masses, dt, limit)
    return merge(initial(model, positions, carry0.neighbors),
                  (code, Failure(jnp.where(code != 0, 0, -1).astype(jnp.int32), atom)))
