"""Result files: :func:`save` and :func:`load`, by file extension.

* ``.npz`` (numpy's zip of arrays): an ODE :class:`~simlib.Solution` (``ts``, ``ys`` and
  ``stats`` as pytrees of dicts, lists and tuples, ``result``), or a particle
  :class:`~simlib.particles.Trajectory`.
* ``.h5`` / ``.h5md``: a particle trajectory in H5MD 1.1 (de Buyl, Colberg and Hofling,
  Comput. Phys. Commun. 185, 1546 (2014); https://www.nongnu.org/h5md/h5md.html), the
  HDF5 layout that MDAnalysis and OVITO read: ``/h5md`` (version, author, creator),
  ``/particles/all/{position,velocity}/{step,time,value}``, ``/particles/all/box``
  (``dimension``, ``boundary``, ``edges/{step,time,value}``),
  ``/observables/{potential,kinetic}_energy``
  and simlib's metadata in ``/parameters``. Needs ``h5py``.
* ``.xyz``: extended XYZ (one block per frame, ``Lattice=`` and ``Properties=`` in the
  comment line) for a quick look in OVITO, ASE or VMD. Text, so not bit-exact.

Every file carries metadata: what the caller gives (parameters, solver, ``dt``, seed, ...)
and what simlib adds (its version, JAX's and jaxlib's, float64 on or off, the date).
:func:`load` gives back numpy arrays and the metadata; a truncated or corrupt file raises
:class:`FileFormatError` naming the path.
"""

from __future__ import annotations

import datetime
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ._files import atomic_write
from ._version import __version__

__all__ = ["FileFormatError", "Loaded", "load", "save", "version_metadata"]

H5MD_VERSION = (1, 1)


class FileFormatError(ValueError):
    """A file that :func:`load` cannot read: truncated, corrupt, or not a simlib file."""


class Loaded(dict):
    """What :func:`load` returns: a dict of numpy arrays (and pytrees of them) whose keys
    are also attributes, with ``metadata`` (a dict) and ``kind`` (``"solution"`` or
    ``"trajectory"``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        parts = ", ".join(f"{k}={_shape(v)}" for k, v in self.items()
                          if k not in ("metadata", "kind"))
        return f"Loaded({self.get('kind')}: {parts})"


def _shape(v):
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{list(v.shape)}"
    return type(v).__name__


def version_metadata() -> dict:
    """What simlib records about the run's software: versions, float64 on or off, date."""
    import jax
    import jaxlib

    return dict(simlib_version=__version__, jax_version=jax.__version__,
                jaxlib_version=jaxlib.__version__, numpy_version=np.__version__,
                float64=bool(jax.config.jax_enable_x64),
                created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))


def _jsonable(x):
    """``x`` as JSON: arrays as lists, numpy scalars as numbers, other objects by repr."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "__array__") or isinstance(x, np.generic):
        try:
            a = np.asarray(x)
        except Exception:  # noqa: BLE001 - a typed PRNG key, say
            return repr(x)
        if a.dtype.kind in "biuf":
            return a.tolist()
    return repr(x)


def _metadata(metadata) -> dict:
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"save: metadata must be a dict, got {type(metadata).__name__}")
    return {**version_metadata(), **_jsonable(dict(metadata or {}))}


# ---- pytrees of dicts, lists, tuples and arrays, as flat npz entries plus a JSON spec --------

def _flatten(tree, prefix: str, out: dict):
    """A JSON spec of ``tree``, its arrays stored in ``out`` under ``prefix``-based keys."""
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {"dict": {str(k): _flatten(v, f"{prefix}/{k}", out) for k, v in tree.items()}}
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        return {kind: [_flatten(v, f"{prefix}/{i}", out) for i, v in enumerate(tree)]}
    out[prefix] = np.asarray(tree)
    return {"array": prefix}


def _unflatten(spec, arrays):
    if spec is None:
        return None
    if "dict" in spec:
        return {k: _unflatten(v, arrays) for k, v in spec["dict"].items()}
    if "list" in spec:
        return [_unflatten(v, arrays) for v in spec["list"]]
    if "tuple" in spec:
        return tuple(_unflatten(v, arrays) for v in spec["tuple"])
    return arrays[spec["array"]]


# ---- what an object holds ----------------------------------------------------------------

_TRAJECTORY_FIELDS = ("times", "positions", "velocities", "potential_energy", "kinetic_energy")


def _is_trajectory(obj) -> bool:
    return all(hasattr(obj, f) for f in _TRAJECTORY_FIELDS)


def _is_solution(obj) -> bool:
    return all(hasattr(obj, f) for f in ("ts", "ys", "stats", "result"))


def _stats_tree(stats):
    """``stats`` without what is not plain data (event records become tuples)."""
    out = {}
    for k, v in dict(stats).items():
        if k == "events":
            v = tuple(tuple(r) for r in v)
        out[k] = v
    return out


def _box_of(box, d):
    """``(edges or None, periodic)`` from a Space, an array, a number or None."""
    if box is None:
        return None, False
    if hasattr(box, "periodic"):  # a simlib Space
        if not box.periodic:
            return None, False
        box = box.box
    edges = np.broadcast_to(np.asarray(box, np.float64), (d,)).copy()
    return edges, True


# ---- writing -----------------------------------------------------------------------------

def save(path: str | os.PathLike, obj: Any, metadata: dict | None = None, *,
         box: Any = None) -> Path:
    """Write ``obj`` to ``path``, its format chosen by the extension, with ``metadata``.

    Args:
        path: ``.npz`` (a :class:`~simlib.Solution` or a particle trajectory), ``.h5`` or
            ``.h5md`` (H5MD, a trajectory), ``.xyz`` (extended XYZ, a trajectory).
        obj: What :func:`~simlib.solve` or :func:`~simlib.particles.simulate` returned.
        metadata: A dict stored with the data (parameters, solver, ``dt``, seed, ...): JSON
            values; arrays become lists, other objects their ``repr``. simlib adds
            :func:`version_metadata`.
        box: For a trajectory: the :class:`~simlib.particles.Space` it ran in (or the box
            edges); ``None`` for free space.

    Returns:
        The path written. The file is written to a temporary file in the same directory
        and renamed, so an interrupted save leaves any earlier file intact.

    Example:
        >>> save("out/decay.npz", sol, metadata=dict(solver="Tsit5", rtol=1e-8))  # doctest: +SKIP
    """
    path = Path(path)
    ext = path.suffix.lower()
    meta = _metadata(metadata)
    if _is_trajectory(obj):
        d = int(np.shape(obj.positions)[-1])
        edges, periodic = _box_of(box, d)
        arrays = {f: np.asarray(getattr(obj, f)) for f in _TRAJECTORY_FIELDS}
        arrays["result"] = np.asarray(obj.result)
        masses = getattr(getattr(obj, "final", None), "masses", None)
        if masses is not None:
            arrays["masses"] = np.asarray(masses)
        if edges is not None:
            arrays["box"] = edges
        stats = {k: np.asarray(v) for k, v in dict(getattr(obj, "stats", {})).items()}
        if ext == ".npz":
            writer = lambda tmp: _write_npz(tmp, "trajectory", arrays, stats, meta)  # noqa: E731
        elif ext in (".h5", ".h5md", ".hdf5"):
            writer = lambda tmp: _write_h5md(tmp, arrays, stats, edges, periodic, meta)  # noqa: E731
        elif ext in (".xyz", ".extxyz"):
            writer = lambda tmp: _write_xyz(tmp, arrays, edges, periodic, meta)  # noqa: E731
        else:
            raise ValueError(f"save: unknown extension {ext!r} of {path} for a trajectory; "
                             "use .npz, .h5 (H5MD) or .xyz (extended XYZ)")
    elif _is_solution(obj):
        if ext != ".npz":
            raise ValueError(f"save: a Solution is saved as .npz, got {path}")
        out: dict = {}
        spec = {"ts": _flatten(obj.ts, "ts", out), "ys": _flatten(obj.ys, "ys", out),
                "stats": _flatten(_stats_tree(obj.stats), "stats", out)}
        out["result"] = np.asarray(obj.result)
        writer = lambda tmp: _write_npz(tmp, "solution", out, None, meta, spec)  # noqa: E731
    else:
        raise TypeError(f"save: expected a Solution (from solve) or a Trajectory (from "
                        f"simulate), got {type(obj).__name__}")
    atomic_write(path, writer)
    return path


def _write_npz(tmp, kind, arrays, stats, meta, spec=None):
    header = dict(format="simlib", kind=kind, metadata=meta, tree=spec)
    entries = dict(arrays)
    for k, v in (stats or {}).items():
        entries[f"stats/{k}"] = v
    with open(tmp, "wb") as fh:
        np.savez(fh, __simlib__=np.asarray(json.dumps(header)), **entries)


def _write_h5md(tmp, arrays, stats, edges, periodic, meta):
    import h5py

    times = arrays["times"]
    n_frames, n, d = arrays["positions"].shape
    dt_frame = meta.get("dt")
    steps = np.arange(n_frames, dtype=np.int64)
    if "save_every" in meta:
        steps = steps * int(meta["save_every"])
    elif dt_frame and n_frames > 1:
        steps = np.rint(times / float(dt_frame)).astype(np.int64)
    with h5py.File(tmp, "w") as f:
        h = f.create_group("h5md")
        h.attrs["version"] = np.asarray(H5MD_VERSION, np.int32)
        h.create_group("author").attrs["name"] = str(meta.get("author", os.environ.get(
            "USER", "unknown")))
        creator = h.create_group("creator")
        creator.attrs["name"] = "simlib"
        creator.attrs["version"] = meta["simlib_version"]
        group = f.create_group("particles/all")
        box = group.create_group("box")
        box.attrs["dimension"] = np.int32(d)
        box.attrs["boundary"] = np.array(["periodic" if periodic else "none"] * d,
                                         dtype=h5py.string_dtype())
        if edges is not None:  # a time-dependent element: MDAnalysis reads only that form
            _h5md_element(box.create_group("edges"), steps, times,
                          np.broadcast_to(edges, (n_frames, d)))
        for name, key in (("position", "positions"), ("velocity", "velocities")):
            _h5md_element(group.create_group(name), steps, times, arrays[key])
        if "masses" in arrays:
            group.create_dataset("mass", data=np.broadcast_to(arrays["masses"], (n,)))
        obs = f.create_group("observables")
        for key in ("potential_energy", "kinetic_energy"):
            _h5md_element(obs.create_group(key), steps, times, arrays[key])
        params = f.create_group("parameters")
        params.attrs["simlib_metadata"] = json.dumps(meta)
        params.create_dataset("result", data=arrays["result"])
        st = params.create_group("stats")
        for k, v in stats.items():
            st.create_dataset(k, data=v)


def _h5md_element(g, steps, times, values):
    g.create_dataset("step", data=steps)
    g.create_dataset("time", data=np.asarray(times))
    g.create_dataset("value", data=np.asarray(values))


def _write_xyz(tmp, arrays, edges, periodic, meta):
    x, v = arrays["positions"], arrays["velocities"]
    n_frames, n, d = x.shape
    if d > 3:
        raise ValueError(f"save: extended XYZ holds at most 3 dimensions, got {d}")
    pad = 3 - d
    lattice = np.zeros((3, 3))
    if edges is not None:
        lattice[np.arange(d), np.arange(d)] = edges
    pbc = " ".join(["T" if periodic else "F"] * d + ["F"] * pad)
    lattice_s = "" if edges is None else 'Lattice="{}" '.format(
        " ".join(f"{c:.17g}" for c in lattice.ravel()))
    meta_s = json.dumps(meta).replace("\\", "\\\\").replace('"', '\\"')
    with open(tmp, "w") as fh:
        for i in range(n_frames):
            xi = np.concatenate([x[i], np.zeros((n, pad))], axis=1)
            vi = np.concatenate([v[i], np.zeros((n, pad))], axis=1)
            fh.write(f"{n}\n")
            fh.write(f'{lattice_s}Properties=species:S:1:pos:R:3:vel:R:3 '
                     f'Time={float(arrays["times"][i]):.17g} '
                     f'potential_energy={float(arrays["potential_energy"][i]):.17g} '
                     f'kinetic_energy={float(arrays["kinetic_energy"][i]):.17g} '
                     f'pbc="{pbc}" dimension={d} simlib_metadata="{meta_s}"\n')
            rows = np.concatenate([xi, vi], axis=1)
            fh.writelines("X " + " ".join(f"{c:.17g}" for c in row) + "\n" for row in rows)


# ---- reading -----------------------------------------------------------------------------

def load(path: str | os.PathLike) -> Loaded:
    """Read a file written by :func:`save`.

    Returns:
        A :class:`Loaded` dict of numpy arrays with ``metadata``: for a solution ``ts``,
        ``ys`` and ``stats`` (the pytrees that were saved) and ``result``; for a trajectory
        ``times``, ``positions``, ``velocities``, ``potential_energy``, ``kinetic_energy``,
        ``result``, ``stats``, and ``box`` (the edges) when the box was periodic.

    Raises:
        FileNotFoundError: no file at ``path``.
        FileFormatError: a truncated, corrupt or foreign file (the message names it).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"load: no file {path}")
    ext = path.suffix.lower()
    try:
        if ext == ".npz":
            return _read_npz(path)
        if ext in (".h5", ".h5md", ".hdf5"):
            return _read_h5md(path)
        if ext in (".xyz", ".extxyz"):
            return _read_xyz(path)
    except FileFormatError:
        raise
    except Exception as err:  # noqa: BLE001 - any reader failure is a bad file
        raise FileFormatError(
            f"load: {path} cannot be read as a {ext} file written by simlib.io.save "
            f"(truncated or corrupt?): {type(err).__name__}: {err}") from None
    raise ValueError(f"load: unknown extension {ext!r} of {path}; use .npz, .h5 or .xyz")


def _read_npz(path: Path) -> Loaded:
    try:
        data = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        raise FileFormatError(f"load: {path} is not a readable .npz file (truncated or "
                              f"corrupt?): {err}") from None
    with data:
        if "__simlib__" not in data.files:
            raise FileFormatError(f"load: {path} is an .npz file but not one written by "
                                  "simlib.io.save (no __simlib__ header)")
        header = json.loads(str(data["__simlib__"]))
        arrays = {k: data[k] for k in data.files if k != "__simlib__"}
    out = Loaded(kind=header["kind"], metadata=header["metadata"])
    if header["kind"] == "solution":
        tree = header["tree"]
        out.update(ts=_unflatten(tree["ts"], arrays), ys=_unflatten(tree["ys"], arrays),
                   stats=_unflatten(tree["stats"], arrays), result=arrays["result"])
    else:
        out.update({k: v for k, v in arrays.items() if not k.startswith("stats/")})
        out["stats"] = {k[6:]: v for k, v in arrays.items() if k.startswith("stats/")}
    return out


def _read_h5md(path: Path) -> Loaded:
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise FileFormatError(f"load: {path} is not a readable HDF5 file (truncated or "
                              f"corrupt?): {err}") from None
    with f:
        if "h5md" not in f or "particles/all/position" not in f:
            raise FileFormatError(f"load: {path} is an HDF5 file but not an H5MD trajectory "
                                  "(no /h5md or /particles/all/position)")
        group = f["particles/all"]
        out = Loaded(kind="trajectory", metadata=json.loads(
            f["parameters"].attrs["simlib_metadata"]) if "parameters" in f else {})
        out["times"] = group["position/time"][()]
        out["steps"] = group["position/step"][()]
        out["positions"] = group["position/value"][()]
        out["velocities"] = group["velocity/value"][()]
        out["potential_energy"] = f["observables/potential_energy/value"][()]
        out["kinetic_energy"] = f["observables/kinetic_energy/value"][()]
        if "mass" in group:
            out["masses"] = group["mass"][()]
        if "edges" in group["box"]:
            edges = group["box/edges"]
            out["box"] = edges[()] if isinstance(edges, h5py.Dataset) else edges["value"][0]
        if "parameters/result" in f:
            out["result"] = f["parameters/result"][()]
        if "parameters/stats" in f:
            out["stats"] = {k: v[()] for k, v in f["parameters/stats"].items()}
    return out


def _read_xyz(path: Path) -> Loaded:
    import shlex

    lines = path.read_text().splitlines()
    frames, vels, times, pe, ke, meta, box, d = [], [], [], [], [], {}, None, 3
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        n = int(lines[i])
        if len(lines) < i + 2 + n:
            raise FileFormatError(f"load: {path}: frame {len(frames)} is incomplete "
                                  "(truncated file?)")
        fields = dict(kv.split("=", 1) for kv in shlex.split(lines[i + 1]) if "=" in kv)
        d = int(fields.get("dimension", 3))
        rows = np.array([[float(c) for c in line.split()[1:]]
                         for line in lines[i + 2:i + 2 + n]]).reshape(n, -1)
        if rows.shape[1] < 6:
            raise FileFormatError(f"load: {path}: frame {len(frames)} is incomplete")
        frames.append(rows[:, :d])
        vels.append(rows[:, 3:3 + d])
        times.append(float(fields["Time"]))
        pe.append(float(fields.get("potential_energy", "nan")))
        ke.append(float(fields.get("kinetic_energy", "nan")))
        if "simlib_metadata" in fields:
            meta = json.loads(fields["simlib_metadata"])
        if "Lattice" in fields and "T" in fields.get("pbc", ""):
            lattice = np.array([float(c) for c in fields["Lattice"].split()]).reshape(3, 3)
            box = np.diag(lattice)[:d]
        i += 2 + n
    if not frames:
        raise FileFormatError(f"load: {path} holds no XYZ frame")
    out = Loaded(kind="trajectory", metadata=meta, times=np.array(times),
                 positions=np.stack(frames), velocities=np.stack(vels),
                 potential_energy=np.array(pe), kinetic_energy=np.array(ke))
    if box is not None:
        out["box"] = box
    return out
