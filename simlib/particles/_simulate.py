"""``simulate()``: particle dynamics as a scan over saved frames, run in chunks.

The loop is the same shape as the ODE driver's fixed-step scan: an outer ``lax.scan`` over
saved frames of an inner ``lax.scan`` over ``save_every`` steps. Called eagerly, the frames
are run in chunks; between chunks the host updates the progress bar and checks the
neighbour list, and a chunk whose list overflowed is re-run from its start with a larger
list, so the trajectory is the one a large enough list gives. Under ``jit``/``grad`` it is
one scan, and an overflow raises (``throw=True``) or is reported in ``result``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _summary
from .._adjoint import (
    AbstractAdjoint,
    Checkpointed,
    Direct,
    reject_time_gradients,
    reversible_loop,
)
from .._auto import AUTOMATIC
from .._errors import Result, SolverError, check_in_graph, raise_on_failure
from .._util import inside_trace, split_inexact
from ..progress import bar as progress_bar
from . import _checkpoint
from ._cells import CellList
from ._dynamics import NVE, Carry, Integrator, State
from ._energy import as_energy
from ._neighbors import NeighborList, reallocate
from ._space import Space, box_checked_upstream, check_run_box


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

    @property
    def status(self) -> Result:
        """``result`` as a :class:`~simlib.Result` member (eager, unbatched trajectories)."""
        return _summary.single_status(self.result, "Trajectory")

    @property
    def status_counts(self) -> dict:
        """``{Result: number of members}`` of a batched (``vmap``) trajectory, or of one."""
        return _summary.counts_or_raise(self.result, "Trajectory")

    def __repr__(self) -> str:
        fields = []
        batch = np.shape(self.result)
        if batch:
            fields.append(("batch", batch))
        fields.append(("result", _summary.status(self.result)))
        x = self.positions
        if np.ndim(x) >= 3:
            n_frames, n, d = np.shape(x)[-3:]
            when = _summary.span(self.times) or "=" + _summary.no_values(self.times)
            fields.append(("frames", f"{n_frames} of {n} atoms in {d}D, t{when}"))
        for name in ("positions", "velocities"):
            fields.append((name, _summary.shape(getattr(self, name))))
        fields.append(("energy", _energy_summary(self.potential_energy, self.kinetic_energy)))
        if self.neighbors is not None:
            fields.append(("neighbors", repr(self.neighbors)))
        stats = self.stats if isinstance(self.stats, dict) else {}
        fields.append(("stats", _summary.stats(stats, order=(
            "n_steps", "n_builds", "n_reallocations", "failed_step", "failed_atom"))))
        return _summary.block("Trajectory", fields)


def _energy_summary(potential, kinetic) -> str:
    """``E(0)=-512.3, max |E/E(0) - 1|=1.2e-05`` over the frames (ranges when batched)."""
    pe, ke = _summary.concrete(potential), _summary.concrete(kinetic)
    if pe is None or ke is None or pe.size == 0:
        return _summary.no_values(potential) if pe is None or ke is None else "no frames"
    e = pe + ke
    e0 = e[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        drift = np.max(np.abs(e - e0[..., None]), axis=-1) / np.abs(e0)
    return f"E(0)={_summary.value(e0)}, max |E/E(0) - 1|={_summary.value(drift)}"


@jax.tree_util.register_pytree_node_class
class _Model:
    """The energy, with the space in which positions move (a pytree)."""

    def __init__(self, energy, space):
        self.energy = energy
        self.space = space

    def tree_flatten(self):
        return (self.energy, self.space), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)

    def energy_and_forces(self, x, params, nbrs):
        # the box is checked once, at the start (check_run_box in _initial), reported as a Result
        with box_checked_upstream():
            return self.energy.energy_and_forces(x, params, nbrs)


def _kinetic(v, masses):
    m = jnp.asarray(masses, v.dtype)
    m = m[:, None] if m.ndim == 1 else m
    return 0.5 * jnp.sum(m * v * v)


class _Failure(NamedTuple):
    """Where a run first failed: the step (-1 if none) and the atom named (-1 if none)."""

    step: jax.Array
    atom: jax.Array


def _move_limit(model, neighbors, dtype):
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


def _status(carry: Carry, masses, dt, limit):
    """The failure code of ``carry`` and the atom it names (cheap: O(n) reductions).

    At one step, the first that applies: non-finite positions or velocities
    (``NONFINITE_STATE``); an atom whose speed carries it further than ``limit`` in one step
    (``UNSTABLE_DYNAMICS``); a neighbour-list overflow, then missed pairs; a non-finite
    potential or kinetic energy (``NONFINITE_STATE``). The atom named is the first with a
    non-finite position or velocity, for a non-finite state; the fastest otherwise.
    """
    x = lax.stop_gradient(carry.positions)
    v = lax.stop_gradient(carry.velocities)
    v2 = jnp.sum(v * v, axis=-1)
    atom = jnp.argmax(v2).astype(jnp.int32) if v2.size else jnp.int32(-1)
    fastest = jnp.max(v2, initial=0.0) if v2.size else jnp.zeros((), v.dtype)
    energies = jnp.isfinite(lax.stop_gradient(carry.potential_energy)) & jnp.isfinite(
        _kinetic(v, lax.stop_gradient(masses)))
    code = jnp.where(energies, jnp.int32(Result.SUCCESSFUL), jnp.int32(Result.NONFINITE_STATE))
    if carry.neighbors is not None:
        # An overflow drops pairs, so it explains missed pairs and takes precedence.
        code = jnp.where(carry.neighbors.missed_pairs > 0, Result.NEIGHBOR_LIST_MISSED_PAIRS,
                         code)
        code = jnp.where(carry.neighbors.overflow, Result.NEIGHBOR_LIST_OVERFLOW, code)
    dt = lax.stop_gradient(dt)
    too_far = fastest * (dt * dt) > limit * limit           # nan compares False: see below
    code = jnp.where(too_far, Result.UNSTABLE_DYNAMICS, code)
    finite_atoms = jnp.all(jnp.isfinite(x), axis=-1) & jnp.all(jnp.isfinite(v), axis=-1)
    finite = jnp.all(finite_atoms)
    code = jnp.where(finite, code, Result.NONFINITE_STATE)
    if v2.size:   # the first non-finite atom (argmax of v2 would name any nan-speed atom)
        atom = jnp.where(finite, atom, jnp.argmin(finite_atoms).astype(jnp.int32))
    named = (code == Result.UNSTABLE_DYNAMICS) | (code == Result.NONFINITE_STATE)
    return code, jnp.where(named, atom, -1)


def _escaped(space, positions):
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


def _merge(first, then):
    """The first failure of two ``(code, _Failure)``, ``first`` coming earlier in time."""
    code0, fail0 = first
    code1, fail1 = then
    keep = code0 != 0
    return (jnp.where(keep, code0, code1),
            _Failure(jnp.where(keep, fail0.step, fail1.step),
                     jnp.where(keep, fail0.atom, fail1.atom)))


def _checked_status(integrator, c, masses, dt, limit):
    """:func:`_status`, then the integrator's own check (a box collapse) where that passes."""
    code, atom = _status(c, masses, dt, limit)
    own = integrator.check(c)
    use_own = (code == 0) & (own != 0)
    return jnp.where(use_own, own, code), jnp.where(use_own, -1, atom)


def _frames(model, integrator, carry, masses, params, dt, key, n_frames, save_every, adjoint,
            backwards=None):
    """Run ``n_frames * save_every`` steps; return ``(carry, code, _Failure)`` and the
    per-frame records. Every step is checked (:func:`_status`); the first failure sticks.
    ``backwards(init, n_frames)``: the same run with a backward pass that integrates
    backwards, for ``adjoint=Reversible()`` (its :meth:`~simlib.AbstractAdjoint.scan`)."""
    step = integrator.step
    outer, inner = adjoint.nested(n_frames, save_every)
    limit = _move_limit(model, carry.neighbors, carry.positions.dtype)

    def checked(c):
        new, atom = _checked_status(integrator, c, masses, dt, limit)
        return new, _Failure(jnp.where(new != 0, c.step, -1), atom)

    def one_step(state, _):
        c, code, failure = state
        c = step(model, c, masses, params, dt, key)
        code, failure = _merge((code, failure), checked(c))
        return (c, code, failure), None

    def one_frame(state, _):
        state, _ = inner.scan(one_step, state, save_every)
        c = state[0]
        record = (c.positions, c.velocities, c.potential_energy, _kinetic(c.velocities, masses),
                  integrator.observe(c, masses))
        return state, record

    init = (carry, *checked(carry))
    return outer.scan(one_frame, init, n_frames, backwards=backwards)


_frames_jit = jax.jit(_frames, static_argnums=(7, 8, 9))


def _start(model, state: State, params, neighbors, integrator=None):
    x = model.space.wrap(jnp.asarray(state.positions))
    nbrs = neighbors.update(x) if neighbors is not None else None
    e, f = model.energy_and_forces(x, params, nbrs)
    step = jnp.zeros((), jnp.int32)
    carry = Carry(x, jnp.asarray(state.velocities, x.dtype), f, e, nbrs, step)
    if integrator is not None:
        carry = carry._replace(extra=integrator.init(model, carry, state.masses, params))
    return carry


def _begin(model, integrator, state: State, params, neighbors, masses, dt):
    """The first carry (one force evaluation) and the start's failure, in one call."""
    carry0 = _start(model, state, params, neighbors, integrator)
    code, failure = _initial_checks(model, integrator, carry0, state.positions, masses, dt)
    return carry0, code, failure


_begin_jit = jax.jit(_begin)


def _default_key():
    """``jax.random.key(0)``, made once per PRNG implementation (keys are immutable)."""
    impl = jax.config.jax_default_prng_impl
    key = _DEFAULT_KEYS.get(impl)
    if key is None:
        key = _DEFAULT_KEYS[impl] = jax.random.key(0)
    return key


_DEFAULT_KEYS: dict = {}


class _Shape(NamedTuple):
    shape: tuple
    ndim: int


def _shape_only(a) -> _Shape:
    """The shape of an array or nested sequence, without converting it (an eager
    ``jnp.asarray`` costs tens of microseconds per call, which short calls notice)."""
    shape = tuple(np.shape(a))
    return _Shape(shape, len(shape))


def _check_args(energy, state, space, dt, n_steps, integrator, save_every, neighbors, key,
                adjoint):
    if not isinstance(state, State):
        if isinstance(state, tuple) and len(state) == 3:
            state = State(*state)
        else:
            raise TypeError(f"simulate: state must be State(positions, velocities, masses), "
                            f"got {type(state).__name__}")
    x = _shape_only(state.positions)
    v = _shape_only(state.velocities)
    if x.ndim != 2:
        raise ValueError(f"simulate: state.positions must have shape (n, d), got {x.shape}")
    if x.shape[0] == 0:
        raise ValueError(f"simulate: state.positions has no particles (shape {x.shape})")
    if v.shape != x.shape:
        raise ValueError(f"simulate: state.velocities has shape {v.shape}, but positions have "
                         f"shape {x.shape}")
    m = _shape_only(state.masses)
    if m.ndim > 1 or (m.ndim == 1 and m.shape[0] != x.shape[0]):
        raise ValueError(f"simulate: state.masses must be a scalar or have shape "
                         f"({x.shape[0]},), got {m.shape}")
    if not isinstance(space, Space):
        raise TypeError(f"simulate: space must be free() or periodic(box), got {space!r}")
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
        raise ValueError(f"simulate: n_steps must be a non-negative integer, got {n_steps!r}")
    if save_every is None:
        save_every = max(1, int(n_steps))
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) \
            or save_every < 1:
        raise ValueError(f"simulate: save_every must be a positive integer, got {save_every!r}")
    if n_steps % save_every:
        raise ValueError(f"simulate: n_steps={n_steps} must be a multiple of "
                         f"save_every={save_every}")
    if not isinstance(integrator, Integrator):
        raise TypeError(f"simulate: integrator must be NVE() or Langevin(kT, gamma), got "
                        f"{integrator!r}")
    if integrator.stochastic and key is None:
        raise ValueError(f"simulate: {type(integrator).__name__} is stochastic and needs an "
                         f"explicit key=jax.random.key(...)")
    if neighbors is not None and not isinstance(neighbors, (NeighborList, CellList)):
        raise TypeError(f"simulate: neighbors must come from neighbor_list(...) or "
                        f"cell_list(...), got {type(neighbors).__name__}")
    n_listed = (neighbors.n_particles if isinstance(neighbors, CellList)
                else None if neighbors is None else neighbors.idx.shape[0])
    if neighbors is not None and n_listed != x.shape[0]:
        raise ValueError(f"simulate: the neighbour list is for {n_listed} "
                         f"particles, state has {x.shape[0]}")
    if neighbors is not None and getattr(energy, "r_cut", None) is None:
        raise ValueError("simulate: a neighbour list was given but the energy has no r_cut")
    check_run_box(energy, space, neighbors, x.shape[1], "simulate")  # eager part
    if not np.isscalar(dt) and jnp.ndim(dt) != 0:
        raise ValueError(f"simulate: dt must be a scalar, got shape {jnp.shape(dt)}")
    if adjoint is not None and not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(f"simulate: adjoint must be simlib.Direct(), simlib.Checkpointed(), "
                        f"simlib.Reversible(), simlib.ForwardMode() or None (default), "
                        f"got {adjoint!r}")
    if adjoint is not None:
        adjoint.check(integrator, where="simulate")
    return state, int(n_steps), int(save_every)


def simulate(energy, state: State, params, *, space: Space, dt, n_steps: int,
             integrator: Integrator | None = None, save_every: int | None = None,
             neighbors: NeighborList | None = None, key=None, throw: bool = True,
             progress: bool = False, adjoint: AbstractAdjoint | None = None,
             chunk_steps: int = 2000, checkpoint: str | os.PathLike | None = None,
             checkpoint_every: int = 1, resume: bool = False,
             checkpoint_metadata: dict | None = None) -> Trajectory:
    """Integrate particle dynamics for ``n_steps`` steps of size ``dt``.

    Args:
        energy: ``energy(positions, params, neighbors=None)``, from :func:`pair_energy` (the
            direct force path is used) or any function (forces by ``jax.grad``).
        state: :class:`State` ``(positions, velocities, masses)``.
        params: The energy's parameters (a dict of arrays); differentiable.
        space: Where positions move (wrapping in a periodic box).
        dt: Step size (an array leaf: new values do not recompile).
        n_steps: Number of steps (a multiple of ``save_every``).
        integrator: :class:`NVE` (default) or :class:`Langevin`.
        save_every: Steps between saved frames; by default only the start and the end.
        neighbors: A :func:`neighbor_list`; kept up to date and reallocated on overflow.
        key: PRNG key, required by stochastic integrators. The noise of step ``k`` is drawn
            from ``fold_in(key, k)`` with ``k`` counted from 0 in every call, so continue a
            run from ``traj.final`` with a new key (``jax.random.split``), not the same one.
        throw: Raise :class:`~simlib.SolverError` on failure (see Failures below); with
            ``False`` the code is in ``result`` and the step and atom in ``stats``.
        progress: Show a progress bar (eager calls; ``simlib.progress``: tqdm on a
            terminal, a plain line every few seconds otherwise).
        adjoint: ``None`` (default: forward mode for at most 8 differentiated input
            components, such as a potential's parameters, else ``Checkpointed()``;
            docs/gradients.md), ``Checkpointed(steps_per_segment)`` (the state stored every
            ``steps_per_segment`` steps, ``ceil(sqrt(n_steps))`` by default, and each
            segment recomputed in reverse mode), ``Direct()`` (stores every step's
            residuals) or ``Reversible()`` (NVE only: the backward pass integrates
            backwards, memory independent of the steps).
        chunk_steps: Steps per compiled chunk in eager calls (rounded to frames).

    Returns:
        A :class:`Trajectory` with ``n_steps // save_every + 1`` frames.

    Failures:
        Every step is checked (a few O(n) reductions, no measurable cost), and the first
        failure is reported with its step ``k`` and time ``k dt``: raised as a
        :class:`~simlib.SolverError` (eagerly with the partial trajectory in
        ``err.solution`` and the atom in the message), or with ``throw=False`` as
        ``traj.result`` with ``traj.stats["failed_step"]`` and ``["failed_atom"]``.

        * ``Result.UNSTABLE_DYNAMICS``, a blown-up run: some atom's speed carries it further
          in one step than the move limit, ``max_i |v_i| dt > min(L/2, skin, r_cut)``
          (half the shortest side of a periodic box, the neighbour list's skin, the
          energy's cutoff; whichever apply), or an atom starts so far outside a periodic
          box that wrapping loses its place in it (``eps |x| > L / 1024``). Typical causes:
          overlapping atoms at the start, or a ``dt`` too large. The atom named is the
          fastest one (the farthest outside the box, at the start).
        * ``Result.NONFINITE_STATE``: positions, velocities, or the potential or kinetic
          energy (in the state's dtype) are not finite; the atom named is the first one with
          a non-finite position or velocity.
        * ``Result.NEIGHBOR_LIST_OVERFLOW`` / ``NEIGHBOR_LIST_MISSED_PAIRS``: see
          :func:`neighbor_list` (eager calls reallocate and re-run instead).
        * ``Result.BOX_TOO_SMALL`` / ``INVALID_BOX``, at step 0, for a traced box (under
          ``jit``, ``vmap``, ``grad``) that the eager check would refuse with a
          ``ValueError``: a side below twice the energy's ``r_cut`` (or the neighbour
          list's ``r_cut + skin``), or one that is not positive and finite.

        At the same step, a non-finite state comes first, then a blow-up, then the list's
        codes: a list that overflows at the step an atom flew off did so because of it.

    Checkpoints (eager calls; docs/files.md): with ``checkpoint=PATH`` everything the run
    carries (the state, forces, neighbour list, step counter, the frames so far, the
    failure record) is written to ``PATH`` (``.npz``) every ``checkpoint_every`` chunks of
    ``chunk_steps`` steps and at the end, atomically (a temporary file in the same
    directory, then a rename). Ctrl-C (SIGINT) or SIGTERM lets the running chunk finish,
    writes the checkpoint and raises ``KeyboardInterrupt`` (SIGINT)
    or ends the process by SIGTERM. ``resume=True`` continues from ``PATH`` with the same
    arguments (checked: steps, ``dt``, shapes, integrator, key, parameters, start state)
    to a trajectory bit-identical to an uninterrupted run. ``checkpoint_metadata``, a dict
    of JSON values, is stored with it and checked on resume like the arguments: what the
    run depends on but this call cannot see (how the start state was made: an
    equilibration's seed and settings). :func:`checkpoint_info` reads it back, and the
    run's progress, without running: a program can check a checkpoint before redoing the
    work that leads up to the resumed call.

    Example:
        >>> import jax
        >>> from simlib import particles as sp
        >>> x, box = sp.lattice(4, 0.8442)
        >>> space = sp.periodic(box)
        >>> energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
        >>> nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
        >>> v = sp.maxwell_boltzmann(1.0, 1.44, key=jax.random.key(0), n=len(x))
        >>> traj = sp.simulate(energy, sp.State(x, v, 1.0), dict(sigma=1.0, epsilon=1.0),
        ...                    space=space, dt=0.005, n_steps=100, save_every=10,
        ...                    neighbors=nbrs)
        >>> len(traj.times), int(traj.result)
        (11, 0)
    """
    integrator = NVE() if integrator is None else integrator
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) \
            or checkpoint_every < 1:
        raise ValueError(f"simulate: checkpoint_every must be a positive integer, got "
                         f"{checkpoint_every!r}")
    if resume and checkpoint is None:
        raise ValueError("simulate: resume=True needs checkpoint=PATH (the file to resume from)")
    if checkpoint_metadata is not None and checkpoint is None:
        raise ValueError("simulate: checkpoint_metadata needs checkpoint=PATH (it is stored "
                         "in the checkpoint)")
    if resume and not os.path.exists(checkpoint):
        raise FileNotFoundError(f"simulate: resume=True but there is no checkpoint at "
                                f"{checkpoint}")
    state, n_steps, save_every = _check_args(energy, state, space, dt, n_steps, integrator,
                                             save_every, neighbors, key, adjoint)
    adjoint = AUTOMATIC if adjoint is None else adjoint
    model = _Model(as_energy(energy), space)
    n_frames = n_steps // save_every
    masses = state.masses if isinstance(state.masses, jax.Array) else jnp.asarray(state.masses)
    dt = jnp.asarray(dt, jnp.result_type(state.positions))
    traced = inside_trace() or any(
        isinstance(leaf, jax.core.Tracer)
        for leaf in jax.tree_util.tree_leaves((state, params, dt, neighbors, integrator,
                                               space, model.energy)))
    if key is None:      # a cached key in eager calls (a traced one must not be kept)
        key = jax.random.key(0) if traced else _default_key()
    if traced:
        if checkpoint is not None:
            raise ValueError("simulate: checkpoint= works in eager calls only (not under jit, "
                             "vmap or grad)")
        return _simulate_traced(model, integrator, state, masses, params, dt, key, n_frames,
                                save_every, neighbors, adjoint, throw)
    ckpt = None
    if checkpoint is not None:
        signature = _signature(model, integrator, state, masses, params, dt, key, n_frames,
                               save_every, neighbors, chunk_steps)
        if checkpoint_metadata is not None:
            signature["metadata"] = _checkpoint.as_metadata(checkpoint_metadata)
        ckpt = _checkpoint.Checkpoint(checkpoint, int(checkpoint_every), resume, signature)
    return _simulate_chunked(model, integrator, state, masses, params, dt, key, n_frames,
                             save_every, neighbors, adjoint, throw, progress, chunk_steps,
                             ckpt)


def _assemble(integrator, carry0, records, carry, masses, dt, save_every, code, failure, builds,
              reallocations):
    x, v, e, k, extras = records
    x = jnp.concatenate([carry0.positions[None], x])
    v = jnp.concatenate([carry0.velocities[None], v])
    e = jnp.concatenate([carry0.potential_energy[None], e])
    k = jnp.concatenate([_kinetic(carry0.velocities, masses)[None], k])
    extras = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]),
                                    integrator.observe(carry0, masses), extras)
    times = jnp.arange(x.shape[0], dtype=x.dtype) * (save_every * dt)
    stats = dict(n_steps=carry.step, n_builds=builds, n_reallocations=reallocations,
                 failed_step=failure.step, failed_atom=failure.atom)
    return Trajectory(times, x, v, e, k, State(carry.positions, carry.velocities, masses),
                      carry.neighbors, code, stats, extras)


def _builds(nbrs):
    return np.int32(0) if nbrs is None else nbrs.n_builds


def _simulate_traced(model, integrator, state, masses, params, dt, key, n_frames, save_every,
                     neighbors, adjoint, throw):
    """The run as one traced scan, differentiated as ``adjoint`` builds it
    (:meth:`~simlib.AbstractAdjoint.wrap`, then ``nested``/``scan`` in :func:`_frames`)."""
    x0, v0 = jnp.asarray(state.positions), jnp.asarray(state.velocities)
    adjoint = adjoint.with_closures(
        lambda: _closes_over_tracers(model, x0, params, neighbors), Checkpointed())

    def core(tree, strategy):
        (x0, v0, masses, params), (model, integrator, neighbors, dt), key = tree
        return _run_traced(model, integrator, State(x0, v0, masses), masses, params, dt,
                           key, n_frames, save_every, neighbors, strategy)

    traj = adjoint.wrap(core, ((x0, v0, masses, params), (model, integrator, neighbors, dt), key),
                        jvp_able=True, reverse=Checkpointed(), where="simulate")
    if throw:
        failure = _Failure(traj.stats["failed_step"], traj.stats["failed_atom"])
        t_fail = failure.step.astype(dt.dtype) * dt
        traj = check_in_graph(traj, traj.result, t_fail, failure.step,
                              n_frames * save_every * dt, n_frames * save_every,
                              caller="simulate")
    return traj


def _closes_over_tracers(model, x0, params, neighbors) -> bool:
    """Whether the energy closes over traced values (one trace of a force evaluation)."""
    _, consts = jax.closure_convert(
        lambda x, p, n: model.energy_and_forces(x, p, n), x0, params, neighbors)
    return any(isinstance(c, jax.core.Tracer) for c in consts)


def _run_traced(model, integrator, state, masses, params, dt, key, n_frames, save_every,
                neighbors, adjoint):
    carry0 = _start(model, state, params, neighbors, integrator)
    (carry, code, failure), records = _frames(
        model, integrator, carry0, masses, params, dt, key, n_frames, save_every, adjoint,
        backwards=lambda init, n: _reversible(model, integrator, dt, key, save_every,
                                              init[0], n, masses, params))
    code, failure = _merge(_initial(model, state.positions, neighbors), (code, failure))
    return _assemble(integrator, carry0, records, carry, masses, dt, save_every, code, failure,
                     _builds(carry.neighbors), jnp.int32(0))


def _initial(model, positions, neighbors):
    """The start's own failure, at step 0: a traced box that :func:`check_box` refuses
    (``BOX_TOO_SMALL``, ``INVALID_BOX``; it makes every later test meaningless, so it comes
    first), a non-finite position, or one far outside the box."""
    code, atom = _escaped(model.space, positions)
    box = check_run_box(model.energy, model.space, neighbors, jnp.shape(positions)[1],
                        "simulate")
    if box is not None:
        code = jnp.where(box != 0, box, code)
        atom = jnp.where(box != 0, -1, atom)
    return code, _Failure(jnp.where(code != 0, 0, -1).astype(jnp.int32), atom)


def _signature(model, integrator, state, masses, params, dt, key, n_frames, save_every,
               neighbors, chunk_steps) -> dict:
    """What a checkpoint must agree on with the call that resumes it."""
    x = np.asarray(state.positions)
    key_data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) \
        else key
    return dict(
        n_steps=n_frames * save_every, save_every=save_every, chunk_steps=int(chunk_steps),
        dt=float(dt), shape=list(x.shape), dtype=str(x.dtype),
        integrator=type(integrator).__name__, energy=type(model.energy).__name__,
        neighbor_list=neighbors is not None,
        integrator_parameters=_checkpoint.digest(integrator), key=_checkpoint.digest(key_data),
        params=_checkpoint.digest(params), space=_checkpoint.digest(model.space),
        start_state=_checkpoint.digest((state.positions, state.velocities, masses)))


def _simulate_chunked(model, integrator, state, masses, params, dt, key, n_frames, save_every,
                      neighbors, adjoint, throw, progress, chunk_steps, ckpt=None):
    reallocations = 0
    carry0, code, failure = _begin_jit(model, integrator, state, params, neighbors, masses, dt)
    while neighbors is not None and bool(carry0.neighbors.overflow):
        # The list given (or its update at the start) is too small: reallocate first.
        neighbors = reallocate(carry0.neighbors, carry0.positions)
        reallocations += 1
        carry0, code, failure = _begin_jit(model, integrator, state, params, neighbors, masses, dt)
    frames_per_chunk = max(1, int(chunk_steps) // save_every)
    carry, done, pieces = carry0, 0, []
    code, failed_at, failed_atom = map(int, jax.device_get((code, failure.step, failure.atom)))
    if ckpt is not None and ckpt.resume:
        carry, done, pieces, code, failed_at, failed_atom, reallocations = ckpt.load(
            carry0, _empty_records(integrator, carry0, masses))
    bar = _progress_bar(progress, n_frames * save_every)
    if bar is not None and done:
        bar.update(done * save_every)
    n_chunks = 0

    def save():
        ckpt.write(carry, pieces, done, code, failed_at, failed_atom, reallocations)

    with _checkpoint.stop_on_signals(ckpt is not None) as stop:
        try:
            while done < n_frames and code == 0:
                k = min(frames_per_chunk, n_frames - done)
                (new, new_code, new_failure), records = _frames_jit(
                    model, integrator, carry, masses, params, dt, key, k, save_every, adjoint)
                new_code = int(new_code)
                if new_code == Result.NEIGHBOR_LIST_OVERFLOW:
                    # Re-run this chunk from its start with a list sized from what overflowed.
                    bigger = reallocate(_sizing_list(new.neighbors, records), carry.positions)
                    bigger = bigger.replace(n_builds=carry.neighbors.n_builds + 1)
                    carry = carry._replace(neighbors=bigger)
                    reallocations += 1
                    continue
                carry, done, pieces = new, done + k, pieces + [records]
                if new_code:
                    code = new_code
                    failed_at, failed_atom = int(new_failure.step), int(new_failure.atom)
                if bar is not None:
                    bar.update(k * save_every)
                n_chunks += 1
                if ckpt is not None and (stop.signum or n_chunks % ckpt.every == 0):
                    save()
                if stop.signum:
                    stop.exit(f"simulate: stopped by {stop.name} after step "
                              f"{done * save_every} of {n_frames * save_every}; the "
                              f"checkpoint {ckpt.path} holds the run so far (resume=True "
                              f"continues it)")
        except KeyboardInterrupt:
            if ckpt is not None and not stop.signum:  # a second Ctrl-C, mid-chunk
                save()
            raise
        finally:
            if bar is not None:
                bar.close()
    if ckpt is not None and (n_chunks % ckpt.every or n_chunks == 0):
        save()  # the end (unless the last chunk's checkpoint is already the end)
    if pieces:
        records = _concatenate(pieces) if len(pieces) > 1 else pieces[0]
    else:
        records = _empty_records(integrator, carry0, masses)
    failure = _Failure(np.int32(failed_at), np.int32(failed_atom))
    traj = _assemble_jit(integrator, carry0, records, carry, masses, dt, save_every, np.int32(code),
                         failure, _builds(carry.neighbors), np.int32(reallocations))
    if code and throw:
        try:
            raise_on_failure(code, float(failed_at * dt), failed_at,
                             float(n_frames * save_every * dt), n_frames * save_every,
                             caller="simulate")
        except SolverError as err:
            err.solution = traj
            if failed_atom >= 0:
                err.args = (f"{err.args[0]} [atom {failed_atom}]",)
            raise
    return traj


def _sizing_list(nbrs, records):
    """The list whose box sizes a reallocation: under a barostat (frames with a ``box``) the
    smallest box of the chunk, less 5% for the steps between frames (cells sized for it fit
    every larger box), but at least twice the list's reach; else ``nbrs`` itself."""
    boxes = records[4].get("box") if isinstance(records[4], dict) else None
    if boxes is None or not isinstance(nbrs, NeighborList):
        return nbrs
    b = np.asarray(boxes)
    b = b[np.all(np.isfinite(b), axis=1)]
    if not len(b):
        return nbrs
    smallest = np.maximum(0.95 * b.min(axis=0), 2.0 * (nbrs.r_cut + nbrs.skin))
    like = jnp.asarray(nbrs.space.box)
    box = smallest.min() if like.ndim == 0 else smallest
    return nbrs.replace(space=Space(jnp.asarray(box, like.dtype), True))


def _initial_checks(model, integrator, carry0, positions, masses, dt):
    """The start's failure: its own (:func:`_initial`), then the first carry's."""
    limit = _move_limit(model, carry0.neighbors, carry0.positions.dtype)
    code, atom = _checked_status(integrator, carry0, masses, dt, limit)
    return _merge(_initial(model, positions, carry0.neighbors),
                  (code, _Failure(jnp.where(code != 0, 0, -1).astype(jnp.int32), atom)))


_assemble_jit = jax.jit(_assemble, static_argnums=6)


@jax.jit
def _concatenate(pieces):
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *pieces)


def _empty_records(integrator, carry, masses):
    x = carry.positions
    extras = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None][:0],
                                    integrator.observe(carry, masses))
    return (x[None][:0], carry.velocities[None][:0], carry.potential_energy[None][:0],
            _kinetic(carry.velocities, masses)[None][:0], extras)


def _progress_bar(progress, total):
    return progress_bar(progress, total, "simulate", "step") if progress else None


def _reversible(model, integrator, dt, key, save_every, carry0, n_frames, masses, params):
    """:func:`_frames` from ``carry0`` with a backward pass that integrates backwards
    (``Reversible``; :func:`~simlib._adjoint.reversible_loop`).

    Velocity Verlet with ``-dt`` undoes a step exactly in exact arithmetic, so the backward
    pass re-creates each state from the next one instead of storing it, and applies the
    step's VJP there: memory independent of the number of steps. The carry's forces are
    part of the differentiated state, so each backward step costs one force evaluation to
    go back and one force VJP. Round-off in the reconstruction grows with the steps, and
    exponentially on chaotic systems (a liquid): compare with ``Checkpointed`` when in doubt.
    """
    dt = lax.stop_gradient(reject_time_gradients(dt, "Reversible"))
    # The model's floating-point leaves (the box) are explicit inputs of the custom VJP,
    # so box gradients flow (a backward pass closing over them would leak tracers of an
    # enclosing grad); so is the rest of the start (the list, the step count).
    model_floats, model_others, merge_model = split_inexact(model)
    masses = jnp.asarray(masses)
    d0, merge0 = _split_carry(carry0)

    def forward(d0, p, rest):
        m, params, mf = p
        out, records = _frames(merge_model(mf, model_others), integrator, merge0(d0, rest), m,
                               params, dt, key, n_frames, save_every, Direct())
        return (out, records), out[0]

    def step(c, p, _):
        m, params, mf = p
        return integrator.step(merge_model(mf, model_others), c, m, params, dt, key)

    def unstep(c, p, _):
        m, params, mf = p
        prev = integrator.step(merge_model(mf, model_others), c, m, params, -dt, key)
        return prev._replace(step=c.step - 1)

    def unpack(cotangent):
        (ct_final, _, _), (ct_x, ct_v, ct_e, ct_k, ct_extras) = cotangent
        # NVE's conserved quantity is K + U: its cotangent joins theirs.
        ct_e, ct_k = ct_e + ct_extras["conserved"], ct_k + ct_extras["conserved"]
        return _split_carry(ct_final)[0], (ct_x, ct_v, ct_e, ct_k), None

    def inject_frame(c, g, g_params, cts, p):
        cx, cv, ce, ck = cts
        v = c.velocities
        m_col = p[0][:, None] if jnp.ndim(p[0]) == 1 else p[0]
        g = (g[0] + cx, g[1] + cv + ck * m_col * v, g[2], g[3] + ce)
        m_bar, p_bar, mf_bar = g_params
        m_bar = (m_bar + _kinetic_mass_grad(v, p[0], ck)).astype(m_bar.dtype)
        return g, (m_bar, p_bar, mf_bar)

    rest0 = (carry0.neighbors, carry0.step, carry0.extra)
    return reversible_loop(
        forward, step, unstep, lambda c: (_split_carry(c)[0],
                                          lambda d: merge0(d, (c.neighbors, c.step, c.extra))),
        d0, (masses, params, model_floats), rest0, blocks=lambda _: None, n_blocks=n_frames,
        n_inner=save_every, plan=lambda *_: None, unpack=unpack, inject_block=inject_frame)


def _split_carry(c):
    """The differentiated part of a carry (positions, velocities, forces, energy) and
    ``merge(d, (neighbors, step, extra))``, a carry from those parts."""
    def merge(d, rest):
        return Carry(*d, *rest)
    return (c.positions, c.velocities, c.forces, c.potential_energy), merge


def _kinetic_mass_grad(v, masses, ck):
    """d/dm of ``ck * K`` with ``K = sum_i m_i |v_i|^2 / 2``, shaped like ``masses``."""
    per_particle = 0.5 * jnp.sum(v * v, axis=-1) * ck
    return per_particle if jnp.ndim(masses) == 1 else jnp.sum(per_particle)
