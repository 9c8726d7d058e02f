"""The eager end of ``solve`` (ODE or SDE): one normalised :class:`~simlib._arguments.Problem`
run on the fixed-step (``_fixed.py``) or adaptive (``_adaptive.py``) driver, with the
progress bar open around the compiled call, the traced argument checks applied to the
solution, and a failure raised as :class:`~simlib.SolverError` when ``throw``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _programs as programs
from ._adaptive import adaptive_jit
from ._arguments import Problem
from ._auto import AUTOMATIC
from ._errors import Result, SolverError, result_message
from ._fixed import fixed_iterations, fixed_jit, grid_count
from ._solution import Solution
from ._util import is_tracer
from .progress import active
from .progress import bar as progress_bar

__all__ = ["bar", "finish", "fixed_count", "raise_if_failed", "run_adaptive", "run_fixed"]


def fixed_count(p: Problem) -> tuple[int, int | None]:
    """``(n_iter, n_grid)`` of a fixed-step run: the scan's length and the number of grid
    steps, counted on the host when the span, ``dt`` and save times are concrete; else
    ``max_steps`` (plus the save times) and ``None`` (the grid counted in the graph)."""
    if is_tracer((p.t0, p.t1, p.dt, p.saveat.ts)):
        return p.max_steps + p.n_save, None
    ts = None if p.ts is None else np.asarray(p.saveat.ts, np.float64)
    t0, t1, dt = float(p.t0), float(p.t1), float(p.dt)
    return fixed_iterations(t0, t1, dt, ts), grid_count(t0, t1, dt)


def _adjoint(p: Problem) -> Any:
    return AUTOMATIC if p.adjoint is None else p.adjoint


def _in_graph_check(p: Problem) -> bool:
    """The run's own failures and the traced argument checks share one in-graph check."""
    return p.throw and p.traced and not p.checks.pending


def run_fixed(p: Problem, n_iter: int, n_grid: int | None) -> Solution:
    """``p`` on the fixed-step driver: ``n_iter`` scan iterations over ``n_grid`` steps
    (``None``: counted in the graph), :func:`finish`-ed."""
    every = -(-n_iter // 100) if p.progress and not p.traced and n_iter > 0 else 0
    n_grid = None if n_grid is None else jnp.asarray(n_grid, jnp.int32)
    with bar(every, n_iter, "step") as shown:
        sol = _launch(p, fixed_jit, 9, p.f, p.solver, p.mode, p.saveat.t0, n_iter, p.n_save,
                      _in_graph_check(p), p.max_steps, _adjoint(p), p.y0, p.t0, p.t1, p.dt,
                      n_grid, p.ts, p.args, events=p.events, progress=every)
        if every:
            jax.block_until_ready(sol)
            shown.set(n_iter)
    return finish(p, sol)


def run_adaptive(p: Problem) -> Solution:
    """``p`` on the adaptive driver, :func:`finish`-ed."""
    every = max(64, min(4096, p.max_steps // 100)) if p.progress and not p.traced else 0
    with bar(every, abs(float(p.t1) - float(p.t0)) if every else 0.0, "t") as shown:
        sol = _launch(p, adaptive_jit, 8, p.f, p.solver, p.mode, p.saveat.t0, p.n_save,
                      _in_graph_check(p), p.max_steps, _adjoint(p), p.y0, p.t0, p.t1, p.dt,
                      p.rtol, p.atol, p.ts, p.args, events=p.events, progress=every,
                      controller=p.controller)
        if every:
            jax.block_until_ready(sol)
            shown.set(abs(float(sol.stats["t_final"]) - float(p.t0)))
    return finish(p, sol)


def _launch(p: Problem, jitted: Any, n_static: int, *args: Any, **static: Any) -> Solution:
    """The compiled driver called: an eager run without a progress bar through the kept
    programs (``_programs.py``: no trace or compile when this program was built before, in
    this process or, with :func:`simlib.keep_compiled_programs`, an earlier one)."""
    if p.traced or static["progress"]:
        return jitted(*args, **static)
    return programs.call(jitted, n_static, *args, **static)


def finish(p: Problem, sol: Solution) -> Solution:
    """``sol`` with the call's traced checks applied (:meth:`Checks.apply`); raised as
    :class:`SolverError` when it failed, ``throw`` is on and the run was eager."""
    sol = p.checks.apply(sol, throw=p.throw, t1=p.t1, max_steps=p.max_steps)
    if p.throw and not p.traced:
        raise_if_failed(sol, p.t1, p.max_steps)
    return sol


def raise_if_failed(sol: Solution, t1: Any, max_steps: int) -> None:
    """Raise the :class:`SolverError` of an eager run whose ``sol.result`` is a failure."""
    code = int(sol.result)
    if code != 0:
        message = result_message(code, t=float(sol.stats["t_final"]),
                                 step=int(sol.stats["num_steps"]), t1=float(t1),
                                 max_steps=max_steps)
        raise SolverError("solve: " + message, Result(code), sol)


def bar(on: int, total: float, unit: str) -> Any:
    """The progress bar of an eager run (``simlib.progress``), receiving the compiled
    loop's reports while it is open; a do-nothing one when ``on`` is 0."""
    the_bar = progress_bar(bool(on), total, "solve", unit)
    return _Open(the_bar) if on else the_bar


class _Open:
    def __init__(self, the_bar):
        self.bar, self.route = the_bar, active("solve", the_bar)

    def __enter__(self):
        self.route.__enter__()
        return self.bar

    def __exit__(self, *exc):
        self.route.__exit__(*exc)
        self.bar.close()
        return False
