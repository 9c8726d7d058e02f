"""Child process of tests/test_blowup.py: run extreme-position cases, one JSON line each.

Reads a JSON list of cases on stdin. Before each case it prints ``{"start": i}`` (flushed),
so that the parent can name the case a crash happened in; after it, ``{"case": i, ...}``
with the outcome. The references (brute-force pair sets, the float64 gravity sum) are
numpy, not simlib.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import simlib as sl  # noqa: E402
from simlib import particles as sp  # noqa: E402

R_CUT, SKIN = 1.5, 0.3
LJ = dict(sigma=1.0, epsilon=1.0)


def positions_for(case):
    """``(positions float64 numpy, box or None)`` for a case's pattern."""
    rng = np.random.default_rng(case["seed"])
    if case["kind"] == "gravity":
        x, box = rng.normal(size=(case["n"], 3)), None
    else:
        x, box = sp.lattice(3, 0.5)                              # 108 atoms, box 6.0
        x, box = np.asarray(x) + rng.uniform(-0.05, 0.05, np.shape(x)), float(box)
    k = case["atom"] % len(x)
    pattern = case["pattern"]
    if pattern == "overlap":
        x[(k + 1) % len(x)] = x[k] + case["delta"]
    elif pattern == "huge":
        x[k] = 1e20
    elif pattern in ("inf", "nan"):
        x[k, case["axis"] % x.shape[1]] = float(pattern)
    elif pattern == "far":
        x[k] += case["boxes"] * (box or 10.0)
    elif pattern == "empty":
        x = x[:0]
    elif pattern == "tiny_box" and box is not None:
        x, box = x * (1e-3 / box), 1e-3
    return x, box


def pairs(x, box, radius):
    """The set of pairs ``i < j`` within ``radius`` (numpy, minimum image)."""
    d = x[:, None, :] - x[None, :, :]
    if box is not None:
        d = d - box * np.round(d / box)
    with np.errstate(invalid="ignore"):
        close = np.sum(d * d, axis=-1) < radius**2
    i, j = np.nonzero(np.triu(close, 1))
    return set(zip(i.tolist(), j.tolist(), strict=True))


def listed(idx, n):
    return {(min(i, int(j)), max(i, int(j))) for i, row in enumerate(np.asarray(idx))
            for j in row if j < n}


def run_simulate(case, x, box):
    dtype = np.dtype(case["dtype"])
    space = sp.periodic(box) if case["periodic"] else sp.free()
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT, shift=True)
    x = x.astype(dtype)
    v = np.random.default_rng(1).normal(0.0, 0.5, x.shape).astype(dtype)
    nbrs = None
    if case["with_list"]:
        finite = np.all(np.isfinite(x))
        nbrs = sp.neighbor_list(space, x if finite else np.nan_to_num(x), r_cut=R_CUT,
                                skin=SKIN)
    traj = sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=0.005, n_steps=20,
                       save_every=10, neighbors=nbrs, throw=False)
    return dict(code=int(traj.result), step=int(traj.stats["failed_step"]),
                atom=int(traj.stats["failed_atom"]))


def run_neighbors(case, x, box):
    space = sp.periodic(box) if case["periodic"] else sp.free()
    box = box if case["periodic"] else None
    nbrs = sp.neighbor_list(space, x, r_cut=R_CUT, skin=SKIN)
    n = len(x)
    want = pairs(x, box, R_CUT)
    missed = len(want - listed(nbrs.idx, n))
    # The jitted update with one position made non-finite: no crash, no pair among the
    # finite atoms lost, and the bad atom in no one's row.
    y = x.copy()
    y[case["atom"] % n] = np.nan
    out = jax.jit(lambda nl, y: nl.update(y))(nbrs, y)
    ok = np.all(np.isfinite(y), axis=1)
    keep = {p for p in pairs(np.where(ok[:, None], y, 0.0), box, R_CUT) if ok[p[0]] and ok[p[1]]}
    got = listed(out.idx, n)
    bad = int(np.flatnonzero(~ok)[0])
    return dict(code=0, missed=missed, missed_after_nan=len(keep - got),
                lists_nan_atom=any(bad in p for p in got), overflow=bool(out.overflow))


def run_gravity(case, x, box):
    soft = case["softening"]
    masses = np.linspace(1.0, 2.0, len(x))
    energy = sp.pair_energy(sp.gravity, sp.free())
    params = dict(G=1.0, softening=soft, masses=masses)
    e, f = jax.jit(energy.energy_and_forces)(x, params)
    e, f = float(e), np.asarray(f)
    out = dict(code=0, finite=bool(np.isfinite(e) and np.all(np.isfinite(f))))
    if np.all(np.isfinite(x)):
        d = x[:, None, :] - x[None, :, :]
        r2 = np.sum(d * d, -1) + soft**2
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(np.eye(len(x), dtype=bool), 0.0, 1.0 / np.sqrt(r2))
            mm = masses[:, None] * masses[None, :]
            e_ref = -0.5 * np.sum(mm * inv)
            f_ref = -np.sum((mm * inv**3)[:, :, None] * d, axis=1)
        if np.isfinite(e_ref) and np.all(np.isfinite(f_ref)):
            out["energy_error"] = abs(e - e_ref) / max(abs(e_ref), 1e-300)
            out["force_error"] = float(np.max(np.abs(f - f_ref)) / max(np.max(np.abs(f_ref)),
                                                                       1e-300))
    return out


RUN = dict(simulate=run_simulate, neighbors=run_neighbors, gravity=run_gravity)


def main():
    cases = json.load(sys.stdin)
    for i, case in enumerate(cases):
        print(json.dumps({"start": i}), flush=True)
        x, box = positions_for(case)
        try:
            out = RUN[case["kind"]](case, x, box)
        except (ValueError, sl.SolverError) as err:
            out = dict(error=type(err).__name__, message=str(err))
        print(json.dumps({"case": i, **out}), flush=True)


if __name__ == "__main__":
    main()
