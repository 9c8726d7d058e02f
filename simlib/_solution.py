"""``SaveAt`` (what to save) and ``Solution`` (what ``solve`` returns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _summary
from ._errors import Result, check_solution
from ._solver._base import PyTree


@dataclass(frozen=True)
class SaveAt:
    """Which times a :func:`solve` returns.

    Exactly one of ``t1``, ``ts`` and ``steps`` selects the output; ``t0=True``
    additionally puts the initial state first.

    Attributes:
        t0: Also save the initial state.
        t1: Save the final state only (the default of ``solve``).
        ts: Save at these times, which must lie in ``[t0, t1]`` and be ordered in the
            direction of integration. Fixed-step runs step exactly onto them;
            adaptive runs use the method's dense output.
        steps: Save after every step. Adaptive runs return ``max_steps`` rows, the
            unused ones filled with ``inf``; ``stats["num_accepted"]`` says how many
            are real.
    """

    t0: bool = False
    t1: bool = False
    ts: Any = None
    steps: bool = False

    def mode(self) -> str:
        chosen = [name for name, on in (("t1", self.t1), ("ts", self.ts is not None),
                                        ("steps", self.steps)) if on]
        if len(chosen) != 1:
            raise ValueError(
                f"saveat: choose exactly one of t1=True, ts=..., steps=True; got {chosen or 'none'}"
            )
        return chosen[0]


_STATS_ORDER = ("num_steps", "num_accepted", "num_rejected", "num_fevals", "t_final")


class Solution(NamedTuple):
    """The result of :func:`solve`.

    Attributes:
        ts: Saved times, shape ``(n_save,)``.
        ys: Saved states: ``y0``'s pytree with a leading axis over ``ts``.
        stats: ``num_steps`` (attempts), ``num_accepted``, ``num_rejected``,
            ``num_fevals`` (right-hand-side evaluations, dense-output extras excluded)
            and ``t_final`` (where the integration stopped).
        result: A :class:`~simlib.Result` code; 0 means success.

    With ``solve(..., events=...)``, ``stats["events"]`` (also :attr:`events`) holds one
    :class:`~simlib.EventRecord` per event, and ``stats["t_final"]`` is the time of a
    terminal event when one stopped the run.
    """

    ts: jax.Array
    ys: PyTree
    stats: dict
    result: jax.Array

    @property
    def events(self) -> tuple:
        """Per event, an :class:`~simlib.EventRecord` ``(ts, ys, count)`` of its crossings
        (empty when ``solve`` had no events)."""
        return self.stats.get("events", ())

    @property
    def message(self) -> str:
        """A readable account of ``result`` (for unbatched solutions)."""
        code = int(np.asarray(self.result).ravel()[0])
        if code == 0:
            return "the integration reached t1"
        return Result(code).name

    status, status_counts = _summary.status_properties("Solution")

    def __repr__(self) -> str:
        fields = _summary.result_fields(self.result)
        fields.append(("ts", _summary.shape(self.ts) + _summary.span(self.ts)))
        fields.append(("ys", _summary.tree_shapes(self.ys)))
        stats = self.stats if isinstance(self.stats, dict) else {}
        fields.append(("stats", _summary.stats(stats, skip=("events",), order=_STATS_ORDER)))
        if stats.get("events"):
            counts = ", ".join(_summary.value(rec.count) for rec in stats["events"])
            fields.append(("events", f"crossings [{counts}]"))
        return _summary.block("Solution", fields)


def assemble_solution(mode: str, save_t0: bool, t0, y0: PyTree, t_end, y_end: PyTree, ts_arr,
                      saved: PyTree, steps_out, stats: tuple, result, in_graph_check: bool,
                      t1, max_steps: int, events: tuple | None = None) -> Solution:
    """The :class:`Solution` of a run, the same for the fixed-step and adaptive drivers.

    Args:
        mode: ``"t1"``, ``"ts"`` or ``"steps"`` (:meth:`SaveAt.mode`).
        save_t0: Put ``(t0, y0)`` first.
        t_end, y_end: Where the run stopped (the ``t1`` output).
        ts_arr, saved: The save times and the states saved there (``ts``).
        steps_out: ``(times, states)`` after every step (``steps``).
        stats: ``(num_steps, num_accepted, num_fevals, t_final)``.
        result: The :class:`Result` code of the run.
        in_graph_check, t1, max_steps: Passed to :func:`check_solution`.
        events: The :class:`~simlib.EventRecord` of each event, put in
            ``stats["events"]`` (``None``: no events, no such key).
    """
    if mode == "t1":
        ts_out, ys_out = t_end[None], jax.tree_util.tree_map(lambda x: x[None], y_end)
    elif mode == "ts":
        ts_out, ys_out = ts_arr, saved
    else:
        ts_out, ys_out = steps_out
    if save_t0:
        ts_out = jnp.concatenate([t0[None], ts_out])
        ys_out = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), y0, ys_out)
    n_steps, n_accepted, n_fevals, t_final = stats
    stats = dict(
        num_steps=n_steps,
        num_accepted=n_accepted,
        num_rejected=n_steps - n_accepted,
        num_fevals=n_fevals,
        t_final=t_final,
    )
    if events is not None:
        stats["events"] = events
    return check_solution(Solution(ts_out, ys_out, stats, result), in_graph_check, t1,
                          max_steps)
