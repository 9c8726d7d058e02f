"""Checkpoints of :func:`simulate`: the chunked run's whole carry in one ``.npz`` file.

A checkpoint holds what the host loop needs to go on exactly where it stopped: the carry
(positions, velocities, forces, potential energy, the neighbour list with its counters,
the step counter), the frames saved so far, the failure record and the reallocation count.
The PRNG key does not change during a run (step ``k`` draws from ``fold_in(key, k)``), so
it is part of the signature that the resuming call must match, with ``n_steps``, ``dt``,
the shapes, the integrator and its parameters, the energy's parameters, the start state
and the caller's own ``checkpoint_metadata`` (how the start state was made, which
simulate cannot see). :func:`checkpoint_info` reads a checkpoint's header without running.
Files are written to a temporary file in the same directory, then renamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._files import atomic_write

FORMAT = "simlib-simulate-checkpoint-2"  # 2: frames hold the integrator records


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (truncated, corrupt) or does not fit the run."""


def digest(tree) -> str:
    """A SHA-256 of a pytree's leaves (their number, dtypes, shapes and bytes). Not of the
    structure's text, which may hold object addresses that change from run to run."""
    leaves = jax.tree_util.tree_leaves(tree)
    h = hashlib.sha256(str(len(leaves)).encode())
    for leaf in leaves:
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


def _nbr_static(nbrs) -> dict | None:
    if nbrs is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in nbrs._static().items()}


_OPAQUE = ("integrator_parameters", "key", "params", "space", "start_state")  # digests


def mismatch(old: dict, new: dict) -> str | None:
    """The first entry of the signature ``new`` that the checkpoint's ``old`` does not
    match, in words (``"its n_steps is 40, this call has 60"``); ``None`` if all match."""
    for name in [*new, *(["metadata"] if "metadata" in old else [])]:
        was, now = old.get(name), new.get(name)
        if was == now:
            continue
        if name == "metadata" and isinstance(was, dict) and isinstance(now, dict):
            for key in sorted({*was, *now}):
                if key not in was or key not in now or was[key] != now[key]:
                    return (f"its metadata[{key!r}] is {was.get(key, 'absent')!r}, this call "
                            f"has {now.get(key, 'absent')!r}")
        if name in _OPAQUE:
            return f"its {name} is different values from this call's"
        return f"its {name} is {was!r}, this call has {now!r}"
    return None


def as_metadata(metadata) -> dict:
    """``checkpoint_metadata`` as stored: a dict of JSON values (checked: a value that JSON
    cannot hold, or NaN, which never equals itself, is refused with a ``TypeError``)."""
    if not isinstance(metadata, dict):
        raise TypeError(f"simulate: checkpoint_metadata must be a dict of JSON values, got "
                        f"{type(metadata).__name__}")
    try:
        return json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise TypeError(f"simulate: checkpoint_metadata must hold JSON values (str, int, "
                        f"finite float, bool, None, lists, dicts): {err}") from None


def read_header(path) -> dict:
    """The header of the checkpoint at ``path``, read without its arrays.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CheckpointError: the file cannot be read (truncated, corrupt) or is not a
            :func:`simulate` checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            text = str(data["__checkpoint__"]) if "__checkpoint__" in data.files else None
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
        raise CheckpointError(f"the checkpoint {path} cannot be read (truncated or "
                              f"corrupt?): {type(err).__name__}: {err}") from None
    try:
        header = json.loads(text) if text is not None else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a simulate() checkpoint")
    return header


def checkpoint_info(path: str | os.PathLike) -> dict:
    """What the :func:`simulate` checkpoint at ``path`` holds, read without its arrays and
    without running anything: to check a checkpoint before the work that resumes it.

    Returns:
        A dict: ``n_steps`` (of the whole run), ``steps_done`` (so far), ``finished``
        (``steps_done == n_steps``, or the run failed), ``result`` (the run's
        :class:`~simlib.Result` code so far, 0 while it succeeds), ``metadata`` (the
        ``checkpoint_metadata`` it was written with, or ``None``), ``signature`` (every
        argument a resuming call must match: ``n_steps``, ``save_every``,
        ``chunk_steps``, ``dt``, ``shape``, ``dtype``, the integrator, digests of the
        parameters, key, space and start state, the metadata) and ``jax_version``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CheckpointError: the file cannot be read (truncated, corrupt) or is not a
            :func:`simulate` checkpoint.

    Example:
        >>> info = sp.checkpoint_info("out/lj.ckpt.npz")  # doctest: +SKIP
        >>> info["steps_done"], info["n_steps"], info["metadata"]  # doctest: +SKIP
        (2000, 4000, {'seed': 0})
    """
    header = read_header(path)
    signature = header["signature"]
    done = int(header["done"]) * int(signature["save_every"])
    code = int(header["code"])
    return dict(n_steps=int(signature["n_steps"]), steps_done=done,
                finished=done >= int(signature["n_steps"]) or code != 0, result=code,
                metadata=signature.get("metadata"), signature=signature,
                jax_version=header.get("jax_version"))


def check_arguments(checkpoint, checkpoint_every, resume: bool, metadata) -> None:
    """Refuse :func:`simulate`'s checkpoint arguments that do not fit together, before
    any work: ``checkpoint_every`` not a positive integer, ``resume`` or metadata without
    a path, ``resume`` with no file there."""
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) \
            or checkpoint_every < 1:
        raise ValueError(f"simulate: checkpoint_every must be a positive integer, got "
                         f"{checkpoint_every!r}")
    if resume and checkpoint is None:
        raise ValueError("simulate: resume=True needs checkpoint=PATH (the file to resume from)")
    if metadata is not None and checkpoint is None:
        raise ValueError("simulate: checkpoint_metadata needs checkpoint=PATH (it is stored "
                         "in the checkpoint)")
    if resume and not os.path.exists(checkpoint):
        raise FileNotFoundError(f"simulate: resume=True but there is no checkpoint at "
                                f"{checkpoint}")


def signature(model, integrator, state, masses, params, dt, key, n_frames: int,
              save_every: int, neighbors, chunk_steps: int, metadata=None) -> dict:
    """What a checkpoint must agree on with the call that resumes it (with the caller's
    ``metadata``, :func:`as_metadata`, where given)."""
    x = np.asarray(state.positions)
    key_data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) \
        else key
    signature = dict(
        n_steps=n_frames * save_every, save_every=save_every, chunk_steps=int(chunk_steps),
        dt=float(dt), shape=list(x.shape), dtype=str(x.dtype),
        integrator=type(integrator).__name__, energy=type(model.energy).__name__,
        neighbor_list=neighbors is not None,
        integrator_parameters=digest(integrator), key=digest(key_data),
        params=digest(params), space=digest(model.space),
        start_state=digest((state.positions, state.velocities, masses)))
    if metadata is not None:
        signature["metadata"] = as_metadata(metadata)
    return signature


class Checkpoint:
    """Where and how often a run is checkpointed, and what it must agree on."""

    def __init__(self, path, every: int, resume: bool, signature: dict):
        self.path = Path(path)
        self.every, self.resume, self.signature = every, resume, signature

    def write(self, carry, pieces, done, code, failed_at, failed_atom, reallocations):
        leaves = jax.tree_util.tree_leaves(carry)
        arrays = {f"carry/{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
        if pieces:
            columns = zip(*(jax.tree_util.tree_leaves(p) for p in pieces), strict=True)
            for i, column in enumerate(columns):
                arrays[f"records/{i}"] = np.concatenate([np.asarray(c) for c in column])
        header = dict(format=FORMAT, signature=self.signature, done=int(done),
                      code=int(code), failed_at=int(failed_at), failed_atom=int(failed_atom),
                      reallocations=int(reallocations), n_leaves=len(leaves),
                      neighbors=_nbr_static(carry.neighbors), jax_version=jax.__version__)

        def writer(tmp):
            with open(tmp, "wb") as fh:
                np.savez(fh, __checkpoint__=np.asarray(json.dumps(header)), **arrays)

        atomic_write(self.path, writer)

    def load(self, carry0, records0):
        """``(carry, done, pieces, code, failed_at, failed_atom, reallocations)``, the carry
        rebuilt on ``carry0``'s structure (with the list's size from the file) and the
        frames on ``records0``'s (an empty record of the run's integrator)."""
        try:
            header = read_header(self.path)
        except CheckpointError as err:
            raise CheckpointError(f"simulate: {err}") from None
        try:
            with np.load(self.path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files if k != "__checkpoint__"}
        except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
            raise CheckpointError(f"simulate: the checkpoint {self.path} cannot be read "
                                  f"(truncated or corrupt?): {type(err).__name__}: {err}"
                                  ) from None
        differs = mismatch(header["signature"], self.signature)
        if differs:
            raise CheckpointError(
                f"simulate: the checkpoint {self.path} does not match this call: {differs}. "
                "Resume with the arguments of the run that wrote it, or start afresh "
                "(resume=False overwrites the file)")
        template = carry0
        if header["neighbors"] is not None:
            static = {k: tuple(v) if isinstance(v, list) else v
                      for k, v in header["neighbors"].items()}
            template = carry0._replace(neighbors=carry0.neighbors.replace(**static))
        t_leaves, treedef = jax.tree_util.tree_flatten(template)
        if len(t_leaves) != header["n_leaves"]:
            raise CheckpointError(f"simulate: the checkpoint {self.path} holds "
                                  f"{header['n_leaves']} carry arrays, this run has "
                                  f"{len(t_leaves)}")
        leaves = []
        for i, t in enumerate(t_leaves):
            a = arrays[f"carry/{i}"]
            if a.dtype != jnp.asarray(t).dtype:
                raise CheckpointError(f"simulate: the checkpoint {self.path}: carry array {i} "
                                      f"is {a.dtype}, this run's is {jnp.asarray(t).dtype}")
            leaves.append(jnp.asarray(a))
        carry = jax.tree_util.tree_unflatten(treedef, leaves)
        if header["code"] == 0:
            _check_finite(self.path, carry)
        pieces = []
        if "records/0" in arrays:
            r_leaves, r_treedef = jax.tree_util.tree_flatten(records0)
            pieces = [jax.tree_util.tree_unflatten(
                r_treedef, [jnp.asarray(arrays[f"records/{i}"]) for i in range(len(r_leaves))])]
        return (carry, header["done"], pieces, header["code"], header["failed_at"],
                header["failed_atom"], header["reallocations"])


def _check_finite(path, carry) -> None:
    """Refuse a checkpoint of a run without failure whose state is not finite (a run that
    went non-finite would have stopped with a failure code): name the field and the first
    atom, before any step runs (a step would report the atom that moved fastest)."""
    for field in ("positions", "velocities", "forces"):
        a = np.asarray(getattr(carry, field))
        bad = ~np.all(np.isfinite(a), axis=-1)
        if bad.any():
            atom = int(np.argmax(bad))
            raise CheckpointError(
                f"simulate: the checkpoint {path} records a run without failure, but its "
                f"{field} of atom {atom} are not finite ({a[atom].tolist()}): the file was "
                f"altered or damaged; start afresh (resume=False overwrites it)")
    if not np.isfinite(np.asarray(carry.potential_energy)):
        raise CheckpointError(f"simulate: the checkpoint {path} records a run without "
                              f"failure, but its potential energy is not finite: the file "
                              f"was altered or damaged; start afresh (resume=False "
                              f"overwrites it)")


class _Stop:
    """The signal that asked the run to stop (``signum`` 0 while none did)."""

    def __init__(self):
        self.signum = 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def handler(self, signum, frame):
        self.signum = signum

    def exit(self, message: str):
        """After the checkpoint is written: Ctrl-C raises ``KeyboardInterrupt``; SIGTERM
        ends the process as SIGTERM would have."""
        print(message, file=sys.stderr, flush=True)
        if self.signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
        raise KeyboardInterrupt(message)


@contextlib.contextmanager
def stop_on_signals(enabled: bool):
    """While the block runs, SIGINT and SIGTERM (where they have their default handlers,
    and in the main thread) only set ``stop.signum``; the loop checks it between chunks."""
    stop = _Stop()
    installed = {}
    if enabled and threading.current_thread() is threading.main_thread():
        for sig, default in ((signal.SIGINT, signal.default_int_handler),
                             (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(sig) is default:
                installed[sig] = signal.signal(sig, stop.handler)
    try:
        yield stop
    finally:
        for sig, previous in installed.items():
            if signal.getsignal(sig) == stop.handler:
                signal.signal(sig, previous)

