"""``simulate()``: the convenient driver over a particle integrator's ``start``/``step``.

The parts, each usable from a loop of one's own (docs/particles.md, "Your own loop"):
:class:`Model` (the energy and the space), :meth:`Integrator.start` and
:meth:`Integrator.step` (jax-md's ``init_fn``/``apply_fn``), the neighbour list's
``update``/``overflow`` and :func:`reallocate`. Here they are assembled into a run:

* ``_loop``: the step loop, an outer scan over saved frames of an inner scan over
  ``save_every`` steps (the ODE driver's fixed-step shape), every step checked
  (``_health``);
* ``_chunked``: called eagerly, the frames run in compiled chunks, and between them the
  host reallocates an overflowing neighbour list (re-running the chunk), moves the
  progress bar and writes checkpoints (``_checkpoint``);
* under ``jit``/``grad`` (this module, the adjoint's part): one scan, differentiated as the
  adjoint builds it; an overflow raises (``throw=True``) or is reported in ``result``;
* ``_trajectory``: the frames assembled into a :class:`Trajectory`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._adjoint import AbstractAdjoint, Checkpointed, Direct, StepLoop, Steps
from .._auto import AUTOMATIC
from .._errors import check_in_graph
from .._util import inside_trace, is_tracer, split_inexact
from . import _checkpoint, _chunked, _layout
from ._cells import CellList, pair_search
from ._dynamics import NVE, Carry, Integrator, State
from ._energy import Energy
from ._health import Failure as _Failure
from ._health import initial as _initial
from ._health import merge as _merge
from ._health import status as _status  # noqa: F401 - tests read it here
from ._loop import begin, frames
from ._loop import frames as _frames
from ._loop import start as _start
from ._model import Model
from ._neighbors import NeighborList
from ._space import Space, check_run_box
from ._trajectory import Trajectory, assemble, concatenate
from ._trajectory import assemble as _assemble
from ._trajectory import builds as _builds

# The traced path at the end of this module (_simulate_traced, _run_traced, FrameSteps) is
# the adjoint's part; it reads the loop's pieces under the private names imported above.

# The compiled pieces of an eager run (read at each call: tests wrap them).
_frames_jit = jax.jit(frames, static_argnums=(7, 8, 9))
_layout_frames_jit = jax.jit(_layout.frames, static_argnums=(7, 8, 9))
_begin_jit = jax.jit(begin)
_assemble_jit = jax.jit(assemble, static_argnums=6)
_concatenate = jax.jit(concatenate)


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
    ``jnp.asarray`` costs enough per call for short calls to notice)."""
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



def simulate(energy: Energy | Callable[..., jax.Array], state: State, params: Any, *,
             space: Space, dt: float | jax.Array, n_steps: int,
             integrator: Integrator | None = None, save_every: int | None = None,
             neighbors: NeighborList | CellList | str | None = None,
             key: jax.Array | None = None, throw: bool = True,
             progress: bool = False, adjoint: AbstractAdjoint | None = None,
             chunk_steps: int = 2000, checkpoint: str | os.PathLike | None = None,
             checkpoint_every: int = 1, resume: bool = False,
             checkpoint_metadata: dict | None = None) -> Trajectory:
    """Integrate particle dynamics for ``n_steps`` steps of size ``dt``.

    The driver over ``integrator.start``/``integrator.step`` (:class:`Integrator`, on a
    :class:`Model`) that adds per-step checks, chunks, neighbour-list reallocation,
    progress and checkpoints; docs/particles.md ("Your own loop") drives the same parts
    from a loop of one's own.

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
        neighbors: A :func:`neighbor_list` or :func:`cell_list`; kept up to date and
            reallocated on overflow. ``"auto"``: the one that suits the backend, built here
            from ``state.positions`` by :func:`pair_search` (the native neighbour-list
            kernels on the CPU, cells on an accelerator where the box holds 3 cells a side).
            On a TPU, an NVE run with one mass over cells (``"auto"`` or
            ``cell_list(kernel="pallas")``) and plain Lennard-Jones keeps its state in the
            Pallas cell kernel's layout between sorts of the cells (docs/particles.md,
            "Accelerators").
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
    if isinstance(neighbors, str):
        neighbors = _auto_neighbors(energy, state, space, neighbors)
    _checkpoint.check_arguments(checkpoint, checkpoint_every, resume, checkpoint_metadata)
    state, n_steps, save_every = _check_args(energy, state, space, dt, n_steps, integrator,
                                             save_every, neighbors, key, adjoint)
    adjoint = AUTOMATIC if adjoint is None else adjoint
    model = Model(energy, space, box_checked=True)   # the box: check_run_box, at the start
    n_frames = n_steps // save_every
    masses = state.masses if isinstance(state.masses, jax.Array) else jnp.asarray(state.masses)
    dt = jnp.asarray(dt, jnp.result_type(state.positions))
    traced = _traced(state, params, dt, neighbors, integrator, model)
    if key is None:      # a cached key in eager calls (a traced one must not be kept)
        key = jax.random.key(0) if traced else _default_key()
    if traced:
        if checkpoint is not None:
            raise ValueError("simulate: checkpoint= works in eager calls only (not under jit, "
                             "vmap or grad)")
        return _simulate_traced(model, integrator, state, masses, params, dt, key, n_frames,
                                save_every, neighbors, adjoint, throw)
    ckpt = None if checkpoint is None else _checkpoint.Checkpoint(
        checkpoint, int(checkpoint_every), resume, _checkpoint.signature(
            model, integrator, state, masses, params, dt, key, n_frames, save_every,
            neighbors, chunk_steps, checkpoint_metadata))
    in_cells = _layout.applies(model, integrator, state.positions, masses, params, neighbors)
    compiled = _chunked.Compiled(_begin_jit, _layout_frames_jit if in_cells else _frames_jit,
                                 _assemble_jit, _concatenate)
    job = _chunked.Job(model, integrator, masses, params, dt, key, save_every, adjoint, compiled)
    return _chunked.run_chunked(job, state, neighbors, n_frames, throw=throw, progress=progress,
                                chunk_steps=chunk_steps, ckpt=ckpt)


def _auto_neighbors(energy, state: State, space: Space, neighbors: str):
    """``neighbors="auto"``: :func:`pair_search` at the energy's cutoff, from the positions."""
    if neighbors != "auto":
        raise ValueError(f"simulate: neighbors must come from neighbor_list(...) or "
                         f"cell_list(...), or be 'auto' or None, got {neighbors!r}")
    r_cut = getattr(energy, "r_cut", None)
    if r_cut is None:
        raise ValueError("simulate: neighbors='auto' needs an energy with an r_cut "
                         "(pair_energy(..., r_cut=...))")
    positions = getattr(state, "positions", None)
    if positions is None or is_tracer(positions):
        raise TypeError("simulate: neighbors='auto' builds the pair structure from concrete "
                        "positions; inside jit pass neighbor_list(...) or cell_list(...)")
    return pair_search(space, positions, r_cut)


def _traced(state: State, params, dt, neighbors, integrator: Integrator, model: Model) -> bool:
    """Whether ``simulate`` runs under a transformation (one traced scan, no chunks)."""
    return inside_trace() or any(
        isinstance(leaf, jax.core.Tracer)
        for leaf in jax.tree_util.tree_leaves((state, params, dt, neighbors, integrator,
                                               model.space, model.energy)))


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
        steps=FrameSteps(model, integrator, adjoint.times(dt), key, save_every, masses, params))
    code, failure = _merge(_initial(model, state.positions, neighbors), (code, failure))
    return _assemble(integrator, carry0, records, carry, masses, dt, save_every, code, failure,
                     _builds(carry.neighbors), jnp.int32(0))


class FrameSteps(Steps):
    """The particle run's frames as :class:`~simlib._adjoint.Steps`: ``save_every`` steps
    of the integrator per frame, ``n_frames`` frames, from the carry ``(Carry, code,
    failure)`` of :func:`_frames`; the differentiated state is the carry's positions,
    velocities, forces and energy (:func:`_split_carry`), the parameters ``(masses,
    params, model)``.

    Velocity Verlet with ``-dt`` undoes a step exactly in exact arithmetic (:meth:`unstep`).
    The carry's forces are part of the differentiated state, so a step back costs one
    force evaluation. Each frame's records (positions, velocities, energies) get their
    cotangents at the frame's end (``inject_block``). ``dt`` is a constant of the loop.
    """

    def __init__(self, model: Model, integrator: Integrator, dt, key, save_every: int,
                 masses, params):
        self.model, self.integrator, self.dt, self.key = model, integrator, dt, key
        self.save_every, self.masses, self.params = save_every, masses, params

    def step(self, z: Carry, params: tuple, x: Any) -> Carry:
        """One integrator step of ``dt``; ``params`` is ``(masses, params, model)``."""
        m, p, model = params
        return self.integrator.step(model, z, m, p, self.dt, self.key)

    def unstep(self, z1: Carry, params: tuple, x: Any) -> Carry:
        """The integrator step with ``-dt``, the step count put back."""
        m, p, model = params
        prev = self.integrator.step(model, z1, m, p, -self.dt, self.key)
        return prev._replace(step=z1.step - 1)

    def loop(self, carry0: tuple, n_iter: int) -> StepLoop:
        integrator, key, save_every, n_frames = self.integrator, self.key, self.save_every, n_iter
        dt = lax.stop_gradient(self.dt)
        this = FrameSteps(self.model, integrator, dt, key, save_every, self.masses, self.params)
        carry0 = carry0[0]
        # The model's floating-point leaves (the box) are explicit inputs of the custom VJP,
        # so box gradients flow (a backward pass closing over them would leak tracers of an
        # enclosing grad); so is the rest of the start (the list, the step count).
        model_floats, model_others, merge_model = split_inexact(self.model)
        masses = jnp.asarray(self.masses)
        d0, merge0 = _split_carry(carry0)

        def full(p):  # (masses, params, model floats) -> (masses, params, model)
            return p[0], p[1], merge_model(p[2], model_others)

        def forward(d0, p, rest):
            m, params, model = full(p)
            out, records = _frames(model, integrator, merge0(d0, rest), m, params, dt, key,
                                   n_frames, save_every, Direct())
            return (out, records), out[0]

        rest0 = (carry0.neighbors, carry0.step, carry0.extra)
        return StepLoop(
            forward, lambda c, p, x: this.step(c, full(p), x),
            lambda c, p, x: this.unstep(c, full(p), x),
            lambda c: (_split_carry(c)[0], lambda d: merge0(d, (c.neighbors, c.step, c.extra))),
            d0, (masses, self.params, model_floats), rest0, blocks=lambda _: None,
            n_blocks=n_frames, n_inner=save_every, plan=lambda *_: None, unpack=_unpack_frames,
            finish=lambda out: out, inject_block=_inject_frame)


def _unpack_frames(cotangent):
    (ct_final, _, _), (ct_x, ct_v, ct_e, ct_k, ct_extras) = cotangent
    # NVE's conserved quantity is K + U: its cotangent joins theirs.
    ct_e, ct_k = ct_e + ct_extras["conserved"], ct_k + ct_extras["conserved"]
    return _split_carry(ct_final)[0], (ct_x, ct_v, ct_e, ct_k), None


def _inject_frame(c, g, g_params, cts, p):
    """A frame's records' cotangents added at its end (kinetic energy: through ``v`` and
    the masses)."""
    cx, cv, ce, ck = cts
    v = c.velocities
    m_col = p[0][:, None] if jnp.ndim(p[0]) == 1 else p[0]
    g = (g[0] + cx, g[1] + cv + ck * m_col * v, g[2], g[3] + ce)
    m_bar, p_bar, mf_bar = g_params
    m_bar = (m_bar + _kinetic_mass_grad(v, p[0], ck)).astype(m_bar.dtype)
    return g, (m_bar, p_bar, mf_bar)


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
