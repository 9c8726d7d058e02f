"""The eager run of :func:`simulate`: compiled chunks of frames, with the host in between.

Called eagerly, a run's frames are computed in chunks of about ``chunk_steps`` steps, each
one call of the compiled step loop (:func:`._loop.frames`). Between chunks the host does
what a compiled loop cannot, each in its own function below:

* neighbour-list reallocation (:func:`advance`, :func:`grown_list`): a chunk whose list
  overflowed is re-run from its start with a larger list, so the trajectory is the one a
  large enough list gives; a list too small at the start is grown before the first step
  (:func:`start_run`);
* progress (:func:`progress_bar`);
* checkpoints (:meth:`Run.write`, :func:`run_chunks`): written every ``checkpoint_every``
  chunks, at the end, and when SIGINT/SIGTERM asks the run to stop;
* the failure, raised with the frames so far (:func:`raise_failure`).

The same parts serve a loop of one's own: ``nbrs.overflow`` after a compiled chunk, then
:func:`reallocate` and the chunk again (docs/particles.md, "Your own loop").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._adjoint import AbstractAdjoint
from .._errors import Result, SolverError, raise_on_failure
from ..progress import bar
from . import _checkpoint
from ._dynamics import Carry, Integrator, State
from ._health import Failure
from ._model import Model
from ._neighbors import NeighborList, reallocate
from ._space import Space
from ._trajectory import Trajectory, builds, empty_records


class Compiled(NamedTuple):
    """The compiled pieces an eager run calls (:func:`simulate` hands over its own)."""

    begin: Callable       # _loop.begin
    frames: Callable      # _loop.frames, static (n_frames, save_every, adjoint)
    assemble: Callable    # _trajectory.assemble, static save_every
    concatenate: Callable  # _trajectory.concatenate


@dataclass(frozen=True)
class Job:
    """What stays fixed through an eager run, and the compiled calls that advance it."""

    model: Model
    integrator: Integrator
    masses: jax.Array
    params: Any
    dt: jax.Array
    key: jax.Array
    save_every: int
    adjoint: AbstractAdjoint
    compiled: Compiled

    def begin(self, state: State, neighbors) -> tuple[Carry, jax.Array, Failure]:
        return self.compiled.begin(self.model, self.integrator, state, self.params, neighbors,
                                   self.masses, self.dt)

    def frames(self, carry: Carry, n_frames: int) -> tuple:
        return self.compiled.frames(self.model, self.integrator, carry, self.masses,
                                    self.params, self.dt, self.key, n_frames, self.save_every,
                                    self.adjoint)


@dataclass
class Run:
    """An eager run so far, as a checkpoint holds it (``done`` counts frames; the failure
    is ``code`` at step ``failed_at`` naming atom ``failed_atom``, -1 where none)."""

    carry: Carry
    done: int = 0
    pieces: list = field(default_factory=list)
    code: int = 0
    failed_at: int = -1
    failed_atom: int = -1
    reallocations: int = 0
    n_chunks: int = 0          # chunks run by this call (not in the checkpoint)

    def write(self, ckpt: _checkpoint.Checkpoint) -> None:
        ckpt.write(self.carry, self.pieces, self.done, self.code, self.failed_at,
                   self.failed_atom, self.reallocations)


def run_chunked(job: Job, state: State, neighbors, n_frames: int, *, throw: bool,
                progress: bool, chunk_steps: int,
                ckpt: _checkpoint.Checkpoint | None = None) -> Trajectory:
    """The whole eager run: start (or resume), the chunks, the trajectory."""
    carry0, run = start_run(job, state, neighbors)
    if ckpt is not None and ckpt.resume:
        run = Run(*ckpt.load(carry0, empty_records(job.integrator, carry0, job.masses)))
    frames_per_chunk = max(1, int(chunk_steps) // job.save_every)
    progress_shown = progress_bar(progress, n_frames * job.save_every, run.done * job.save_every)
    run_chunks(job, run, n_frames, frames_per_chunk, progress_shown, ckpt)
    return finish(job, carry0, run, n_frames, throw)


def start_run(job: Job, state: State, neighbors) -> tuple[Carry, Run]:
    """The first carry and the start's failure; a list that overflows at the start (the one
    given, or its update there) is reallocated before any step."""
    reallocations = 0
    carry0, code, failure = job.begin(state, neighbors)
    while neighbors is not None and bool(carry0.neighbors.overflow):
        neighbors = reallocate(carry0.neighbors, carry0.positions)
        reallocations += 1
        carry0, code, failure = job.begin(state, neighbors)
    code, failed_at, failed_atom = map(int, jax.device_get((code, failure.step, failure.atom)))
    return carry0, Run(carry0, 0, [], code, failed_at, failed_atom, reallocations)


def run_chunks(job: Job, run: Run, n_frames: int, frames_per_chunk: int, progress_shown,
               ckpt: _checkpoint.Checkpoint | None) -> None:
    """Advance ``run`` chunk by chunk to ``n_frames`` frames or its first failure, moving
    the progress bar and writing the checkpoint as chunks end; SIGINT/SIGTERM (with a
    checkpoint) stop the run between chunks, after the checkpoint is written."""
    with _checkpoint.stop_on_signals(ckpt is not None) as stop:
        try:
            while run.done < n_frames and run.code == 0:
                k = min(frames_per_chunk, n_frames - run.done)
                if not advance(job, run, k):
                    continue                  # the list overflowed: the chunk again
                if progress_shown is not None:
                    progress_shown.update(k * job.save_every)
                run.n_chunks += 1
                if ckpt is not None and (stop.signum or run.n_chunks % ckpt.every == 0):
                    run.write(ckpt)
                if stop.signum:
                    stop.exit(f"simulate: stopped by {stop.name} after step "
                              f"{run.done * job.save_every} of {n_frames * job.save_every}; "
                              f"the checkpoint {ckpt.path} holds the run so far "
                              f"(resume=True continues it)")
        except KeyboardInterrupt:
            if ckpt is not None and not stop.signum:  # a second Ctrl-C, mid-chunk
                run.write(ckpt)
            raise
        finally:
            if progress_shown is not None:
                progress_shown.close()
    if ckpt is not None and (run.n_chunks % ckpt.every or run.n_chunks == 0):
        run.write(ckpt)  # the end (unless the last chunk's checkpoint is already the end)


def advance(job: Job, run: Run, k: int) -> bool:
    """Run ``k`` frames from ``run.carry``. ``False`` if the list overflowed: ``run`` stays
    at the chunk's start with a larger list (:func:`grown_list`), to run it again."""
    (new, code, failure), records = job.frames(run.carry, k)
    code = int(code)
    if code == Result.NEIGHBOR_LIST_OVERFLOW:
        run.carry = run.carry._replace(neighbors=grown_list(run.carry, new.neighbors, records))
        run.reallocations += 1
        return False
    run.carry, run.done, run.pieces = new, run.done + k, run.pieces + [records]
    if code:
        run.code, run.failed_at, run.failed_atom = code, int(failure.step), int(failure.atom)
    return True


def grown_list(carry: Carry, overflowed, records) -> NeighborList:
    """The list to re-run a chunk with: sized from the one that overflowed in it
    (:func:`reallocate`, in the box :func:`sizing_list` picks), built at the chunk's start
    and counting on from the start's builds."""
    bigger = reallocate(sizing_list(overflowed, records), carry.positions)
    return bigger.replace(n_builds=carry.neighbors.n_builds + 1)


def sizing_list(nbrs, records):
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


def progress_bar(progress: bool, total: int, done: int):
    """The run's progress bar (``simlib.progress``), moved to ``done`` steps (a resumed
    run); ``None`` without ``progress``."""
    if not progress:
        return None
    shown = bar(progress, total, "simulate", "step")
    if done:
        shown.update(done)
    return shown


def finish(job: Job, carry0: Carry, run: Run, n_frames: int, throw: bool) -> Trajectory:
    """The trajectory of ``run``; its failure raised (``throw``) with the frames so far."""
    pieces = run.pieces
    if pieces:
        records = job.compiled.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    else:
        records = empty_records(job.integrator, carry0, job.masses)
    failure = Failure(np.int32(run.failed_at), np.int32(run.failed_atom))
    traj = job.compiled.assemble(job.integrator, carry0, records, run.carry, job.masses,
                                 job.dt, job.save_every, np.int32(run.code), failure,
                                 builds(run.carry.neighbors), np.int32(run.reallocations))
    if run.code and throw:
        raise_failure(traj, run, job.dt, n_frames * job.save_every)
    return traj


def raise_failure(traj: Trajectory, run: Run, dt: jax.Array, n_steps: int) -> None:
    """The run's failure as a :class:`~simlib.SolverError` naming the step, the time and
    the atom, with the trajectory so far in ``err.solution``."""
    try:
        raise_on_failure(run.code, float(run.failed_at * dt), run.failed_at,
                         float(n_steps * dt), n_steps, caller="simulate")
    except SolverError as err:
        err.solution = traj
        if run.failed_atom >= 0:
            err.args = (f"{err.args[0]} [atom {run.failed_atom}]",)
        raise
