"""Part 6: particle dynamics (``simlib.particles``) against conservation laws, statistics,
published Lennard-Jones data and independent N-body integrations.

Four checks, in float64 on the CPU, Lennard-Jones (LJ) in reduced units
(sigma = epsilon = m = k_B = 1), step dt = 0.005 for every LJ run:

1. **NVE energy conservation.** An LJ fluid at rho = 0.8442, truncated and shifted at
   r_c = 2.5, neighbour list with skin 0.3, is melted with Langevin dynamics at kT = 1.44,
   brought to kT = 0.722, its total momentum is removed, and it then runs velocity-Verlet
   NVE. Reported: the largest relative total-energy error |E(t) - E0| / |E0| over the saved
   frames, its linear drift rate, the change of the total momentum (round-off only), the
   neighbour-list builds and reallocations, the wall time, and the mean-square displacement
   (a liquid, not a superheated crystal).
2. **Langevin sampling.** From the production run of check 3 (N = 864, BAOAB, kT = 1,
   gamma = 1): the mean kinetic temperature 2K / (3N) against kT (all 3N degrees of freedom:
   the thermostat does not conserve momentum), and a Kolmogorov-Smirnov test of the x
   velocity components against the normal distribution of variance kT / m, on frames
   2 time units apart (their velocity autocorrelation is reported).
3. **LJ state point** rho = 0.75, T = 1.0, truncated and shifted at r_c = 2.5 (the cs
   model, see ``lj_reference.py``): U/N from the shifted pair energy, P = mean of the
   instantaneous virial pressure ``sp.pressure`` (kinetic term included, no tail, no
   impulsive term), against the Thol et al. (2015) cs EOS and Allen & Tildesley's N = 864
   NVT MD. Errors by block averaging. In the full run also the NIST SRSW point T = 0.90,
   rho = 0.776, N = 500, LJ truncated (not shifted) at 3.0 with the standard tail
   corrections, without and with reweighting from the cs to the c ensemble.
4. **Gravity.** A figure-eight three-body orbit, a ten-body cluster and an eccentric Kepler
   binary, integrated with ``sp.simulate`` (NVE, velocity Verlet, direct-sum gravity), against
   scipy ``solve_ivp`` (DOP853, rtol = atol = 1e-12) on the same Newtonian equations in numpy,
   or against the closed-form Kepler orbit; three step sizes give the convergence order.

Every statistical verdict is "within 3 combined standard errors" or "p > 0.01"; the
thresholds are fixed in the code, not chosen after the fact.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from scipy import stats
from scipy.integrate import solve_ivp

from simlib import particles as sp

from . import lj_reference as ljref
from .common import Checks, Section, fit_slope, fmt, md_table, save_figure

DT = 0.005
LJ = dict(sigma=1.0, epsilon=1.0)
SKIN = 0.3

# Thresholds (fixed before any run).
DRIFT_TARGET = 1e-4        # max |E(t) - E0| / |E0| over the NVE run (issue target)
MOMENTUM_TOL = 1e-10       # max |P(t) - P(0)| / sqrt(N m kT): round-off level
LIQUID_MSD = 1.0           # sigma^2: a crystal stays far below, a liquid diffuses past it
N_SIGMA = 3.0              # statistical agreement: |difference| < 3 combined standard errors
KS_ALPHA = 0.01            # Kolmogorov-Smirnov: fail below this p-value
KS_SPACING = 2.0           # time units between the frames pooled for the KS test
ORDER_TOL = 0.2            # measured Verlet order must lie within 2 +- this
ERROR_BLOCKS = (10, 20, 40)  # standard error = the largest block estimate over these

# lj_reference.py gives no uncertainty for the THOL15 cs EOS. Assumed here: 0.002 in U/N and
# 0.005 in P, about the difference between that EOS and Allen & Tildesley's N = 864 MD
# (-4.4287 vs -4.427(2), 0.9897 vs 0.994(3)).
EOS_UNC = dict(U=0.002, P=0.005)
ERROR_TEXT = ("Standard errors: the largest block-average estimate with 10, 20 or 40 "
              "consecutive blocks.")


def _config(quick: bool) -> dict:
    if quick:
        return dict(nve_cells=8, melt_steps=500, cool_steps=500, nve_steps=2000, nve_save=10,
                    lj_equil=2000, lj_prod=20000, lj_save=25, nist=False,
                    kepler_steps=(500, 1000, 2000), eight_steps=(1000, 2000, 4000),
                    cluster_steps=(500, 1000, 2000))
    return dict(nve_cells=10, melt_steps=500, cool_steps=1000, nve_steps=10000, nve_save=10,
                lj_equil=4000, lj_prod=100000, lj_save=25, nist=True,
                nist_equil=4000, nist_prod=60000, nist_save=25,
                kepler_steps=(1000, 2000, 4000), eight_steps=(2000, 4000, 8000),
                cluster_steps=(1000, 2000, 4000))


# --------------------------------------------------------------------------------------
# statistics


def block_error(x, n_blocks: int, w=None) -> float:
    """Standard error of the mean of ``x`` (of ``<x w> / <w>`` with weights ``w``) from
    ``n_blocks`` equal consecutive blocks; the first ``len(x) % n_blocks`` samples are dropped."""
    x = np.asarray(x, np.float64)
    w = np.ones_like(x) if w is None else np.asarray(w, np.float64)
    m = len(x) // n_blocks
    s = slice(len(x) - m * n_blocks, None)
    b = ((x[s] * w[s]).reshape(n_blocks, m).mean(axis=1)
         / w[s].reshape(n_blocks, m).mean(axis=1))
    return float(b.std(ddof=1) / math.sqrt(n_blocks))


def block_stats(x, w=None):
    """Mean (weighted by ``w``) and a conservative standard error: the largest of the block
    estimates with ``ERROR_BLOCKS`` blocks (a plateau estimate in the sense of Flyvbjerg &
    Petersen, J. Chem. Phys. 91, 461 (1989), without picking the plateau by eye)."""
    x = np.asarray(x, np.float64)
    w = np.ones_like(x) if w is None else np.asarray(w, np.float64)
    mean = float(np.sum(x * w) / np.sum(w))
    return mean, max(block_error(x, b, w) for b in ERROR_BLOCKS)


def _z(value, err, ref, ref_err):
    comb = math.sqrt(err**2 + (ref_err or 0.0) ** 2)
    return (value - ref) / comb if comb > 0 else float("inf"), comb


def _sync(traj):
    jax.block_until_ready(traj.positions)
    return traj


@jax.jit
def _pressures(energy, xs, vs):
    """Per frame: the virial pressure and the sum of squared forces."""
    def one(a):
        f = energy.forces(a[0], LJ)
        return sp.pressure(energy, a[0], a[1], 1.0, LJ), jnp.sum(f * f)

    return jax.lax.map(one, (xs, vs))


@jax.jit
def _pair_counts(count, xs):
    return jax.lax.map(lambda x: count(x, {}), xs)


def _count_potential(r, params):
    """1 per pair: ``pair_energy`` of it counts the pairs inside the cutoff."""
    return jnp.ones_like(r)


# --------------------------------------------------------------------------------------
# 1. NVE energy conservation


def _nve(cfg) -> dict:
    x, box = sp.lattice(cfg["nve_cells"], 0.8442)
    n = x.shape[0]
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=SKIN)
    v = sp.maxwell_boltzmann(1.0, 1.44, key=jax.random.key(11), n=n)
    t = time.perf_counter()
    melt = _sync(sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=DT,
                             n_steps=cfg["melt_steps"], neighbors=nbrs,
                             integrator=sp.Langevin(1.44, 1.0), key=jax.random.key(12)))
    cool = _sync(sp.simulate(energy, melt.final, LJ, space=space, dt=DT,
                             n_steps=cfg["cool_steps"], neighbors=melt.neighbors,
                             integrator=sp.Langevin(0.722, 1.0), key=jax.random.key(13)))
    equil_seconds = time.perf_counter() - t
    v0 = cool.final.velocities
    v0 = v0 - jnp.mean(v0, axis=0)           # equal masses: remove the thermostat's momentum
    builds0 = int(cool.neighbors.n_builds)
    t = time.perf_counter()
    traj = _sync(sp.simulate(energy, sp.State(cool.final.positions, v0, 1.0), LJ, space=space,
                             dt=DT, n_steps=cfg["nve_steps"], save_every=cfg["nve_save"],
                             neighbors=cool.neighbors, integrator=sp.NVE()))
    nve_seconds = time.perf_counter() - t
    ts = np.asarray(traj.times)
    e = np.asarray(traj.total_energy)
    u = np.asarray(traj.potential_energy)
    k = np.asarray(traj.kinetic_energy)
    rel = (e - e[0]) / abs(e[0])
    mom = np.asarray(sp.total_momentum(traj.velocities, 1.0))
    kt = float(np.mean(np.asarray(sp.temperature(traj.velocities, 1.0))))
    dmom = float(np.max(np.linalg.norm(mom - mom[0], axis=1)))
    msd = np.asarray(sp.mean_square_displacement(traj.positions, space))
    return dict(
        n=n, box=box, steps=cfg["nve_steps"], ts=ts, rel=rel, u=u / n, k=k / n,
        e0=float(e[0] / n), max_rel=float(np.max(np.abs(rel))), final_rel=float(abs(rel[-1])),
        slope=float(np.polyfit(ts, rel, 1)[0]), kT=kt, p0=float(np.linalg.norm(mom[0])),
        dmom=dmom, dmom_scaled=dmom / math.sqrt(n * kt), msd=float(msd[-1]),
        diffusion=float(msd[-1] / (6 * ts[-1])),
        builds=int(traj.stats["n_builds"]) - builds0,
        reallocations=int(traj.stats["n_reallocations"]), capacity=traj.neighbors.capacity,
        grid=traj.neighbors.grid, result=int(traj.result), equil_seconds=equil_seconds,
        seconds=nve_seconds, ms_per_step=1e3 * nve_seconds / cfg["nve_steps"],
    )


# --------------------------------------------------------------------------------------
# 2 + 3. Langevin LJ state points


def _langevin_run(n_cells, rho, kT, r_cut, shift, n_equil, n_prod, save_every, seed):
    """Lattice start, one BAOAB run of ``n_equil + n_prod`` steps; frames after ``n_equil``."""
    x, box = sp.lattice(n_cells, rho)
    n = x.shape[0]
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=r_cut, shift=shift)
    nbrs = sp.neighbor_list(space, x, r_cut=r_cut, skin=SKIN)
    v = sp.maxwell_boltzmann(1.0, kT, key=jax.random.key(seed), n=n)
    t = time.perf_counter()
    traj = _sync(sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=DT,
                             n_steps=n_equil + n_prod, save_every=save_every, neighbors=nbrs,
                             integrator=sp.Langevin(kT, 1.0), key=jax.random.key(seed + 1)))
    sim_seconds = time.perf_counter() - t
    first = n_equil // save_every + 1
    xs, vs = traj.positions[first:], traj.velocities[first:]
    t = time.perf_counter()
    p, f2 = (np.asarray(a) for a in _pressures(energy, xs, vs))
    p_seconds = time.perf_counter() - t
    return dict(
        n=n, box=box, rho=rho, kT=kT, r_cut=r_cut, shift=shift, space=space, xs=xs, vs=vs,
        ts=np.asarray(traj.times[first:]), u=np.asarray(traj.potential_energy[first:]) / n,
        p=p, f2=f2, temp=2.0 * np.asarray(traj.kinetic_energy[first:]) / (3 * n),
        u_all=np.asarray(traj.potential_energy) / n, t_all=np.asarray(traj.times),
        steps=n_equil + n_prod, equil=n_equil, prod=n_prod, save_every=save_every,
        builds=int(traj.stats["n_builds"]), reallocations=int(traj.stats["n_reallocations"]),
        result=int(traj.result), sim_seconds=sim_seconds, p_seconds=p_seconds,
        ms_per_step=1e3 * sim_seconds / (n_equil + n_prod),
    )


def _vacf(vs, max_lag):
    """Normalised velocity autocorrelation over frames, lags 0..max_lag."""
    v = np.asarray(vs)
    c0 = np.mean(np.sum(v * v, axis=-1))
    return np.array([np.mean(np.sum(v[lag:] * v[:len(v) - lag], axis=-1)) / c0
                     for lag in range(max_lag + 1)])


def _state_point(cfg) -> dict:
    run = _langevin_run(6, 0.75, 1.0, 2.5, True, cfg["lj_equil"], cfg["lj_prod"],
                        cfg["lj_save"], seed=21)
    run["U"], run["U_err"] = block_stats(run["u"])
    run["P"], run["P_err"] = block_stats(run["p"])
    run["T"], run["T_err"] = block_stats(run["temp"])
    # The same pressure with the exact kinetic term rho kT instead of the instantaneous 2K/3V.
    run["p_rhokT"] = run["p"] - run["rho"] * (run["temp"] - run["kT"])
    run["P2"], run["P2_err"] = block_stats(run["p_rhokT"])
    # BAOAB's full-step kinetic temperature is kT (1 - h^2 omega^2 / 4) for a harmonic
    # oscillator (exact); omega^2 = <|F|^2> / (3 N m kT) gives the leading-order estimate here.
    run["omega2"] = float(np.mean(run["f2"]) / (3 * run["n"] * run["kT"]))
    run["T_expected"] = run["kT"] * (1.0 - DT**2 * run["omega2"] / 4.0)
    run["blocking"] = {
        name: [(b, block_error(run[key], b)) for b in (5, 10, 20, 40, 80, 160)
               if len(run[key]) // b >= 2]
        for name, key in (("U/N", "u"), ("P", "p"), ("kT_kin", "temp"))}
    # Kolmogorov-Smirnov on x velocities of frames KS_SPACING apart.
    frame_dt = cfg["lj_save"] * DT
    stride = max(1, round(KS_SPACING / frame_dt))
    vx = np.asarray(run["vs"][::stride, :, 0]).ravel() / math.sqrt(run["kT"] / 1.0)
    ks = stats.kstest(vx, "norm")
    run.update(ks_stat=float(ks.statistic), ks_p=float(ks.pvalue), ks_n=vx.size,
               ks_frames=len(run["vs"][::stride]), ks_stride=stride * frame_dt,
               ks_std=float(np.std(vx)), ks_vx=vx)
    run["vacf"] = _vacf(run["vs"], stride)
    run["vacf_lag"] = np.arange(stride + 1) * frame_dt
    return run


def _nist_point(cfg) -> dict:
    """T = 0.90, rho = 0.776, N = 500, LJ truncated (unshifted) at 3.0, tails added."""
    rc, rho, kT = 3.0, 0.776, 0.90
    run = _langevin_run(5, rho, kT, rc, False, cfg["nist_equil"], cfg["nist_prod"],
                        cfg["nist_save"], seed=31)
    u_tail = float(ljref.tail_energy_per_particle(rho, rc))
    p_tail = float(ljref.tail_pressure(rho, rc))
    u = run["u"] + u_tail                    # unshifted pair sum / N + tail
    p = run["p"] + p_tail                    # rho T + W / 3V + tail, no impulsive term
    # MD with truncated forces samples exp(-U_cs / kT); NIST's Metropolis MC samples the
    # truncated (c) model, U_c = U_cs + u(r_c) N_pairs. Reweight frames by
    # exp(-u(r_c) N_pairs / kT) to estimate c-ensemble averages from the same frames.
    count = sp.pair_energy(_count_potential, run["space"], r_cut=rc)
    n_pairs = np.asarray(_pair_counts(count, run["xs"]))
    logw = -float(ljref.lj_potential(rc)) * n_pairs / kT
    w = np.exp(logw - logw.max())
    ess = float(w.sum() ** 2 / np.sum(w * w))
    ref = ljref.RECOMMENDED["rc3"]
    out = dict(run=run, u_tail=u_tail, p_tail=p_tail, ref=ref, ess=ess, n_frames=len(w),
               pairs_mean=float(n_pairs.mean()), pairs_std=float(n_pairs.std()))
    out["U"], out["U_err"] = block_stats(u)
    out["P"], out["P_err"] = block_stats(p)
    out["Uw"], out["Uw_err"] = block_stats(u, w)
    out["Pw"], out["Pw_err"] = block_stats(p, w)
    out["T"], out["T_err"] = block_stats(run["temp"])
    return out


# --------------------------------------------------------------------------------------
# 4. gravity


def _nbody_rhs(masses, G, eps):
    m = np.asarray(masses, np.float64)
    n = len(m)

    def rhs(t, y):
        x, v = y[:3 * n].reshape(n, 3), y[3 * n:]
        d = x[None, :, :] - x[:, None, :]                  # x_j - x_i
        r2 = np.sum(d * d, axis=-1) + eps**2
        np.fill_diagonal(r2, np.inf)
        a = G * np.sum((m[None, :] * r2**-1.5)[:, :, None] * d, axis=1)
        return np.concatenate([v, a.ravel()])

    return rhs


def _simlib_orbit(x0, v0, masses, G, eps, t1, n_steps):
    space = sp.free()
    energy = sp.pair_energy(sp.gravity, space)
    m = jnp.asarray(masses, jnp.float64)
    params = dict(G=G, softening=eps, masses=m)
    traj = sp.simulate(energy, sp.State(jnp.asarray(x0), jnp.asarray(v0), m), params,
                       space=space, dt=t1 / n_steps, n_steps=n_steps, save_every=1,
                       integrator=sp.NVE())
    e = np.asarray(traj.total_energy)
    return (np.asarray(traj.times), np.asarray(traj.positions),
            float(np.max(np.abs(e - e[0]) / abs(e[0]))))


def _scipy_orbit(x0, v0, masses, G, eps, times):
    y0 = np.concatenate([np.ravel(x0), np.ravel(v0)])
    sol = solve_ivp(_nbody_rhs(masses, G, eps), (0.0, times[-1]), y0, method="DOP853",
                    rtol=1e-12, atol=1e-12, t_eval=times)
    if not sol.success:
        raise RuntimeError(f"scipy reference failed: {sol.message}")
    return sol.y[:3 * len(masses)].T.reshape(len(times), len(masses), 3)


def _kepler_eccentric_anomaly(mean_anomaly, e):
    E = mean_anomaly + e * np.sin(mean_anomaly)
    for _ in range(60):
        E = E - (E - e * np.sin(E) - mean_anomaly) / (1.0 - e * np.cos(E))
    return E


FIGURE_EIGHT_PERIOD = 6.32591398  # Chenciner & Montgomery (2000), Simo's initial conditions


def _gravity_systems():
    """``(name, description, x0, v0, masses, G, softening, t1, reference)`` per system."""
    x1 = np.array([0.97000436, -0.24308753, 0.0])
    v3 = np.array([-0.93240737, -0.86473146, 0.0])
    eight = dict(name="figure-eight", x0=np.stack([x1, -x1, np.zeros(3)]),
                 v0=np.stack([-v3 / 2, -v3 / 2, v3]), masses=np.ones(3), G=1.0, eps=0.0,
                 t1=FIGURE_EIGHT_PERIOD, ref="scipy",
                 description="three equal masses on the figure-eight choreography "
                 "(Chenciner & Montgomery 2000; x1 = -x2 = (0.97000436, -0.24308753), "
                 "v3 = -2 v1 = -2 v2 = (-0.93240737, -0.86473146)), one period T = 6.32591398, "
                 "no softening")
    rng = np.random.default_rng(2000)
    n = 10
    m = rng.uniform(0.5, 1.5, n)
    m = m / m.sum()
    x = rng.normal(size=(n, 3))
    x = x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0, 1, (n, 1)) ** (1 / 3)
    x = x - (m[:, None] * x).sum(0)
    eps = 0.05
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    iu = np.triu_indices(n, 1)
    pot = -np.sum(m[iu[0]] * m[iu[1]] / np.sqrt(d[iu] ** 2 + eps**2))
    v = rng.normal(size=(n, 3))
    v = v - (m[:, None] * v).sum(0) / m.sum()
    v = v * math.sqrt(0.5 * abs(pot) / (0.5 * np.sum(m[:, None] * v * v)))  # 2K = |U|
    cluster = dict(name="ten-body", x0=x, v0=v, masses=m, G=1.0, eps=eps, t1=2.0, ref="scipy",
                   description="ten bodies, masses uniform in [0.5, 1.5] normalised to total "
                   "mass 1, positions uniform in the unit ball, Gaussian velocities scaled to "
                   "virial equilibrium (2K = |U|), zero total momentum, Plummer softening "
                   "0.05, G = 1, t1 = 2 (numpy seed 2000)")
    e, m1, m2 = 0.7, 1.0, 0.5
    mt = m1 + m2
    r0, vr0 = 1.0 - e, math.sqrt(mt * (1 + e) / (1 - e))          # a = G = 1, pericentre
    kep_x = np.array([[-m2 / mt * r0, 0, 0], [m1 / mt * r0, 0, 0]])
    kep_v = np.array([[0, -m2 / mt * vr0, 0], [0, m1 / mt * vr0, 0]])
    kepler = dict(name="Kepler binary", x0=kep_x, v0=kep_v, masses=np.array([m1, m2]), G=1.0,
                  eps=0.0, t1=2 * math.pi / math.sqrt(mt), ref="closed form", e=e,
                  description="two bodies m = (1, 0.5), G = 1, relative orbit a = 1, e = 0.7, "
                  "from pericentre, one period T = 2 pi / sqrt(G M); closed form from Kepler's "
                  "equation (Newton iteration)")
    return [eight, cluster, kepler]


def _kepler_positions(sys, times):
    m1, m2 = sys["masses"]
    mt = m1 + m2
    e = sys["e"]
    E = _kepler_eccentric_anomaly(math.sqrt(mt) * np.asarray(times), e)
    rel = np.stack([np.cos(E) - e, math.sqrt(1 - e * e) * np.sin(E), np.zeros_like(E)], -1)
    return np.stack([-m2 / mt * rel, m1 / mt * rel], axis=1)


def _gravity(cfg) -> list[dict]:
    out = []
    for sys in _gravity_systems():
        steps = cfg[{"figure-eight": "eight_steps", "ten-body": "cluster_steps",
                     "Kepler binary": "kepler_steps"}[sys["name"]]]
        coarse = min(steps)
        times = np.linspace(0.0, sys["t1"], coarse + 1)
        t = time.perf_counter()
        if sys["ref"] == "scipy":
            ref = _scipy_orbit(sys["x0"], sys["v0"], sys["masses"], sys["G"], sys["eps"], times)
            loose = solve_ivp(_nbody_rhs(sys["masses"], sys["G"], sys["eps"]),
                              (0.0, sys["t1"]), np.concatenate([np.ravel(sys["x0"]),
                                                                np.ravel(sys["v0"])]),
                              method="DOP853", rtol=1e-10, atol=1e-10, t_eval=times)
            n_b = len(sys["masses"])
            ref_check = float(np.max(np.abs(
                loose.y[:3 * n_b].T.reshape(len(times), n_b, 3) - ref)))
        else:
            ref = _kepler_positions(sys, times)
            ref_check = float(np.max(np.abs(ref[-1] - sys["x0"])))
        ref_seconds = time.perf_counter() - t
        runs = []
        for n_steps in steps:
            t = time.perf_counter()
            ts, xs, e_err = _simlib_orbit(sys["x0"], sys["v0"], sys["masses"], sys["G"],
                                          sys["eps"], sys["t1"], n_steps)
            sec = time.perf_counter() - t
            xs = xs[:: n_steps // coarse]
            err_t = np.max(np.linalg.norm(xs - ref, axis=-1), axis=1)
            runs.append(dict(n_steps=n_steps, dt=sys["t1"] / n_steps, err_t=err_t,
                             max_err=float(err_t.max()), final_err=float(err_t[-1]),
                             energy_err=e_err, seconds=sec))
        dts = [r["dt"] for r in runs]
        errs = [r["max_err"] for r in runs]
        pair_orders = [math.log2(a["max_err"] / b["max_err"])
                       for a, b in zip(runs[:-1], runs[1:], strict=True)]
        out.append(dict(sys=sys, times=times, ref=ref, runs=runs, order=fit_slope(dts, errs),
                        pair_orders=pair_orders, ref_check=ref_check, ref_seconds=ref_seconds))
    return out


# --------------------------------------------------------------------------------------
# figures


def _fig_nve(nve) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    ax = axes[0]
    ax.plot(nve["ts"], nve["rel"], lw=0.8)
    ax.axhline(DRIFT_TARGET, color="C3", ls="--", lw=0.8, label=f"target {DRIFT_TARGET:g}")
    ax.axhline(-DRIFT_TARGET, color="C3", ls="--", lw=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel("(E(t) - E0) / |E0|")
    ax.set_title(f"NVE, N = {nve['n']}, dt = {DT}, {nve['steps']} steps", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(nve["ts"], nve["u"] - nve["u"][0], lw=0.8, label="U/N - U0/N")
    ax.plot(nve["ts"], nve["k"] - nve["k"][0], lw=0.8, label="K/N - K0/N")
    ax.set_xlabel("t")
    ax.set_ylabel("energy per particle")
    ax.set_title("potential and kinetic energy exchange", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, "particles_nve_energy")


def _fig_langevin(run) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ax = axes[0]
    ax.plot(run["ts"], run["temp"], lw=0.5)
    ax.axhline(run["kT"], color="k", lw=0.8, label="kT")
    ax.axhline(run["T"], color="C3", ls="--", lw=0.8, label=f"mean {run['T']:.4f}")
    ax.set_xlabel("t")
    ax.set_ylabel("2K / 3N")
    ax.set_title(f"kinetic temperature, N = {run['n']}, BAOAB gamma = 1", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    vx = run["ks_vx"]
    ax.hist(vx, bins=100, density=True, alpha=0.6, label=f"{vx.size} samples")
    grid = np.linspace(-5, 5, 400)
    ax.plot(grid, stats.norm.pdf(grid), "k", lw=1, label="N(0, 1)")
    ax.set_yscale("log")
    ax.set_ylim(1e-5, 1)
    ax.set_xlabel("v_x / sqrt(kT/m)")
    ax.set_title(f"velocity distribution (KS p = {run['ks_p']:.3g})", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot(run["vacf_lag"], run["vacf"], "o-", ms=3)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("lag (time units)")
    ax.set_ylabel("<v(0).v(t)> / <v^2>")
    ax.set_title("velocity autocorrelation (KS frames are the last lag apart)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, "particles_langevin")


def _fig_state(run, nist) -> str:
    ncol = 3 if nist is None else 4
    fig, axes = plt.subplots(1, ncol, figsize=(5 * ncol, 4))
    ax = axes[0]
    ax.plot(run["t_all"], run["u_all"], lw=0.5)
    ax.axvline(run["equil"] * DT, color="k", ls=":", lw=0.8, label="end of equilibration")
    ax.axhline(ljref.thol2015_cs25_energy_per_particle(0.75, 1.0), color="C3", ls="--",
               lw=0.8, label="THOL15 EOS")
    ax.set_ylim(run["U"] - 0.3, run["U"] + 0.3)
    ax.set_xlabel("t")
    ax.set_ylabel("U/N (shifted)")
    ax.set_title("rho = 0.75, kT = 1, r_c = 2.5 cs, N = 864", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(run["ts"], run["p"], lw=0.4, alpha=0.4)
    ax.plot(run["ts"], np.cumsum(run["p"]) / np.arange(1, len(run["p"]) + 1), "k", lw=1,
            label=f"running mean (final {run['P']:.4f})")
    ax.axhline(ljref.thol2015_cs25_pressure(0.75, 1.0), color="C3", ls="--", lw=0.8,
               label="THOL15 EOS")
    ax.axhline(ljref.AT_MD_CS25[0]["P"], color="C2", ls=":", lw=0.8, label="A&T MD")
    ax.set_xlabel("t")
    ax.set_ylabel("P (virial, instantaneous)")
    ax.set_title("pressure, production frames", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[2]
    for name, rows in run["blocking"].items():
        b, err = zip(*rows, strict=True)
        ax.semilogx(b, np.asarray(err) / err[0], "o-", label=name)
    ax.set_xlabel("number of blocks")
    ax.set_ylabel("standard error / error with 5 blocks")
    ax.set_title("blocking check (a plateau means blocks are long enough)", fontsize=10)
    ax.legend(fontsize=8)
    if nist is not None:
        ax = axes[3]
        r = nist["run"]
        ax.plot(r["ts"], r["u"] + nist["u_tail"], lw=0.5)
        ax.axhline(nist["ref"]["U"], color="C3", ls="--", lw=0.8, label="NIST MC")
        ax.set_xlabel("t")
        ax.set_ylabel("U/N (unshifted + tail)")
        ax.set_title("rho = 0.776, kT = 0.9, r_c = 3 c + tail, N = 500", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, "particles_lj_state")


def _fig_gravity(grav) -> str:
    fig, axes = plt.subplots(1, len(grav) + 1, figsize=(5 * (len(grav) + 1), 4))
    g0 = grav[0]
    ax = axes[0]
    for b in range(3):
        ax.plot(g0["ref"][:, b, 0], g0["ref"][:, b, 1], lw=2.5, alpha=0.4)
    ax.set_aspect("equal")
    ax.set_title("figure-eight: scipy reference (one period)", fontsize=10)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    for ax, g in zip(axes[1:], grav, strict=True):
        for r in g["runs"]:
            ax.semilogy(g["times"][1:], r["err_t"][1:], lw=1, label=f"dt = {r['dt']:.3g}")
        ax.set_xlabel("t")
        ax.set_ylabel("max_i |x_i - x_i,ref|")
        ax.set_title(f"{g['sys']['name']} vs {g['sys']['ref']} (order {g['order']:.2f})",
                     fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, "particles_gravity")


# --------------------------------------------------------------------------------------
# report


def _pm(value, err, digits=4):
    return f"{value:.{digits}f} ± {err:.{digits}f}"


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    cfg = _config(quick)
    nve = _nve(cfg)
    state = _state_point(cfg)
    nist = _nist_point(cfg) if cfg["nist"] else None
    grav = _gravity(cfg)

    body = [__doc__.split("\n\n", 1)[1].strip(), ""]
    findings = []

    # 1. NVE
    fig = _fig_nve(nve)
    body += [
        "### 6.1 NVE energy conservation", "",
        f"N = {nve['n']} (fcc {cfg['nve_cells']}^3 cells), box {nve['box']:.4f}, "
        f"LJ cs r_c = 2.5, skin {SKIN}, dt = {DT}: {cfg['melt_steps']} Langevin steps at "
        f"kT = 1.44, {cfg['cool_steps']} at kT = 0.722 (gamma = 1), momentum removed, then "
        f"{nve['steps']} velocity-Verlet steps, saved every {cfg['nve_save']}.", "",
        md_table(["quantity", "value"], [
            ["E0/N (shifted U + K)", f"{nve['e0']:.5f}"],
            ["mean kT during NVE (3(N-1) dof)", f"{nve['kT']:.4f}"],
            ["max abs(E(t) - E0) / abs(E0)", nve["max_rel"]],
            ["final abs(E - E0) / abs(E0)", nve["final_rel"]],
            ["linear drift rate of (E - E0)/abs(E0) (1/time)", nve["slope"]],
            ["abs(P(0)) after momentum removal", nve["p0"]],
            ["max abs(P(t) - P(0))", nve["dmom"]],
            ["  the same / sqrt(N m kT)", nve["dmom_scaled"]],
            ["neighbour-list builds during NVE", nve["builds"]],
            ["  steps per build", f"{nve['steps'] / max(nve['builds'], 1):.1f}"],
            ["reallocations", nve["reallocations"]],
            ["list capacity / cell grid", f"{nve['capacity']} / {nve['grid']}"],
            ["MSD at the end (sigma^2); D = MSD / 6t",
             f"{nve['msd']:.3f}; {nve['diffusion']:.4f}"],
            ["result code", nve["result"]],
            ["wall time: equilibration / NVE (incl. compilation)",
             f"{nve['equil_seconds']:.1f} s / {nve['seconds']:.1f} s"],
            ["NVE time per step", f"{nve['ms_per_step']:.2f} ms"],
        ]), "",
        f"![NVE energy]({fig})", "",
    ]
    ok = nve["max_rel"] < DRIFT_TARGET
    findings.append(
        f"Particles NVE ({nve['n']} LJ atoms, {nve['steps']} steps of dt = {DT}, float64): "
        f"max relative energy error {fmt(nve['max_rel'])} "
        f"({'within' if ok else 'ABOVE'} the 1e-4 target), drift rate "
        f"{fmt(nve['slope'])}/time; momentum change {fmt(nve['dmom'])} "
        f"({'round-off' if nve['dmom_scaled'] < MOMENTUM_TOL else 'ABOVE round-off level'}); "
        f"{nve['builds']} list builds, {nve['reallocations']} reallocations; "
        f"{nve['ms_per_step']:.1f} ms/step.")
    if nve["msd"] < LIQUID_MSD:
        findings.append(f"Particles NVE: MSD {fmt(nve['msd'])} sigma^2 below "
                        f"{LIQUID_MSD:g}: the system may not have melted.")

    # 2. Langevin
    fig = _fig_langevin(state)
    z_t, _ = _z(state["T"], state["T_err"], state["kT"], 0.0)
    z_te, _ = _z(state["T"], state["T_err"], state["T_expected"], 0.0)
    body += [
        "### 6.2 Langevin thermostat (BAOAB)", "",
        f"Production frames of the state-point run below (N = {state['n']}, kT = "
        f"{state['kT']}, gamma = 1, {state['prod']} steps after {state['equil']} of "
        f"equilibration, saved every {state['save_every']}). {ERROR_TEXT} BAOAB's "
        "velocities at the end of a step are not exactly Maxwell-Boltzmann: for a harmonic "
        "oscillator their temperature is kT (1 - h^2 omega^2 / 4) exactly (Leimkuhler & "
        "Matthews 2013; checked numerically while writing this part), while positions are "
        "sampled exactly. With omega^2 = <abs(F)^2> / (3 N m kT) from the frames this gives "
        "the expected kinetic temperature below; the verdict compares with it.", "",
        md_table(["quantity", "value"], [
            ["mean 2K / 3N", _pm(state["T"], state["T_err"])],
            ["kT; (mean - kT) / standard error", f"{state['kT']}; {z_t:+.2f}"],
            ["omega^2 = <abs(F)^2> / (3 N m kT)", f"{state['omega2']:.1f}"],
            ["expected kT (1 - h^2 omega^2 / 4); (mean - expected) / standard error",
             f"{state['T_expected']:.5f}; {z_te:+.2f}"],
            ["KS test of v_x / sqrt(kT/m) vs N(0,1): statistic, p-value",
             f"{state['ks_stat']:.5f}, {state['ks_p']:.3g}"],
            ["  samples (frames x atoms), frame spacing",
             f"{state['ks_n']} ({state['ks_frames']} x {state['n']}), "
             f"{state['ks_stride']:.3g} time units"],
            ["  VACF at that spacing", f"{state['vacf'][-1]:+.4f}"],
            ["  sample std of v_x / sqrt(kT/m)", f"{state['ks_std']:.5f}"],
        ]), "",
        f"![Langevin]({fig})", "",
    ]
    findings.append(
        f"Particles Langevin (N = {state['n']}, BAOAB, dt = {DT}): mean kinetic temperature "
        f"{_pm(state['T'], state['T_err'])} vs kT = {state['kT']} ({z_t:+.1f} sigma) and vs "
        f"the BAOAB expectation kT (1 - h^2 omega^2 / 4) = {state['T_expected']:.4f} "
        f"({z_te:+.1f} sigma, {'pass' if abs(z_te) < N_SIGMA else 'FAIL'}); "
        "KS test of v_x against N(0, kT/m) "
        f"on {state['ks_n']} samples: p = {state['ks_p']:.3g} "
        f"({'pass' if state['ks_p'] > KS_ALPHA else 'FAIL'}, threshold {KS_ALPHA}).")

    # 3. state point
    fig = _fig_state(state, nist)
    u_eos = float(ljref.thol2015_cs25_energy_per_particle(0.75, 1.0))
    p_eos = float(ljref.thol2015_cs25_pressure(0.75, 1.0))
    at = ljref.AT_MD_CS25[0]
    refs = [("U/N", state["U"], state["U_err"], "THOL15 cs EOS", u_eos, EOS_UNC["U"]),
            ("U/N", state["U"], state["U_err"], "A&T md_nvt_lj_ll N = 864", at["U"],
             at["U_unc"]),
            ("P", state["P"], state["P_err"], "THOL15 cs EOS", p_eos, EOS_UNC["P"]),
            ("P", state["P"], state["P_err"], "A&T md_nvt_lj_ll N = 864", at["P"],
             at["P_unc"]),
            ("P with rho kT", state["P2"], state["P2_err"], "THOL15 cs EOS", p_eos,
             EOS_UNC["P"]),
            ("P with rho kT", state["P2"], state["P2_err"], "A&T md_nvt_lj_ll N = 864", at["P"],
             at["P_unc"])]
    rows, verdicts = [], []
    for q, val, err, name, refv, refe in refs:
        z, comb = _z(val, err, refv, refe)
        rows.append([q, _pm(val, err), name, _pm(refv, refe), f"{val - refv:+.4f}",
                     f"{comb:.4f}", f"{z:+.2f}", "pass" if abs(z) < N_SIGMA else "FAIL"])
        verdicts.append((q, name, z))
    blk_rows = []
    for name, pts in state["blocking"].items():
        blk_rows.append([name] + [f"{e:.2e}" for _, e in pts])
    n_blk = [b for b, _ in next(iter(state["blocking"].values()))]
    body += [
        "### 6.3 LJ state point rho = 0.75, T = 1.0, r_c = 2.5 truncated and shifted", "",
        f"N = {state['n']} (fcc 6^3), box {state['box']:.4f}, BAOAB Langevin at kT = 1.0, "
        f"gamma = 1, dt = {DT}, {state['equil']} equilibration + {state['prod']} production "
        f"steps ({len(state['u'])} frames, every {state['save_every']} steps). U/N is the "
        "shifted pair energy per atom; P the mean of `sp.pressure` (2K + W) / 3V with the "
        "instantaneous kinetic energy, no tail and no impulsive term (\"P with rho kT\": the "
        "same with the exact kinetic term rho kT, free of BAOAB's kinetic bias). The reference "
        "uncertainty of the THOL15 EOS is an assumption (lj_reference.py gives none): "
        f"{EOS_UNC['U']} in U/N and {EOS_UNC['P']} in P, about the EOS - MD difference in "
        f"Allen & Tildesley's guide. {ERROR_TEXT} Pass if within "
        f"{N_SIGMA:g} combined standard errors.", "",
        md_table(["quantity", "simlib", "reference", "value", "difference", "combined error",
                  "difference / error", "verdict"], rows), "",
        "Blocking check (standard error against the number of blocks; roughly constant "
        "values mean the blocks are longer than the correlation time):", "",
        md_table(["quantity"] + [f"{b} blocks" for b in n_blk], blk_rows), "",
        f"Run: {state['builds']} neighbour-list builds, {state['reallocations']} "
        f"reallocations, result code {state['result']}; {state['sim_seconds']:.1f} s of "
        f"simulation ({state['ms_per_step']:.2f} ms/step incl. compilation), "
        f"{state['p_seconds']:.1f} s for the pressures of all frames.", "",
    ]
    findings.append(
        f"Particles LJ state point (rho 0.75, T 1.0, r_c 2.5 cs, N 864, {state['prod']} "
        f"production steps): U/N = {_pm(state['U'], state['U_err'])}, P = "
        f"{_pm(state['P'], state['P_err'])}; vs THOL15 EOS (-4.4287, 0.9897) and A&T MD "
        "(-4.427(2), 0.994(3)): "
        + ", ".join(f"{q} vs {name.split()[0]} {z:+.1f} sigma" for q, name, z in verdicts)
        + (" (all within 3 sigma)." if all(abs(z) < N_SIGMA for *_, z in verdicts)
           else " (NOT all within 3 sigma)."))

    if nist is not None:
        r, ref = nist["run"], nist["ref"]
        nrows = []
        nz = []
        for label, key in (("MD as sampled (cs ensemble)", ""),
                           ("reweighted to the c ensemble", "w")):
            for q, refv, refe in (("U/N", ref["U"], ref["U_unc"]),
                                  ("P", ref["P"], ref["P_unc"])):
                val, err = nist[q[0] + key], nist[q[0] + key + "_err"]
                z, comb = _z(val, err, refv, refe)
                nz.append((label, q, z))
                nrows.append([label, q, _pm(val, err), _pm(refv, refe), f"{val - refv:+.4f}",
                              f"{z:+.2f}", "pass" if abs(z) < N_SIGMA else "FAIL"])
        body += [
            "#### NIST SRSW point T = 0.90, rho = 0.776, r_c = 3.0 truncated, tails added", "",
            f"N = {r['n']} (fcc 5^3), BAOAB at kT = 0.9, {r['equil']} + {r['prod']} steps, "
            "`shift=False` (forces and pair sum of the truncated model). U/N = unshifted pair "
            f"sum / N + U_tail ({nist['u_tail']:.5f}); P = mean of `sp.pressure` + P_tail "
            f"({nist['p_tail']:.5f}); no impulsive term (lj_reference.py). MD with truncated "
            "forces samples exp(-U_cs/kT), NIST's Monte Carlo samples the truncated (c) model "
            "U_c = U_cs + u(r_c) N_pairs; the second pair of rows reweights the same frames "
            "by exp(-u(r_c) N_pairs / kT) (N_pairs inside r_c: "
            f"{nist['pairs_mean']:.0f} ± {nist['pairs_std']:.0f} per frame, effective "
            f"sample fraction {nist['ess'] / nist['n_frames']:.2f}). Mean "
            f"2K/3N {_pm(nist['T'], nist['T_err'])}. {r['sim_seconds']:.1f} s "
            f"({r['ms_per_step']:.2f} ms/step; the box is under 3 (r_c + skin) wide, so "
            "the list is built from all pairs).", "",
            md_table(["estimate", "quantity", "simlib", "NIST MC", "difference",
                      "difference / error", "verdict"], nrows), "",
        ]
        findings.append(
            f"Particles NIST point (T 0.9, rho 0.776, r_c 3 + tails, N 500, {r['prod']} "
            f"steps): U/N = {_pm(nist['U'], nist['U_err'])}, P = "
            f"{_pm(nist['P'], nist['P_err'])} vs NIST -5.4689(4), 0.2406(27): "
            + ", ".join(f"{q} {z:+.1f} sigma" for lab, q, z in nz if lab.startswith("MD"))
            + "; reweighted to the c ensemble: "
            + ", ".join(f"{q} {z:+.1f} sigma" for lab, q, z in nz if lab.startswith("re"))
            + (" (all within 3 sigma)." if all(abs(z) < N_SIGMA for *_, z in nz)
               else " (NOT all within 3 sigma)."))
    body += [f"![LJ state points]({fig})", ""]

    # 4. gravity
    fig = _fig_gravity(grav)
    body += ["### 6.4 Gravity: N-body orbits against scipy and the Kepler closed form", ""]
    body += [f"- **{g['sys']['name']}**: {g['sys']['description']}." for g in grav]
    body += [
        "",
        "simlib: `sp.simulate` with `pair_energy(gravity, free())`, NVE (velocity Verlet), "
        "fixed dt = t1 / steps. Reference: scipy DOP853 at rtol = atol = 1e-12 on the numpy "
        "equations (its distance to a 1e-10 solution is listed as an accuracy bound), or the "
        "closed-form Kepler orbit (listed: its return error after one period). Errors are "
        "max over bodies of the position error, at the saved times of the coarsest run.", "",
    ]
    rows = []
    for g in grav:
        for i, r in enumerate(g["runs"]):
            rows.append([g["sys"]["name"], r["n_steps"], r["dt"], r["max_err"], r["final_err"],
                         r["energy_err"],
                         f"{g['pair_orders'][i - 1]:.2f}" if i else "-",
                         f"{r['seconds']:.2f}"])
    body += [
        md_table(["system", "steps", "dt", "max position error", "error at t1",
                  "max rel. energy error", "order vs previous dt", "wall s"], rows), "",
        md_table(["system", "fitted order (3 dt)", "reference accuracy bound",
                  "reference time s"],
                 [[g["sys"]["name"], f"{g['order']:.3f}", g["ref_check"],
                   f"{g['ref_seconds']:.2f}"] for g in grav]), "",
        f"![gravity]({fig})", "",
    ]
    for g in grav:
        ok = abs(g["order"] - 2) < ORDER_TOL
        finest = g["runs"][-1]
        findings.append(
            f"Particles gravity ({g['sys']['name']} vs {g['sys']['ref']}): max position error "
            + " -> ".join(fmt(r["max_err"]) for r in g["runs"])
            + f" for dt / 2 each; order {g['order']:.2f} "
            f"({'second order as expected' if ok else 'NOT the expected 2'}); finest run "
            f"energy error {fmt(finest['energy_err'])}.")

    checks = Checks("particles")
    checks.add("NVE max |E - E0|/|E0|", nve["max_rel"], DRIFT_TARGET, "rel",
               nve["max_rel"] < DRIFT_TARGET,
               f"particles: NVE energy error {fmt(nve['max_rel'])} above {DRIFT_TARGET:g}",
               op="<")
    checks.add("NVE momentum change / sqrt(N m kT)", nve["dmom_scaled"], MOMENTUM_TOL,
               "scaled", nve["dmom_scaled"] < MOMENTUM_TOL,
               f"particles: NVE momentum change {fmt(nve['dmom_scaled'])} (scaled) "
               f"above round-off ({MOMENTUM_TOL:g})", op="<")
    checks.add("NVE mean squared displacement (melted)", nve["msd"], LIQUID_MSD, "sigma^2",
               nve["msd"] >= LIQUID_MSD,
               f"particles: NVE MSD {fmt(nve['msd'])} below {LIQUID_MSD:g} (not melted)",
               op=">=")
    checks.add("NVE result code", int(nve["result"]), 0, "code", int(nve["result"]) == 0,
               f"particles: NVE run ended with result code {nve['result']}", op="==")
    checks.add("Langevin temperature vs BAOAB expectation", float(z_te), N_SIGMA, "|z|",
               abs(z_te) < N_SIGMA, f"particles: Langevin temperature {z_te:+.1f} sigma "
               "from the BAOAB expectation", op="<")
    checks.add("Langevin velocity KS test", state["ks_p"], KS_ALPHA, "p", state["ks_p"] > KS_ALPHA,
               f"particles: Langevin velocity KS test p = {state['ks_p']:.3g}", op=">")
    for q, name, z in verdicts:
        checks.add(f"LJ state point {q} vs {name}", float(z), N_SIGMA, "|z|", abs(z) < N_SIGMA,
                   f"particles: LJ state point {q} vs {name} {z:+.1f} sigma", op="<")
    if nist is not None:
        for lab, q, z in nz:
            checks.add(f"NIST point {q} ({lab})", float(z), N_SIGMA, "|z|", abs(z) < N_SIGMA,
                       f"particles: NIST point {q} ({lab}) {z:+.1f} sigma", op="<")
    for g in grav:
        checks.add(f"gravity {g['sys']['name']}: Verlet order", g["order"],
                   f"2 +- {ORDER_TOL:g}", "order", abs(g["order"] - 2) < ORDER_TOL,
                   f"particles: gravity {g['sys']['name']} order {g['order']:.2f}, not 2",
                   op="in")

    data = dict(
        nve={k: v for k, v in nve.items() if not isinstance(v, np.ndarray)},
        state={k: state[k] for k in ("n", "U", "U_err", "P", "P_err", "T", "T_err", "ks_p",
                                     "ks_stat", "ks_n", "prod", "equil")},
        gravity=[dict(name=g["sys"]["name"], order=g["order"],
                      max_err=[r["max_err"] for r in g["runs"]]) for g in grav],
    )
    if nist is not None:
        data["nist"] = {k: nist[k] for k in ("U", "U_err", "P", "P_err", "Uw", "Uw_err", "Pw",
                                             "Pw_err", "T", "T_err", "ess")}
    return Section(title="6. Particle dynamics", body="\n".join(body), findings=findings,
                   data=data, seconds=time.perf_counter() - start, failures=checks.failures,
                   checks=checks.checks)
