"""Helpers shared by the parts of the validation suite.

Importing this module switches JAX to float64 (the suite's scripts may do that;
simlib itself never does). It holds the test problems (:class:`Case`), the
scipy reference solutions, the simlib runners, error measures, timing, order
fits, markdown tables and figure saving: every helper is written once, here.
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.linalg  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import simlib as sl  # noqa: E402
from simlib import systems  # noqa: E402

VALIDATION_DIR = Path(__file__).resolve().parent
FIGURE_DIR = VALIDATION_DIR / "figures"
REPORT_PATH = VALIDATION_DIR / "report.md"

REF_TOL = 1e-13  # rtol = atol of the scipy DOP853 reference solutions

# Solvers, with the classical orders from the literature (checked against ``solver.order``).
ADAPTIVE = ("Bosh3", "Tsit5", "Dopri5", "Dopri8", "Heun")
FIXED_ONLY = ("Euler", "Midpoint", "RK4")
RK_METHODS = ("Euler", "Midpoint", "Heun", "RK4", "Bosh3", "Tsit5", "Dopri5", "Dopri8")
SYMPLECTIC = ("SemiImplicitEuler", "VelocityVerlet", "Yoshida4", "PEFRL")
THEORETICAL_ORDER = {
    "Euler": 1, "Midpoint": 2, "Heun": 2, "RK4": 4, "Bosh3": 3, "Tsit5": 5, "Dopri5": 5,
    "Dopri8": 8, "SemiImplicitEuler": 1, "VelocityVerlet": 2, "Yoshida4": 4, "PEFRL": 4,
}

_COLORS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C9", "C8", "C0", "C2", "C4")
METHOD_STYLE = {  # colour and marker per method, shared by every figure
    name: (_COLORS[i], "os^vD<>ph*xP"[i]) for i, name in enumerate(RK_METHODS + SYMPLECTIC)
}


def make_solver(name: str) -> sl.AbstractSolver:
    """An instance of the simlib solver called ``name``."""
    return getattr(sl, name)()


# --------------------------------------------------------------------------------------
# problems


@dataclass(frozen=True, eq=False)
class Case:
    """An initial value problem of the suite (compared by identity, so it can key caches).

    Attributes:
        name: Short identifier used in tables.
        f: Vector field ``f(t, y, args)``.
        y0: Initial state, a numpy pytree (an array, or a ``(q, p)`` tuple).
        t0, t1: Time span.
        args: Parameters passed to ``f``.
        description: One line for the report.
        exact: Closed form ``exact(ts) -> (len(ts), d)`` flat array, or ``None``.
        energy: Conserved quantity ``energy(y, args)`` on one (unbatched) state, or ``None``.
        separable: Whether ``y0`` is a ``(q, p)`` tuple, so symplectic solvers apply.
    """

    name: str
    f: Callable
    y0: Any
    t0: float
    t1: float
    args: Any
    description: str
    exact: Callable[[np.ndarray], np.ndarray] | None = None
    energy: Callable | None = None
    separable: bool = False

    def y0_jax(self):
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), self.y0)

    @property
    def dim(self) -> int:
        return int(flat_state(self.y0).shape[-1])


def flat_state(y, batched: bool = False):
    """Concatenate the leaves of a state pytree: ``(d,)``, or ``(n, d)`` when ``batched``."""
    leaves = jax.tree_util.tree_leaves(y)
    if batched:
        return jnp.concatenate([jnp.reshape(x, (x.shape[0], -1)) for x in leaves], axis=1)
    return jnp.concatenate([jnp.ravel(x) for x in leaves])


def _exact_from(problem: systems.Problem):
    if problem.exact is None:
        return None
    if problem.t0 != 0.0:
        raise ValueError("closed forms take y0 at t = 0")
    y0 = jax.tree_util.tree_map(jnp.asarray, problem.y0)

    def exact(ts):
        out = problem.exact(jnp.asarray(ts, jnp.float64), y0, problem.args)
        return np.asarray(flat_state(out, batched=True))

    return exact


def problem_case(name: str, t1: float | None = None, note: str = "") -> Case:
    """A case from ``simlib.systems.PROBLEMS``, optionally on a shorter span."""
    problem = systems.get_problem(name)
    if t1 is not None:
        problem = replace(problem, t1=float(t1))
    description = problem.description + (f" {note}" if note else "")
    return Case(
        name=name, f=problem.vector_field, y0=problem.y0, t0=problem.t0, t1=problem.t1,
        args=problem.args, description=description, exact=_exact_from(problem),
        energy=problem.energy, separable=isinstance(problem.y0, tuple),
    )


def kepler_case(e: float, periods: float) -> Case:
    """Kepler orbit (mu = a = 1) of eccentricity ``e`` from perihelion, ``periods`` orbits."""
    q0 = np.array([1.0 - e, 0.0])
    p0 = np.array([0.0, math.sqrt((1.0 + e) / (1.0 - e))])
    problem = systems.Problem(
        name=f"kepler_e{e:g}", vector_field=systems.kepler, y0=(q0, p0), t0=0.0,
        t1=2 * math.pi * periods, args=(1.0,),
        description=f"Kepler orbit, mu = a = 1, e = {e:g}, from perihelion, {periods:g} periods.",
        energy=systems.kepler_energy, exact=systems.kepler_exact,
    )
    return Case(problem.name, problem.vector_field, problem.y0, problem.t0, problem.t1,
                problem.args, problem.description, _exact_from(problem), problem.energy, True)


def arenstorf(t, y, args):
    """Restricted three-body problem in the rotating frame (Hairer et al. 1993, II.0)."""
    (mu,) = args
    mu1 = 1.0 - mu
    x, yy, vx, vy = y[0], y[1], y[2], y[3]
    d1 = ((x + mu) ** 2 + yy**2) ** 1.5
    d2 = ((x - mu1) ** 2 + yy**2) ** 1.5
    ax = x + 2 * vy - mu1 * (x + mu) / d1 - mu * (x - mu1) / d2
    ay = yy - 2 * vx - mu1 * yy / d1 - mu * yy / d2
    return jnp.stack([vx, vy, ax, ay])


ARENSTORF_PERIOD = 17.0652165601579625588917206249


def arenstorf_case() -> Case:
    return Case(
        name="arenstorf", f=arenstorf,
        y0=np.array([0.994, 0.0, 0.0, -2.00158510637908252240537862224]),
        t0=0.0, t1=ARENSTORF_PERIOD, args=(0.012277471,),
        description="Arenstorf orbit (restricted three-body problem, Hairer et al. 1993, "
        "II.0), one period: close lunar fly-bys make the step size vary by orders of magnitude.",
    )


LINEAR_A = np.array([[-0.2, 2.0, 0.0], [-2.0, -0.2, 1.0], [0.0, 0.0, -1.0]])


def linear(t, y, args):
    """``y' = A y``."""
    return args @ y


def linear_case() -> Case:
    y0 = np.array([1.0, 0.0, 1.0])

    def exact(ts):
        return np.stack([scipy.linalg.expm(LINEAR_A * t) @ y0 for t in np.asarray(ts)])

    return Case(
        name="linear_3x3", f=linear, y0=y0, t0=0.0, t1=10.0, args=LINEAR_A,
        description="Linear system y' = A y, A = [[-0.2, 2, 0], [-2, -0.2, 1], [0, 0, -1]] "
        "(non-normal, damped rotation), y0 = [1, 0, 1]; closed form expm(A t) y0.",
        exact=exact,
    )


def pendulum(t, y, args):
    """Mathematical pendulum in separable form: ``q' = p``, ``p' = -omega0^2 sin q``."""
    q, p = y
    (w2,) = args
    return p, -w2 * jnp.sin(q)


def pendulum_case() -> Case:
    return Case(
        name="pendulum", f=pendulum, y0=(np.array([2.0]), np.array([0.0])), t0=0.0, t1=10.0,
        args=(1.0,),
        description="Nonlinear pendulum q'' = -sin q from q = 2 rad at rest (separable, no "
        "elementary closed form), t1 = 10.",
        energy=lambda y, args: 0.5 * jnp.sum(y[1] ** 2) - args[0] * jnp.sum(jnp.cos(y[0])),
        separable=True,
    )


@functools.cache
def accuracy_cases() -> tuple[Case, ...]:
    """The problems of the accuracy part (built once, so caches keyed on them hit)."""
    return (
        problem_case("harmonic_oscillator"),
        problem_case("kepler"),
        problem_case("lotka_volterra"),
        problem_case("lorenz", t1=2.0, note="Short span t1 = 2 (chaotic flow)."),
        problem_case("van_der_pol"),
        problem_case("damped_driven_pendulum"),
        problem_case("double_pendulum", t1=3.0, note="Short span t1 = 3 (chaotic)."),
        arenstorf_case(),
        linear_case(),
    )


@functools.cache
def get_case(name: str) -> Case:
    for case in accuracy_cases():
        if case.name == name:
            return case
    if name == "pendulum":
        return pendulum_case()
    raise KeyError(name)


# --------------------------------------------------------------------------------------
# scipy reference solutions


@functools.cache
def scipy_rhs(case: Case) -> Callable[[float, np.ndarray], np.ndarray]:
    """``case.f`` on flat numpy states, jitted, for ``scipy.integrate.solve_ivp``."""
    _, unravel = ravel_pytree(case.y0_jax())

    @jax.jit
    def rhs(t, y):
        return ravel_pytree(case.f(t, unravel(y), case.args))[0]

    return lambda t, y: np.asarray(rhs(t, y))


def scipy_solve(case: Case, method: str, rtol: float, atol: float,
                t_eval: np.ndarray | None = None, fun=None):
    """``solve_ivp`` on ``case``: returns ``(ys (n, d) at t_eval or [t1], nfev, success)``."""
    fun = scipy_rhs(case) if fun is None else fun
    y0 = np.asarray(flat_state(case.y0))
    sol = solve_ivp(fun, (case.t0, case.t1), y0, method=method, rtol=rtol, atol=atol,
                    t_eval=t_eval)
    ys = sol.y.T if t_eval is not None else sol.y[:, -1:].T
    return ys, int(sol.nfev), bool(sol.success)


_REFERENCE_CACHE: dict = {}


def reference(case: Case, ts: Sequence[float]) -> np.ndarray:
    """Reference states ``(len(ts), d)``: scipy DOP853, rtol = atol = 1e-13.

    Integrated piecewise from save time to save time, so every value is a step end
    point, not an interpolant. Cached per case and ``ts``.
    """
    ts = np.asarray(ts, np.float64)
    key = (case, ts.tobytes())  # the case object itself: the cache keeps it alive
    if key not in _REFERENCE_CACHE:
        fun = scipy_rhs(case)
        y = np.asarray(flat_state(case.y0))
        t = case.t0
        out = []
        for t_next in ts:
            if t_next > t:
                sol = solve_ivp(fun, (t, t_next), y, method="DOP853", rtol=REF_TOL,
                                atol=REF_TOL)
                if not sol.success:
                    raise RuntimeError(f"reference for {case.name} failed: {sol.message}")
                y, t = sol.y[:, -1], t_next
            out.append(y.copy())
        _REFERENCE_CACHE[key] = np.array(out)
    return _REFERENCE_CACHE[key]


def dense_times(case: Case, n: int = 50) -> np.ndarray:
    """``n`` save times strictly inside ``(t0, t1)``, equally spaced."""
    return np.linspace(case.t0, case.t1, n + 2)[1:-1]


# --------------------------------------------------------------------------------------
# simlib runners


def simlib_solve(case: Case, solver: sl.AbstractSolver, *, rtol=None, atol=None, dt=None,
                 ts=None, max_steps: int = 100_000):
    """One eager ``simlib.solve`` with ``throw=False``: returns ``(ys (n, d), sol)``."""
    saveat = sl.SaveAt(t1=True) if ts is None else sl.SaveAt(ts=np.asarray(ts))
    sol = sl.solve(case.f, case.y0_jax(), case.t0, case.t1, solver=solver, rtol=rtol,
                   atol=atol, dt=dt, args=case.args, saveat=saveat, max_steps=max_steps,
                   throw=False)
    return np.asarray(flat_state(sol.ys, batched=True)), sol


def guarded(fn: Callable[[], Any]):
    """``(fn(), None)``, or ``(None, "ExceptionType: first line")`` if ``fn`` raises.

    Lets one failing run be reported in its table cell instead of aborting a part.
    """
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 - reported, not hidden
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return None, f"{type(err).__name__}: {first}"


def simlib_fixed_fn(case: Case, solver: sl.AbstractSolver, max_steps: int):
    """A jitted ``dt -> (y(t1) flat, result code, num_fevals)`` for fixed-step runs.

    ``dt`` is traced, so one compilation serves every step size; simlib then runs a
    ``lax.scan`` of ``max_steps`` iterations whose surplus steps have ``h = 0``.
    """
    y0 = case.y0_jax()

    @jax.jit
    def run(dt):
        sol = sl.solve(case.f, y0, case.t0, case.t1, solver=solver, dt=dt, args=case.args,
                       max_steps=max_steps, throw=False)
        return flat_state(sol.ys, batched=True)[-1], sol.result, sol.stats["num_fevals"]

    def call(dt):
        y, result, nfev = run(jnp.float64(dt))
        return np.asarray(y), int(result), int(nfev)

    return call


# --------------------------------------------------------------------------------------
# error measures, fits, timing


def tol_units(y, y_ref, rtol: float, atol: float) -> float:
    """``max_i |y_i - y_ref_i| / (atol + rtol |y_ref_i|)`` over all entries (nan if any is)."""
    y, y_ref = np.asarray(y), np.asarray(y_ref)
    if not np.all(np.isfinite(y)):
        return float("nan")
    return float(np.max(np.abs(y - y_ref) / (atol + rtol * np.abs(y_ref))))


def max_abs(y, y_ref) -> float:
    """Max-norm error (nan if ``y`` is not finite)."""
    y, y_ref = np.asarray(y), np.asarray(y_ref)
    if not np.all(np.isfinite(y)):
        return float("nan")
    return float(np.max(np.abs(y - y_ref)))


def fit_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    return float(np.polyfit(np.log(np.asarray(x)), np.log(np.asarray(y)), 1)[0])


def fit_order(dts, errs, floor: float, ceiling: float = np.inf, max_points: int = 4):
    """Measured order: slope over the (up to) ``max_points`` smallest step sizes whose
    error is finite, above ``floor`` (round-off and reference accuracy) and below
    ``ceiling`` (outside the asymptotic range).

    Returns ``(slope, used)`` with ``used`` a boolean mask; ``nan`` with fewer than 2 points.
    """
    dts, errs = np.asarray(dts, float), np.asarray(errs, float)
    ok = np.isfinite(errs) & (errs > floor) & (errs < ceiling)
    idx = [i for i in np.argsort(dts) if ok[i]][:max_points]
    used = np.zeros(dts.shape, bool)
    used[idx] = True
    if len(idx) < 2:
        return float("nan"), used
    return fit_slope(dts[used], errs[used]), used


def best_time(fn: Callable[[], Any], min_repeats: int = 3, max_repeats: int = 30,
              budget: float = 0.5):
    """Best wall time of ``fn()`` after one untimed warm-up call: returns ``(seconds, out)``.

    Repeats at least ``min_repeats`` times and until ``budget`` seconds are spent.
    ``fn`` must block until its result is ready.
    """
    out = fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats
                                        or time.perf_counter() - start < budget):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def block(tree):
    """``jax.block_until_ready`` returning the tree."""
    return jax.block_until_ready(tree)


# --------------------------------------------------------------------------------------
# report helpers


@dataclass
class Section:
    """One part of the report: markdown body, findings, raw data and its runtime.

    ``findings`` are the report's observations; ``failures`` the checks of this part that
    failed (each one line naming the check); ``checks`` every check, passing or not
    (:class:`Check`, collected with :class:`Checks`). ``python -m validation`` exits
    non-zero when any part has a failure.
    """

    title: str
    body: str
    findings: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)


@dataclass(frozen=True)
class Check:
    """One pass/fail decision of a part, passing or not.

    ``value`` is the measured quantity (``None`` when there is none, e.g. a run that
    raised), ``allowed`` its bound, read as ``value <op> allowed`` (``op`` one of ``<=``,
    ``<``, ``>=``, ``>``, ``==``), in ``unit`` ("tol units" = error / (atol + rtol |ref|),
    "order", "z", "rel", ...). ``note`` qualifies the verdict (e.g. a known miss that is
    reported, not failed).
    """

    part: str
    name: str
    value: Any
    allowed: Any
    unit: str
    passed: bool
    op: str = "<="
    note: str = ""


class Checks:
    """Collects a part's checks; a failing one also adds its line to ``failures``.

    ``failures`` keeps the one-line messages ``python -m validation`` lists (a line already
    there is not added twice, so several checks can share one combined message).
    """

    def __init__(self, part: str):
        self.part = part
        self.checks: list[Check] = []
        self.failures: list[str] = []

    def add(self, name: str, value: Any, allowed: Any, unit: str, passed: bool,
            message: str = "", op: str = "<=", note: str = "") -> bool:
        """Record a check; when it fails append ``message`` (default: a line from the
        check itself) to ``failures``. Returns ``passed``."""
        passed = bool(passed)
        self.checks.append(Check(self.part, name, value, allowed, unit, passed, op, note))
        if not passed:
            line = message or (f"{self.part}: {name}: {fmt(value)} {unit}, allowed {op} "
                               f"{fmt(allowed)}")
            if line not in self.failures:
                self.failures.append(line)
        return passed


CHECK_HEADERS = ("part", "check", "value", "allowed", "unit", "pass")


def check_rows(checks: Sequence[Check]) -> list[list[str]]:
    """Rows of the checks table: measured value, its bound (``op allowed``), unit, verdict."""
    rows = []
    for c in checks:
        allowed = c.allowed if isinstance(c.allowed, str) else fmt(c.allowed)
        verdict = ("yes" if c.passed else "FAIL") + (f" ({c.note})" if c.note else "")
        rows.append([c.part, c.name, c.value if isinstance(c.value, str) else fmt(c.value),
                     f"{c.op} {allowed}".strip(), c.unit, verdict])
    return rows


def checks_markdown(checks: Sequence[Check]) -> str:
    """The checks as a markdown table (the report's "Checks" section)."""
    return md_table(list(CHECK_HEADERS), check_rows(checks))


def checks_text(checks: Sequence[Check]) -> str:
    """The checks as an aligned plain-text table (the terminal summary)."""
    rows = [list(CHECK_HEADERS)] + check_rows(checks)
    widths = [max(len(r[i]) for r in rows) for i in range(len(CHECK_HEADERS))]
    right = (False, False, True, True, False, False)
    lines = []
    for row in rows:
        cells = [x.rjust(w) if r else x.ljust(w)
                 for x, w, r in zip(row, widths, right, strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(x, digits: int = 2) -> str:
    """A number for a table: scientific for floats, ``fail`` for nan, ``-`` for None."""
    if x is None:
        return "-"
    if isinstance(x, bool | np.bool_):
        return "yes" if x else "no"
    if isinstance(x, int | np.integer):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "fail"
    if x == 0.0:
        return "0"
    if 1e-2 <= abs(x) < 1e4:
        return f"{x:.{digits + 1}g}"
    return f"{x:.{digits - 1}e}".replace("e-0", "e-").replace("e+0", "e+")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; cells that are not strings go through :func:`fmt`."""
    def cell(x):
        return (x if isinstance(x, str) else fmt(x)).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(fig, name: str) -> str:
    """Save ``fig`` as ``figures/<name>.png``; returns the path relative to the report."""
    FIGURE_DIR.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE_DIR / f"{name}.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return f"figures/{name}.png"


def try_import_diffrax():
    """``(diffrax module or None, reason)``; diffrax is optional."""
    try:
        import diffrax
    except Exception as err:  # noqa: BLE001 - any import failure means "skip"
        return None, f"diffrax could not be imported ({type(err).__name__}: {err})"
    return diffrax, ""


def machine_info() -> dict[str, str]:
    """CPU, software versions and date for the report header."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    diffrax, _ = try_import_diffrax()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cpu count": f"{os.cpu_count()} (usable: {affinity})",
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "jax": f"{jax.__version__} (backend {jax.default_backend()}, "
               f"x64 {jax.config.jax_enable_x64})",
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "diffrax": diffrax.__version__ if diffrax is not None else "not available",
        "simlib": sl.__version__,
    }


def quiet_warnings():
    """Silence scipy's tolerance warnings, which the tables make visible anyway."""
    warnings.filterwarnings("ignore", message=".*tolerance.*", category=UserWarning)
