"""Part 8: stochastic differential equations (``sl.solve(..., diffusion=, key=)``) against
exact solutions on the same Brownian path, closed-form moments and distributions, and
Kramers' escape rate.

Four checks, in float64 on the CPU; every Brownian path is simlib's own
(``sl.BrownianPath``, the very path a solve with the same key uses), so an exact solution
can be evaluated on the path a method integrated:

1. **Strong orders.** Geometric Brownian motion ``dX = mu X dt + sigma X dW`` (mu = 2,
   sigma = 1, X0 = 1, T = 1; the test problem of Higham, SIAM Review 43, 525 (2001)) has
   the exact Ito solution ``X0 exp((mu - sigma^2/2) T + sigma W_T)`` (Stratonovich:
   ``X0 exp(mu T + sigma W_T)``). The strong error ``E|X_N - X(T)|`` over an ensemble at
   ``dt = 2^-k`` gives the order as the least-squares slope of log error against log dt:
   Euler-Maruyama 0.5, Milstein 1.0, StochasticHeun (Stratonovich; scalar noise is
   commutative) 1.0. SRA1 (order 1.5 for additive noise) runs on the additive-noise problem
   ``dX = (sin X - X) dt + dW`` (X0 = 1, T = 1), against a reference computed in numpy on
   the same path by a different method at a 32 times finer step than the finest tested,
   the order-1.5 Ito-Taylor scheme (Kloeden and Platen 1992, 10.4.1), from the path's
   exact increments and interval integrals ``int W ds``; Euler-Maruyama on it (additive
   noise: order 1.0) is checked too.
   A nonlinear drift is needed: with a linear one (Ornstein-Uhlenbeck) the order-2 error
   term vanishes and SRA1 converges faster (shown, in the full run, against the exact OU
   solution on the path). Standard errors of the slopes come from a bootstrap over the
   paths. Pass: within 0.1 of theory.
2. **Weak order.** On the same GBM, the weak error ``E[X_N] - E[X(T)]`` is estimated as the
   mean of ``X_N - X(T)`` on the same paths (an unbiased estimator whose variance is the
   strong error's, not the solution's); ``E[X(T)] = X0 e^{mu T}``. For Euler-Maruyama and
   Milstein ``E[X_N] = X0 (1 + mu dt)^N`` exactly, so the estimate is also compared with the
   closed-form bias (a z-score per dt). Pass: measured order within 0.1 of 1, |z| < 4.
3. **Ornstein-Uhlenbeck statistics.** ``dX = -theta (X - m) dt + sigma dW`` (theta = 1,
   m = 0, sigma = 0.5, X0 = 2) by Euler-Maruyama, dt = 2^-8, an ensemble of independent
   paths saved every 0.5 up to t = 10: sample mean and variance against
   ``m + (X0 - m) e^{-theta t}`` and ``sigma^2 (1 - e^{-2 theta t}) / (2 theta)`` (z-scores;
   the O(dt) bias of the scheme, relative theta dt / 2 = 0.2 % on the stationary variance
   and theta^2 dt t / 2 on the decaying part of the mean, is at most 0.6 standard errors of
   20,000 paths), and a Kolmogorov-Smirnov test of the ensemble at
   t = 10 against the stationary law ``N(m, sigma^2 / (2 theta))`` (scipy.stats.kstest; at
   t = 5 the mean 2 e^{-5} = 0.013 is still 0.04 standard deviations off, which 20,000
   paths detect). Negative control: the
   same run with the diffusion ``sigma / sqrt(2)`` (the classic slip of a missing factor 2
   in ``sqrt(2 gamma kT)``) must fail the KS test. Pass: every |z| < 4, KS p > 1e-3, and the
   control's p < 1e-3.
4. **Kramers escape.** Overdamped motion in the double well ``U(x) = dU (x^2 - 1)^2``,
   ``dX = -U'(X) dt + sqrt(2 kT) dW`` (dU = 1, kT = 0.2: barrier dU/kT = 5), from the left
   minimum; the escape time is the first saved time (every 0.04) with ``X >= 0.8``, a point
   past the barrier from which a path returns to the left well with negligible probability
   (a closer exit, such as 0.5, is missed between saves by the few paths that touch it and
   fall back). SRA1 at dt = 0.01 (additive noise). The rate is the maximum-likelihood
   estimate with censoring at ``t_max`` (events / total time at risk; standard error
   rate / sqrt(events)). References: Kramers' formula in the Smoluchowski (overdamped) limit
   (Kramers, Physica 7, 284 (1940); Hänggi, Talkner and Borkovec, Rev. Mod. Phys. 62, 251
   (1990), with gamma = m = 1)
   ``k_K = sqrt(U''(-1) |U''(0)|) / (2 pi) e^{-dU/kT} = (4 sqrt(2) dU / 2 pi) e^{-dU/kT}``,
   and the exact mean first-passage time of the same diffusion to ``x = 0.8``
   (``tau = (1/kT) int_{-1}^{0.8} dy e^{U(y)/kT} int_{-inf}^y dz e^{-U(z)/kT}``, Gardiner,
   Stochastic Methods, 5.5.1; scipy.integrate.quad). Kramers' formula is the leading term
   of tau's expansion in kT/dU; at dU/kT = 5 the exact 1/tau is 9.3 % below it (the
   finite-barrier bias of the formula, computed, not fitted; it shrinks only like kT/dU:
   still 5.4 % at dU/kT = 8). Pass: the simulated rate
   within 3.5 standard errors of 1/tau; the z-score against k_K is reported.

Thresholds are fixed in the code before any run.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from scipy import integrate, stats

import simlib as sl
from simlib import systems

from .common import Checks, Section, fmt, md_table, save_figure

ORDER_TOL = 0.1  # |measured - theoretical| order (issue 14)
Z_MAX = 4.0  # moment z-scores (about 40 of them: family-wise false alarm ~ 3e-3)
KS_ALPHA = 1e-3  # the KS test passes above, the negative control must fall below
KRAMERS_Z = 3.5  # simulated rate against the exact mean first-passage time
BOOTSTRAP = 200

GBM = dict(mu=2.0, sigma=1.0, x0=1.0, T=1.0)
NONLINEAR = dict(sigma=1.0, x0=1.0, T=1.0)
OU_ADD = dict(theta=2.0, m=0.5, sigma=1.0, x0=1.5, T=1.0)
OU_STAT = dict(theta=1.0, m=0.0, sigma=0.5, x0=2.0, T=10.0, dt=2.0**-8, save=0.5)
KRAMERS = dict(dU=1.0, kT=0.2, x0=-1.0, exit=0.8, dt=0.01, save_every=4,
               segment_steps=4096)


def _config(quick: bool) -> dict:
    if quick:
        return dict(strong_paths=1000, strong_ks=range(4, 10), sra_ks=range(3, 8),
                    weak_paths=20000, weak_ks=range(4, 9), ou_orders=False, ou_paths=5000,
                    ou_chunk=2500, kramers_paths=400, kramers_tmax_tau=3.0)
    return dict(strong_paths=4000, strong_ks=range(4, 12), sra_ks=range(3, 10),
                weak_paths=100000, weak_ks=range(4, 10), ou_orders=True, ou_paths=20000,
                ou_chunk=2500, kramers_paths=2000, kramers_tmax_tau=4.0)


# --------------------------------------------------------------------------------------
# problems (drift and diffusion written for any state shape)


gbm_drift = systems.geometric_brownian_motion_drift
gbm_diffusion = systems.geometric_brownian_motion_diffusion
ou_drift = systems.ornstein_uhlenbeck_drift
ou_diffusion = systems.ornstein_uhlenbeck_diffusion


def nonlinear_a(x):
    """``a = sin x - x`` and its first two derivatives (numpy)."""
    return np.sin(x) - x, np.cos(x) - 1.0, -np.sin(x)


def nonlinear_drift(t, x, args):
    return jnp.sin(x) - x


def additive_diffusion(t, x, args):
    (sigma,) = args
    return sigma * jnp.ones_like(x)


def well_drift(t, x, args):
    """``-U'(x)`` for ``U = dU (x^2 - 1)^2``."""
    dU, _ = args
    return -4.0 * dU * x * (x * x - 1.0)


def well_diffusion(t, x, args):
    _, kT = args
    return jnp.sqrt(2.0 * kT) * jnp.ones_like(x)


# --------------------------------------------------------------------------------------
# closed forms


def ou_mean_var(p: dict, t):
    """Mean and variance of the OU process at ``t`` from ``x0`` (numpy arrays)."""
    m, v = systems.ornstein_uhlenbeck_moments(p["x0"], np.asarray(t, float),
                                              (p["theta"], p["m"], p["sigma"]))
    return np.asarray(m), np.asarray(v)


def kramers_rate(dU: float, kT: float) -> float:
    """Kramers' Smoluchowski-limit rate out of a minimum of ``dU (x^2 - 1)^2`` (gamma = 1):
    ``sqrt(U''(-1) |U''(0)|) / (2 pi) e^{-dU/kT}`` with ``U''(-1) = 8 dU``, ``U''(0) = -4 dU``."""
    return math.sqrt(8.0 * dU * 4.0 * dU) / (2.0 * math.pi) * math.exp(-dU / kT)


def mean_first_passage(dU: float, kT: float, x0: float, b: float) -> float:
    """Exact mean first-passage time from ``x0`` to ``b > x0`` of
    ``dX = -U'(X) dt + sqrt(2 kT) dW``, reflecting at -infinity (Gardiner, 5.5.1)."""
    def u(x):
        return dU * (x * x - 1.0) ** 2 / kT

    def inner(y):
        return integrate.quad(lambda z: math.exp(-u(z)), -np.inf, y, epsabs=0.0,
                              epsrel=1e-12, limit=200)[0]

    points = [p for p in (-1.0, 0.0) if x0 < p < b]
    val = integrate.quad(lambda y: math.exp(u(y)) * inner(y), x0, b, epsabs=0.0,
                         epsrel=1e-11, limit=200, points=points or None)[0]
    return val / kT


# --------------------------------------------------------------------------------------
# 1-2. strong and weak orders


def _static_runner(solver, drift, diffusion, x0, T, dt):
    def one(key, args):
        sol = sl.solve(drift, jnp.asarray(x0, jnp.float64), 0.0, T, solver=solver, dt=dt,
                       diffusion=diffusion, key=key, args=args, saveat=sl.SaveAt(t1=True))
        return sol.ys[-1]

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def _final_values(solver, drift, diffusion, x0, T, dts, keys, args):
    """``X_N`` at ``T`` of every path (one key each) for every ``dt``: ``(paths, len(dts))``.

    One compilation per method: ``dt`` is traced, with ``max_steps = T / min(dts)`` (the
    path is then built to that depth; its values at the dyadic step points are the same at
    any depth). If the traced run reports a failure or a non-finite value (SRA1 with a traced
    ``dt`` does on this checkout of the core: its padding steps of length 0 divide ``dZ`` by
    ``h = 0``), every ``dt`` is run with its own static compilation instead.
    """
    max_steps = int(round(T / min(dts)))

    def one(key, args, dt):
        sol = sl.solve(drift, jnp.asarray(x0, jnp.float64), 0.0, T, solver=solver, dt=dt,
                       diffusion=diffusion, key=key, args=args, saveat=sl.SaveAt(t1=True),
                       max_steps=max_steps, throw=False)
        return sol.ys[-1], sol.result

    traced = jax.jit(jax.vmap(one, in_axes=(0, None, None)))
    cols = []
    for dt in dts:
        x, result = traced(keys, args, jnp.float64(dt))
        x = np.asarray(x)
        if np.any(np.asarray(result) != 0) or not np.all(np.isfinite(x)):
            return np.stack([np.asarray(_static_runner(solver, drift, diffusion, x0, T, dt)(
                keys, args)) for dt in dts], axis=1), "static dt"
        cols.append(x)
    return np.stack(cols, axis=1), "traced dt"


def _w_at(keys, T):
    """``W(T)`` of each key's path (the root increment; the same at any depth)."""
    return np.asarray(jax.vmap(
        lambda k: sl.BrownianPath(k, 0.0, T, shape=(), levels=0).evaluate(T))(keys))


def _fine_path(keys, T, levels, chunk=500):
    """``W`` and ``int_0^t W ds`` of each key's path at the ``2^levels + 1`` dyadic times,
    yielded for chunks of ``chunk`` keys: ``(ts, w, integral)``."""
    ts = jnp.linspace(0.0, T, 2**levels + 1)

    def one(k):
        path = sl.BrownianPath(k, 0.0, T, shape=(), levels=levels, area=True)
        return jax.vmap(path.evaluate)(ts), jax.vmap(path.time_integral)(ts)

    fn = jax.jit(jax.vmap(one))
    for start in range(0, keys.shape[0], chunk):
        w, integ = fn(keys[start:start + chunk])
        yield np.asarray(ts), np.asarray(w), np.asarray(integ)


def _ou_exact(keys, p, levels):
    """Exact OU solution at T on each key's path (module docstring)."""
    T, theta = p["T"], p["theta"]
    out = []
    for ts, w, integ in _fine_path(keys, T, levels):
        mid = 0.5 * (ts[1:] + ts[:-1])
        conv = np.diff(integ, axis=1) @ np.exp(-theta * (T - mid))
        e = math.exp(-theta * T)
        out.append(p["m"] + (p["x0"] - p["m"]) * e + p["sigma"] * (w[:, -1] - theta * conv))
    return np.concatenate(out)


def _taylor15_reference(keys, p, levels):
    """``X(T)`` of ``dX = a(X) dt + sigma dW`` on each key's path, by the strong order-1.5
    Ito-Taylor scheme for additive noise (Kloeden and Platen 1992, 10.4.1 with b constant):
    ``Y + a h + b dW + a' b dZ + (a a' + b^2 a''/2) h^2 / 2``, ``dZ = int (W_s - W_t) ds``,
    in numpy on the 2^levels dyadic intervals of the same path; also returns the same at half
    the resolution, as an estimate of the reference's own error."""
    b = p["sigma"]

    def integrate(ts, w, integ, stride):
        h = ts[stride] - ts[0]
        dw = w[:, stride::stride] - w[:, :-stride:stride]
        dz = integ[:, stride::stride] - integ[:, :-stride:stride] - h * w[:, :-stride:stride]
        y = np.full(w.shape[0], p["x0"])
        for j in range(dw.shape[1]):
            a, a1, a2 = nonlinear_a(y)
            y = (y + a * h + b * dw[:, j] + a1 * b * dz[:, j]
                 + 0.5 * (a * a1 + 0.5 * b * b * a2) * h * h)
        return y

    full, half = [], []
    for ts, w, integ in _fine_path(keys, p["T"], levels):
        full.append(integrate(ts, w, integ, 1))
        half.append(integrate(ts, w, integ, 2))
    return np.concatenate(full), np.concatenate(half)


def _slope_and_se(dts, err_matrix, rng):
    """Slope of log mean|e| vs log dt, and its bootstrap standard error over the paths."""
    ld = np.log(dts)
    slope = np.polyfit(ld, np.log(err_matrix.mean(axis=0)), 1)[0]
    m = err_matrix.shape[0]
    boots = [np.polyfit(ld, np.log(err_matrix[rng.integers(0, m, m)].mean(axis=0)), 1)[0]
             for _ in range(BOOTSTRAP)]
    return float(slope), float(np.std(boots))


def _orders(cfg):
    rng = np.random.default_rng(1)
    keys = sl.split_keys(jax.random.key(14), cfg["strong_paths"])
    g = GBM
    gargs = (jnp.float64(g["mu"]), jnp.float64(g["sigma"]))
    w_t = _w_at(keys, g["T"])
    ito = g["x0"] * np.exp((g["mu"] - 0.5 * g["sigma"] ** 2) * g["T"] + g["sigma"] * w_t)
    strat = g["x0"] * np.exp(g["mu"] * g["T"] + g["sigma"] * w_t)
    n = NONLINEAR
    nargs = (jnp.float64(n["sigma"]),)
    levels = max(cfg["sra_ks"]) + 5
    n_ref, n_ref_half = _taylor15_reference(keys, n, levels)
    studies = [  # name, method, problem, theory, reference, ks, gated
        ("EulerMaruyama", sl.EulerMaruyama(), "gbm", 0.5, ito, cfg["strong_ks"], True),
        ("Milstein", sl.Milstein(), "gbm", 1.0, ito, cfg["strong_ks"], True),
        ("StochasticHeun", sl.StochasticHeun(), "gbm", 1.0, strat, cfg["strong_ks"], True),
        ("SRA1", sl.SRA1(), "nonlinear", 1.5, n_ref, cfg["sra_ks"], True),
        ("EulerMaruyama", sl.EulerMaruyama(), "nonlinear", 1.0, n_ref, cfg["sra_ks"], True),
    ]
    if cfg["ou_orders"]:
        o = OU_ADD
        ou_ref = _ou_exact(keys, o, max(cfg["sra_ks"]) + 5)
        studies.append(("SRA1", sl.SRA1(), "ou", 1.5, ou_ref, cfg["sra_ks"], False))
    problems = {"gbm": (gbm_drift, gbm_diffusion, g["x0"], g["T"], gargs),
                "nonlinear": (nonlinear_drift, additive_diffusion, n["x0"], n["T"], nargs)}
    if cfg["ou_orders"]:
        problems["ou"] = (ou_drift, ou_diffusion, OU_ADD["x0"], OU_ADD["T"],
                          tuple(jnp.float64(OU_ADD[k]) for k in ("theta", "m", "sigma")))
    out = []
    for name, solver, prob, theory, ref, ks, gated in studies:
        dts = np.array([2.0**-k for k in ks])
        drift, diffusion, x0, T, args = problems[prob]
        xs, how = _final_values(solver, drift, diffusion, x0, T, dts, keys, args)
        errs = np.abs(xs - ref[:, None])
        slope, se = _slope_and_se(dts, errs, rng)
        out.append(dict(method=name, problem=prob, theory=theory, dts=dts,
                        errs=errs.mean(axis=0), err_se=errs.std(axis=0) / math.sqrt(len(ref)),
                        slope=slope, slope_se=se, how=how, gated=gated,
                        declared=getattr(solver, "strong_order", None),
                        ok=bool(abs(slope - theory) <= ORDER_TOL) or not gated))
    ref_err = float(np.mean(np.abs(n_ref - n_ref_half)))

    # weak order on GBM for EM and Milstein (closed-form mean of both: x0 (1 + mu dt)^N)
    weak = []
    keys_w = sl.split_keys(jax.random.key(15), cfg["weak_paths"])
    w_tw = _w_at(keys_w, g["T"])
    ito_w = g["x0"] * np.exp((g["mu"] - 0.5 * g["sigma"] ** 2) * g["T"] + g["sigma"] * w_tw)
    for name, solver in (("EulerMaruyama", sl.EulerMaruyama()), ("Milstein", sl.Milstein())):
        dts = np.array([2.0**-k for k in cfg["weak_ks"]])
        xs, _ = _final_values(solver, gbm_drift, gbm_diffusion, g["x0"], g["T"], dts, keys_w,
                              gargs)
        diff = xs - ito_w[:, None]
        est = diff.mean(axis=0)
        se = diff.std(axis=0, ddof=1) / math.sqrt(diff.shape[0])
        exact_bias = (g["x0"] * (1 + g["mu"] * dts) ** np.round(g["T"] / dts)
                      - g["x0"] * math.exp(g["mu"] * g["T"]))
        z = (est - exact_bias) / se
        slope = float(np.polyfit(np.log(dts), np.log(np.abs(est)), 1)[0])
        exact_slope = float(np.polyfit(np.log(dts), np.log(np.abs(exact_bias)), 1)[0])
        boots = []
        m = diff.shape[0]
        for _ in range(BOOTSTRAP):
            b = diff[rng.integers(0, m, m)].mean(axis=0)
            boots.append(np.polyfit(np.log(dts), np.log(np.abs(b)), 1)[0])
        weak.append(dict(method=name, dts=dts, est=est, se=se, exact=exact_bias, z=z,
                         slope=slope, slope_se=float(np.std(boots)), exact_slope=exact_slope,
                         declared=getattr(solver, "weak_order", None),
                         ok=bool(abs(slope - 1.0) <= ORDER_TOL
                                 and np.all(np.abs(z) < Z_MAX))))
    return out, weak, ref_err


def _fig_orders(strong, weak) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {("EulerMaruyama", "gbm"): ("C0", "o"), ("Milstein", "gbm"): ("C1", "s"),
              ("StochasticHeun", "gbm"): ("C2", "^"), ("SRA1", "nonlinear"): ("C3", "D"),
              ("EulerMaruyama", "nonlinear"): ("C4", "v"), ("SRA1", "ou"): ("C5", "P")}
    for r in strong:
        color, marker = styles[(r["method"], r["problem"])]
        a.errorbar(r["dts"], r["errs"], yerr=2 * r["err_se"], color=color, marker=marker,
                   ms=4, capsize=2, label=f"{r['method']} on {r['problem'].upper()}: "
                   f"{r['slope']:.3f} (theory {r['theory']:g})")
        xm = np.exp(np.mean(np.log(r["dts"])))
        ym = np.exp(np.mean(np.log(r["errs"])))
        xs = np.array([r["dts"].min(), r["dts"].max()])
        a.loglog(xs, ym * (xs / xm) ** r["theory"], color=color, ls=":", lw=1)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("dt")
    a.set_ylabel("strong error E|X_N - X(T)|")
    a.set_title("Strong error against the exact solution on the same path\n"
                "(dotted: theoretical slope; bars: 2 standard errors)", fontsize=9)
    a.legend(fontsize=7)
    for r, (color, marker) in zip(weak, (("C0", "o"), ("C1", "s")), strict=True):
        b.errorbar(r["dts"], np.abs(r["est"]), yerr=2 * r["se"], color=color, marker=marker,
                   ls="none", ms=5, capsize=2,
                   label=f"{r['method']}: measured {r['slope']:.3f}")
        b.loglog(r["dts"], np.abs(r["exact"]), color=color, lw=1,
                 label=f"closed form |x0(1+mu dt)^N - x0 e^(mu T)| (slope {r['exact_slope']:.3f})"
                 if color == "C0" else None)
    b.set_xscale("log")
    b.set_yscale("log")
    b.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    b.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    b.set_xlabel("dt")
    b.set_ylabel("weak error |E[X_N] - E[X(T)]|")
    b.set_title("Weak error on GBM (mu = 2, sigma = 1), estimated on the same paths",
                fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, "sde_orders")


# --------------------------------------------------------------------------------------
# 3. OU statistics


def _ou_ensemble(p, n_paths, sigma, key, chunk=4000):
    """Saved states ``(n_save + 1, n_paths)`` of the OU ensemble (one batched solve per
    chunk of paths, diagonal noise)."""
    ts = np.arange(0.0, p["T"] + 1e-12, p["save"])

    @jax.jit
    def block(key, x0, args):
        sol = sl.solve(ou_drift, x0, 0.0, p["T"], solver=sl.EulerMaruyama(), dt=p["dt"],
                       diffusion=ou_diffusion, key=key, args=args,
                       saveat=sl.SaveAt(ts=jnp.asarray(ts)))
        return sol.ys

    out = []
    args = (jnp.float64(p["theta"]), jnp.float64(p["m"]), jnp.float64(sigma))
    for i, start in enumerate(range(0, n_paths, chunk)):
        n = min(chunk, n_paths - start)
        x0 = jnp.full((n,), p["x0"], jnp.float64)
        if n != chunk and start:  # keep one compilation: pad the last chunk
            x0 = jnp.full((chunk,), p["x0"], jnp.float64)
        ys = np.asarray(block(jax.random.fold_in(key, i), x0, args))[:, :n]
        out.append(ys)
    return ts, np.concatenate(out, axis=1)


def _ou_checks(ts, ys, p):
    m, v = ou_mean_var(p, ts)
    n = ys.shape[1]
    mean, var = ys.mean(axis=1), ys.var(axis=1, ddof=1)
    c = ys - mean[:, None]
    mu4 = (c**4).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_mean = np.where(v > 0, (mean - m) / np.sqrt(v / n), 0.0)
        se_var = np.sqrt(np.maximum(mu4 - var * var * (n - 3) / (n - 1), 0.0) / n)
        z_var = np.where(v > 0, (var - v) / se_var, 0.0)
    m_inf = p["m"]
    s_inf = p["sigma"] / math.sqrt(2 * p["theta"])
    ks = stats.kstest(ys[-1], stats.norm(m_inf, s_inf).cdf)
    return dict(mean=mean, var=var, exact_mean=m, exact_var=v, z_mean=z_mean[1:],
                z_var=z_var[1:], ks_stat=float(ks.statistic), ks_p=float(ks.pvalue),
                n=n, final=ys[-1])


def _ou(cfg):
    p = OU_STAT
    key = jax.random.key(8)
    ts, ys = _ou_ensemble(p, cfg["ou_paths"], p["sigma"], key, cfg["ou_chunk"])
    good = _ou_checks(ts, ys, p)
    _, ys_bad = _ou_ensemble(p, cfg["ou_paths"], p["sigma"] / math.sqrt(2), jax.random.key(9),
                             cfg["ou_chunk"])
    bad = _ou_checks(ts, ys_bad, p)
    good["ok"] = bool(np.all(np.abs(good["z_mean"]) < Z_MAX)
                      and np.all(np.abs(good["z_var"]) < Z_MAX) and good["ks_p"] > KS_ALPHA)
    bad["rejected"] = bool(bad["ks_p"] < KS_ALPHA)
    return ts, good, bad


def _fig_ou(ts, good, bad) -> str:
    p = OU_STAT
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    n = good["n"]
    a = axes[0]
    tf = np.linspace(0, p["T"], 400)
    mf, vf = ou_mean_var(p, tf)
    a.plot(tf, mf, "k-", lw=1, label="exact mean")
    a.errorbar(ts, good["mean"], yerr=2 * np.sqrt(good["exact_var"] / n), fmt="o", ms=3,
               color="C0", label="sample mean (bars: 2 SE)")
    a2 = a.twinx()
    a2.plot(tf, vf, "k--", lw=1, label="exact variance")
    a2.plot(ts, good["var"], "s", ms=3, color="C1", label="sample variance")
    a2.plot(ts, bad["var"], "x", ms=4, color="C3", label="control: sigma/sqrt(2)")
    a.set_xlabel("t")
    a.set_ylabel("mean")
    a2.set_ylabel("variance")
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14),
             ncol=2)
    a.set_title(f"OU moments over time ({n} paths, Euler-Maruyama dt = 2^-8)", fontsize=9)
    b = axes[1]
    b.plot(ts[1:], good["z_mean"], "o", ms=3, label="z (mean)")
    b.plot(ts[1:], good["z_var"], "s", ms=3, label="z (variance)")
    b.axhspan(-Z_MAX, Z_MAX, color="0.9", zorder=0, label=f"pass band |z| < {Z_MAX:g}")
    b.set_xlabel("t")
    b.set_ylabel("z-score against the closed form")
    zmax = max(6.0, 1.1 * float(np.max(np.abs(np.concatenate([good["z_mean"], good["z_var"]])))))
    b.set_ylim(-zmax, zmax)
    b.legend(fontsize=7)
    b.set_title("z-scores of the moments", fontsize=9)
    c = axes[2]
    s_inf = p["sigma"] / math.sqrt(2 * p["theta"])
    xs = np.linspace(-4 * s_inf, 4 * s_inf, 300)
    c.hist(good["final"], bins=60, density=True, alpha=0.5, color="C0",
           label=f"t = {p['T']:g}: KS p = {good['ks_p']:.3g}")
    c.hist(bad["final"], bins=60, density=True, alpha=0.4, color="C3",
           label=f"control sigma/sqrt(2): KS p = {bad['ks_p']:.2g}")
    c.plot(xs, stats.norm(p["m"], s_inf).pdf(xs), "k-", lw=1.2,
           label="stationary N(m, sigma^2 / 2 theta)")
    c.set_xlabel("x")
    c.set_ylabel("density")
    c.legend(fontsize=7)
    c.set_title("Stationary distribution", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, "sde_ou")


# --------------------------------------------------------------------------------------
# 4. Kramers escape


def escape_times(n_paths: int, t_max: float, key, p: dict = KRAMERS, solver=None):
    """First saved time with ``X >= exit`` for each path (``inf`` if none by ``t_max``).

    The horizon is integrated in segments of ``segment_steps`` steps (a fresh key per
    segment, folded from ``key``: independent Brownian increments, so one Brownian path),
    one batched solve of the ``(n_paths,)`` state with diagonal noise each.
    """
    solver = solver or sl.SRA1()
    dt, seg = p["dt"], p["segment_steps"]
    span = seg * dt
    save_ts = np.arange(1, seg // p["save_every"] + 1) * p["save_every"] * dt
    args = (jnp.float64(p["dU"]), jnp.float64(p["kT"]))

    @jax.jit
    def segment(key, x0, args):
        # throw=False and a finiteness check here: SRA1 with SaveAt(ts=...) reports a
        # non-finite state although every saved value is finite (a zero-length step at the
        # save times divides dZ by h = 0), on this checkout of the core
        sol = sl.solve(well_drift, x0, 0.0, span, solver=solver, dt=dt,
                       diffusion=well_diffusion, key=key, args=args,
                       saveat=sl.SaveAt(ts=jnp.asarray(save_ts)), throw=False)
        return sol.ys

    x = jnp.full((n_paths,), p["x0"], jnp.float64)
    first = np.full(n_paths, np.inf)
    n_seg = math.ceil(t_max / span)
    for i in range(n_seg):
        ys = np.asarray(segment(jax.random.fold_in(key, i), x, args))
        if not np.all(np.isfinite(ys)):
            raise FloatingPointError(f"Kramers run: non-finite state in segment {i}")
        x = jnp.asarray(ys[-1])
        over = ys >= p["exit"]
        hit = over.any(axis=0) & ~np.isfinite(first)
        idx = np.argmax(over, axis=0)
        first[hit] = i * span + save_ts[idx[hit]]
        if np.isfinite(first).all():
            break
    first[first > t_max] = np.inf
    return first


def rate_mle(times, t_max):
    """Censored exponential MLE of the rate and its standard error."""
    esc = np.isfinite(times)
    events = int(esc.sum())
    exposure = float(np.where(esc, times, t_max).sum())
    rate = events / exposure
    return rate, rate / math.sqrt(max(events, 1)), events


def _kramers(cfg):
    p = KRAMERS
    tau = mean_first_passage(p["dU"], p["kT"], p["x0"], p["exit"])
    k_k = kramers_rate(p["dU"], p["kT"])
    t_max = cfg["kramers_tmax_tau"] * tau
    times = escape_times(cfg["kramers_paths"], t_max, jax.random.key(40))
    rate, se, events = rate_mle(times, t_max)
    z_exact = (rate - 1 / tau) / se
    z_k = (rate - k_k) / se
    return dict(tau=tau, k_kramers=k_k, k_exact=1 / tau, t_max=t_max, times=times,
                rate=rate, se=se, events=events, n=cfg["kramers_paths"], z_exact=z_exact,
                z_kramers=z_k, bias=(1 / tau) / k_k - 1,
                ok=bool(abs(z_exact) < KRAMERS_Z))


def _fig_kramers(r) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    p = KRAMERS
    xs = np.linspace(-1.6, 1.6, 300)
    a.plot(xs, p["dU"] * (xs**2 - 1) ** 2, "k-")
    a.axvline(p["exit"], color="C3", ls="--", lw=1, label=f"exit x = {p['exit']}")
    a.axhline(p["kT"], color="C0", ls=":", lw=1, label=f"kT = {p['kT']}")
    a.set_ylim(0, 2)
    a.set_xlabel("x")
    a.set_ylabel("U(x)")
    a.set_title(f"Double well U = dU (x^2 - 1)^2, dU/kT = {p['dU'] / p['kT']:g}", fontsize=9)
    a.legend(fontsize=8)
    t = np.sort(r["times"][np.isfinite(r["times"])])
    surv = 1.0 - np.arange(1, t.size + 1) / r["n"]
    b.step(t, np.maximum(surv, 1e-4), where="post", color="C0",
           label=f"simulated, {r['n']} paths: k = {r['rate']:.3e} +- {r['se']:.1e}")
    tt = np.linspace(0, r["t_max"], 200)
    b.plot(tt, np.exp(-r["k_exact"] * tt), "k-", lw=1,
           label=f"exact MFPT rate 1/tau = {r['k_exact']:.3e} (z = {r['z_exact']:+.2f})")
    b.plot(tt, np.exp(-r["k_kramers"] * tt), "C3--", lw=1,
           label=f"Kramers k_K = {r['k_kramers']:.3e} (z = {r['z_kramers']:+.2f})")
    b.set_yscale("log")
    b.set_ylim(max(0.5 * (1.0 - t.size / r["n"]), 0.5 / r["n"]), 1.05)
    b.set_xlabel("t")
    b.set_ylabel("fraction not yet escaped")
    b.set_title("Escape-time survival (SRA1, dt = 0.01)", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, "sde_kramers")


# --------------------------------------------------------------------------------------


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    cfg = _config(quick)
    body = [__doc__.split("\n\n", 1)[1].strip(), ""]
    findings = []
    checks = Checks("sde")
    data = {}

    t = time.perf_counter()
    strong, weak, ref_err = _orders(cfg)
    t_orders = time.perf_counter() - t
    fig = _fig_orders(strong, weak)
    rows = []
    for r in strong:
        verdict = "ok" if abs(r["slope"] - r["theory"]) <= ORDER_TOL else (
            "**FAIL**" if r["gated"] else "higher (not gated: see below)"
            if r["slope"] > r["theory"] else "low (not gated)")
        rows.append([r["method"], r["problem"].upper(), r["theory"], fmt(r["declared"]),
                     f"{r['slope']:.3f} +- {r['slope_se']:.3f}",
                     f"2^-{int(round(-np.log2(r['dts'].max())))}..2^-"
                     f"{int(round(-np.log2(r['dts'].min())))}", r["how"], verdict])
        checks.add(f"strong order of {r['method']} on {r['problem']}", r["slope"],
                   f"{r['theory']:g} +- {ORDER_TOL:g}", "order", r["ok"],
                   f"sde: strong order of {r['method']} on {r['problem']} "
                   f"{r['slope']:.3f}, theory {r['theory']}", op="in",
                   note="" if r["gated"] else "not gated")
    finest = min(r["errs"][-1] for r in strong if r["problem"] == "nonlinear")
    body += ["### 8.1 Strong orders", "",
             f"{cfg['strong_paths']} paths (keys `sl.split_keys(key(14), n)`), errors at "
             f"T = 1; {t_orders:.0f} s together with 8.2. NONLINEAR is "
             "``dX = (sin X - X) dt + dW``, X0 = 1, against the order-1.5 Ito-Taylor "
             f"reference on 2^-{max(cfg['sra_ks']) + 5} steps of the same path, whose own "
             f"error (against half its resolution) is {ref_err:.1e}, below the smallest "
             f"measured error ({finest:.1e}) by {finest / ref_err:.0f}x. "
             "Column `dt` says whether one compilation served every dt (traced) or each dt "
             "was compiled (static; the fallback when the traced run fails).", "",
             md_table(["method", "problem", "theory", "solver.strong_order",
                       "measured (bootstrap SE)", "dt range", "dt", "verdict"], rows), ""]
    if any(r["problem"] == "ou" for r in strong):
        body += ["SRA1 on OU (exact solution) is reported, not gated: with a linear drift the "
                 "order-2 term of the error expansion, b^2 a'' I_(1,1,0), vanishes and the "
                 "method converges faster than 1.5; the nonlinear problem is the test of 1.5.",
                 ""]
    rows = []
    for r in weak:
        rows.append([r["method"], f"{r['slope']:.3f} +- {r['slope_se']:.3f}",
                     f"{r['exact_slope']:.3f}", fmt(r["declared"]),
                     ", ".join(f"{z:+.1f}" for z in r["z"]), "ok" if r["ok"] else "**FAIL**"])
        line = (f"sde: weak order of {r['method']} {r['slope']:.3f} or "
                f"max |z| {np.max(np.abs(r['z'])):.1f} against the closed form")
        checks.add(f"weak order of {r['method']} (GBM)", r["slope"], f"1 +- {ORDER_TOL:g}",
                   "order", abs(r["slope"] - 1.0) <= ORDER_TOL, line, op="in")
        checks.add(f"weak bias of {r['method']} vs closed form: max |z|",
                   float(np.max(np.abs(r["z"]))), Z_MAX, "|z|",
                   np.all(np.abs(r["z"]) < Z_MAX), line, op="<")
    wk = weak[0]["dts"]
    body += ["### 8.2 Weak order (GBM, E[X_T])", "",
             f"{cfg['weak_paths']} paths (keys from key(15)), dt = 2^-"
             f"{int(round(-np.log2(wk.max())))}..2^-{int(round(-np.log2(wk.min())))}.", "",
             md_table(["method", "measured order", "closed-form bias slope (same dts)",
                       "solver.weak_order", "z vs closed-form bias per dt", "verdict"], rows),
             "", f"![orders]({fig})", ""]
    findings.append("SDE orders: " + "; ".join(
        f"{r['method']} on {r['problem'].upper()} {r['slope']:.3f} (theory {r['theory']:g})"
        for r in strong) + "; weak (GBM) " + "; ".join(
        f"{r['method']} {r['slope']:.3f}" for r in weak) + ".")
    data["strong"] = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
                      for r in strong]

    t = time.perf_counter()
    ts, good, bad = _ou(cfg)
    t_ou = time.perf_counter() - t
    fig = _fig_ou(ts, good, bad)
    p = OU_STAT
    body += ["### 8.3 Ornstein-Uhlenbeck statistics", "",
             f"{good['n']} paths, Euler-Maruyama dt = 2^-8, saved every {p['save']} to "
             f"t = {p['T']:g} ({t_ou:.0f} s with the control).", "",
             md_table(["check", "value", "threshold", "verdict"], [
                 ["max abs z, mean (20 times)", f"{np.max(np.abs(good['z_mean'])):.2f}",
                  f"< {Z_MAX:g}", "ok" if np.all(np.abs(good["z_mean"]) < Z_MAX) else "FAIL"],
                 ["max abs z, variance (20 times)", f"{np.max(np.abs(good['z_var'])):.2f}",
                  f"< {Z_MAX:g}", "ok" if np.all(np.abs(good["z_var"]) < Z_MAX) else "FAIL"],
                 [f"KS at t = {p['T']:g} vs N(0, 0.125)",
                  f"D = {good['ks_stat']:.4f}, p = {good['ks_p']:.3g}", f"p > {KS_ALPHA:g}",
                  "ok" if good["ks_p"] > KS_ALPHA else "FAIL"],
                 ["control sigma/sqrt(2): KS", f"D = {bad['ks_stat']:.4f}, p = "
                  f"{bad['ks_p']:.2g}", f"p < {KS_ALPHA:g}",
                  "rejected (ok)" if bad["rejected"] else "NOT rejected (FAIL)"],
                 ["control: max abs z, variance", f"{np.max(np.abs(bad['z_var'])):.1f}", "-",
                  "-"],
             ]), "", f"![ou]({fig})", ""]
    line = (f"sde: OU statistics (max |z| mean {np.max(np.abs(good['z_mean'])):.2f}, "
            f"variance {np.max(np.abs(good['z_var'])):.2f}, KS p {good['ks_p']:.2g})")
    checks.add("OU mean: max |z| over 20 times", float(np.max(np.abs(good["z_mean"]))), Z_MAX,
               "|z|", np.all(np.abs(good["z_mean"]) < Z_MAX), line, op="<")
    checks.add("OU variance: max |z| over 20 times", float(np.max(np.abs(good["z_var"]))),
               Z_MAX, "|z|", np.all(np.abs(good["z_var"]) < Z_MAX), line, op="<")
    checks.add(f"OU KS at t = {p['T']:g}", good["ks_p"], KS_ALPHA, "p",
               good["ks_p"] > KS_ALPHA, line, op=">")
    checks.add("OU negative control (sigma/sqrt 2) rejected by KS", bad["ks_p"], KS_ALPHA, "p",
               bad["rejected"],
               f"sde: the OU negative control passed the KS test (p {bad['ks_p']:.2g})", op="<")
    findings.append(f"SDE OU: max |z| {np.max(np.abs(good['z_mean'])):.2f} (mean), "
                    f"{np.max(np.abs(good['z_var'])):.2f} (variance), KS p = "
                    f"{good['ks_p']:.3g}; the sigma/sqrt(2) control gives KS p = "
                    f"{bad['ks_p']:.2g}.")

    t = time.perf_counter()
    kr = _kramers(cfg)
    t_kr = time.perf_counter() - t
    fig = _fig_kramers(kr)
    body += ["### 8.4 Kramers escape rate", "",
             f"{kr['n']} paths to t_max = {kr['t_max']:.0f} ({cfg['kramers_tmax_tau']:g} tau), "
             f"{kr['events']} escapes, {t_kr:.0f} s.", "",
             md_table(["rate", "value", "simulated / it", "z"], [
                 ["simulated (censored MLE)", f"{kr['rate']:.4e} +- {kr['se']:.1e}", "-", "-"],
                 ["exact 1/MFPT (quad)", f"{kr['k_exact']:.4e}",
                  f"{kr['rate'] / kr['k_exact']:.3f}", f"{kr['z_exact']:+.2f}"],
                 ["Kramers' formula", f"{kr['k_kramers']:.4e}",
                  f"{kr['rate'] / kr['k_kramers']:.3f}", f"{kr['z_kramers']:+.2f}"],
             ]), "",
             f"Kramers' finite-barrier bias here (exact / formula - 1): {kr['bias']:+.3f}; the "
             f"statistical error of the simulated rate is {kr['se'] / kr['rate']:.3f} "
             "(relative).", "", f"![kramers]({fig})", ""]
    checks.add("Kramers rate vs exact 1/MFPT", kr["z_exact"], KRAMERS_Z, "|z|", kr["ok"],
               f"sde: Kramers rate z = {kr['z_exact']:+.2f} against the exact MFPT", op="<")
    findings.append(f"SDE Kramers (dU/kT = 5, {kr['n']} paths): rate {kr['rate']:.4e} +- "
                    f"{kr['se']:.1e}, z = {kr['z_exact']:+.2f} against the exact mean "
                    f"first-passage time, z = {kr['z_kramers']:+.2f} against Kramers' formula "
                    f"(whose own bias at this barrier is {kr['bias']:+.1%}).")
    data.update(ou=dict(ks_p=good["ks_p"], control_ks_p=bad["ks_p"]),
                kramers={k: v for k, v in kr.items() if k != "times"})
    return Section(title="8. Stochastic differential equations", body="\n".join(body),
                   findings=findings, data=data, seconds=time.perf_counter() - start,
                   failures=checks.failures, checks=checks.checks)
