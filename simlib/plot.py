"""Plots of simlib results with matplotlib: trajectories, phase portraits, energy error,
convergence order, work-precision diagrams, fit history, data against model, g(r) and
ensemble fans.

``simlib.plot`` is imported on first use (``import simlib`` does not load matplotlib).
Every function draws into ``ax`` when one is given (else a new figure), labels the axes
(with the units passed as ``*_unit`` arguments), adds a legend when there is more than one
labelled line, and returns ``(fig, ax)``. Call one several times with the same ``ax`` to
overlay runs.

Example:
    >>> import jax.numpy as jnp
    >>> import simlib as sl
    >>> sol = sl.solve(lambda t, y, args: -y, jnp.ones(2), 0.0, 1.0, solver=sl.RK4(),
    ...                dt=0.1, saveat=sl.SaveAt(steps=True))
    >>> fig, ax = sl.plot.trajectory(sol, t_unit="s")
    >>> ax.get_xlabel(), len(ax.get_lines())
    ('t [s]', 2)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import matplotlib.pyplot as plt
import numpy as np
from jax.typing import ArrayLike
from matplotlib.axes import Axes

__all__ = [
    "convergence",
    "data_vs_model",
    "energy_error",
    "ensemble_fan",
    "fit_history",
    "fitted_order",
    "phase_portrait",
    "radial_distribution",
    "trajectory",
    "work_precision",
]


# -- helpers ---------------------------------------------------------------------------------


def _figure(ax, figsize=(6.4, 4.2)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return ax.figure, ax


def _label(name: str, unit: str | None) -> str:
    return f"{name} [{unit}]" if unit else name


def _legend(ax, always: bool = False, **kw) -> None:
    """A legend when more than one line is labelled (or one, with ``always``)."""
    _, labels = ax.get_legend_handles_labels()
    labelled = [lab for lab in labels if lab and not lab.startswith("_")]
    if len(labelled) > 1 or (always and labelled):
        ax.legend(**kw)


def _times_and_states(sol) -> tuple[np.ndarray, Any]:
    """``(ts, ys)`` of a Solution, a Trajectory (positions) or a ``(ts, ys)`` pair."""
    if hasattr(sol, "ts") and hasattr(sol, "ys"):
        return np.asarray(sol.ts), sol.ys
    if hasattr(sol, "times") and hasattr(sol, "positions"):
        return np.asarray(sol.times), sol.positions
    if isinstance(sol, tuple) and len(sol) == 2:
        return np.asarray(sol[0]), sol[1]
    raise TypeError(f"expected a Solution, a Trajectory or a (ts, ys) pair, got {type(sol)}")


def _components(ts: np.ndarray, ys) -> tuple[np.ndarray, list[str]]:
    """The state as ``(..., n_times, n_components)`` and a name per component.

    ``ys`` is a pytree whose leaves have the leading axes of ``ts`` (the batch, then time);
    each leaf's remaining axes are flattened, and components are named by the leaf's key
    path and index: ``y[0]``, ``['q'][1]``.
    """
    lead = ts.shape
    columns, names = [], []
    if isinstance(ys, Mapping) and not ys:
        raise ValueError("the state has no components")
    for path, leaf in jax.tree_util.tree_flatten_with_path(ys)[0]:
        arr = np.asarray(leaf)
        if arr.shape[: len(lead)] != lead:
            raise ValueError(f"state leaf {_path_name(path)} has shape "
                             f"{arr.shape}, which does not start with the times' {lead}")
        flat = arr.reshape(lead + (-1,))
        base = _path_name(path)
        if arr.ndim == len(lead):
            names.append(base)
        else:
            trail = arr.shape[len(lead):]
            names += [base + "".join(f"[{i}]" for i in idx) for idx in np.ndindex(*trail)]
        columns.append(flat)
    return np.concatenate(columns, axis=-1), names


def _path_name(path) -> str:
    """A leaf's name from its key path: ``y`` (a bare array), ``q`` (``{'q': ...}``),
    ``state.q`` (nested), ``y[1]`` (a tuple's second leaf)."""
    out = ""
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            out += ("." if out else "") + str(key.key)
        elif isinstance(key, jax.tree_util.GetAttrKey):
            out += ("." if out else "") + key.name
        elif isinstance(key, jax.tree_util.SequenceKey):
            out = (out or "y") + f"[{key.idx}]"
        else:
            out += str(key)
    return out or "y"


def _select(names: list[str], which) -> list[int]:
    if which is None:
        return list(range(len(names)))
    out = []
    for w in ([which] if isinstance(which, int | str) else which):
        if isinstance(w, str):
            if w not in names:
                raise ValueError(f"no component named {w!r}; the components are {names}")
            out.append(names.index(w))
        else:
            if not -len(names) <= int(w) < len(names):
                raise ValueError(f"component {w} out of range for {len(names)} components")
            out.append(int(w) % len(names))
    return out


def _positive(x: np.ndarray) -> np.ndarray:
    """``x`` with the values a log axis cannot show (<= 0, non-finite) masked as nan."""
    x = np.asarray(x, dtype=float)
    return np.where(np.isfinite(x) & (x > 0), x, np.nan)


# -- trajectories and phase portraits --------------------------------------------------------


def trajectory(sol: Any, *, components: Sequence[int | str] | None = None,
               labels: Sequence[str] | None = None, ax: Axes | None = None,
               t_unit: str | None = None, y_label: str = "state", y_unit: str | None = None,
               **line_kw) -> tuple[Any, Any]:
    """The state against time, one line per component.

    Args:
        sol: A :class:`~simlib.Solution` (any pytree state), or ``(ts, ys)``. A batched
            solution (from ``vmap``) draws every member, one colour per component.
        components: Which components: indices into the flattened state, or names as in
            the legend (``"y[0]"`` for an array state, ``"q[1]"`` for ``{"q": ...}``); all
            by default.
        labels: Legend labels for the chosen components (default: their names).
        t_unit, y_unit: Units for the axis labels; ``y_label`` names the vertical axis.
        **line_kw: Passed to ``ax.plot``.
    """
    fig, ax = _figure(ax)
    ts, ys = _times_and_states(sol)
    values, names = _components(ts, ys)
    chosen = _select(names, components)
    labels = [names[i] for i in chosen] if labels is None else list(labels)
    if len(labels) != len(chosen):
        raise ValueError(f"labels: {len(labels)} given for {len(chosen)} components")
    if components is None and len(chosen) > 20:
        raise ValueError(f"trajectory: the state has {len(chosen)} components; choose at most "
                         "a few with components=[...] (indices or names)")
    t2 = ts.reshape(-1, ts.shape[-1])
    v2 = values.reshape(-1, ts.shape[-1], values.shape[-1])
    batched = t2.shape[0] > 1
    user_color = line_kw.pop("color", None)
    for k, (i, lab) in enumerate(zip(chosen, labels, strict=True)):
        color = user_color or f"C{k % 10}"
        for m in range(t2.shape[0]):
            ok = np.isfinite(t2[m])
            kw = dict(color=color, label=lab if m == 0 else "_")
            if batched:
                kw.update(lw=0.8, alpha=0.6)
            ax.plot(t2[m][ok], v2[m][ok, i], **(kw | line_kw))
    ax.set_xlabel(_label("t", t_unit))
    ax.set_ylabel(_label(y_label, y_unit))
    _legend(ax, always=len(chosen) == 1 and labels != [names[chosen[0]]])
    return fig, ax


def phase_portrait(sol: Any, x: int | str = 0, y: int | str = 1, *, ax: Axes | None = None,
                   x_label: str | None = None,
                   y_label: str | None = None, x_unit: str | None = None,
                   y_unit: str | None = None, label: str | None = None,
                   mark_start: bool = True, **line_kw) -> tuple[Any, Any]:
    """One component of the state against another.

    Args:
        sol: A :class:`~simlib.Solution` or ``(ts, ys)``; a batched one draws every member.
        x, y: Components: an index into the flattened state, a name (``"q[0]"``), or a
            function of the saved states ``ys`` (with their leading axes) returning one
            value per saved time, e.g. ``lambda ys: ys["q"][..., 0]``.
        x_label, y_label: Axis names (default: the components' names).
        mark_start: Mark each initial state with a dot.
    """
    fig, ax = _figure(ax, figsize=(5.2, 4.6))
    ts, ys = _times_and_states(sol)
    values, names = _components(ts, ys)

    def pick(which, default_name):
        if callable(which):
            return np.asarray(which(ys)), default_name
        i = _select(names, which)[0]
        return values[..., i], names[i]

    xs, xn = pick(x, "x")
    vs, yn = pick(y, "y")
    t2 = ts.reshape(-1, ts.shape[-1])
    xs, vs = xs.reshape(t2.shape), vs.reshape(t2.shape)
    color = line_kw.pop("color", None)
    batched = t2.shape[0] > 1
    for m in range(t2.shape[0]):
        ok = np.isfinite(t2[m])
        kw = dict(lw=0.7 if batched else 1.2, label=label if m == 0 else "_")
        if color is not None or batched:
            kw["color"] = color or ("C0" if t2.shape[0] > 10 else f"C{m % 10}")
        (line,) = ax.plot(xs[m][ok], vs[m][ok], **(kw | line_kw))
        if mark_start and ok.any():
            ax.plot(xs[m][ok][0], vs[m][ok][0], "o", ms=3.5, color=line.get_color(),
                    label="_")
    ax.set_xlabel(_label(x_label or xn, x_unit))
    ax.set_ylabel(_label(y_label or yn, y_unit))
    _legend(ax, always=label is not None)
    return fig, ax


# -- conserved quantities ----------------------------------------------------------------------


def energy_error(t: Any, energy: ArrayLike | Callable[[Any], ArrayLike] | None = None, *,
                 ax: Axes | None = None, label: str | None = None,
                 t_unit: str | None = None, quantity: str = "E",
                 relative: bool = True, **line_kw) -> tuple[Any, Any]:
    r"""The error of a conserved quantity over time, :math:`|E(t) - E(0)| / |E(0)|`, on a log
    scale.

    Args:
        t: Times ``(n,)``; or a :class:`~simlib.particles.Trajectory` (its total energy);
            or a :class:`~simlib.Solution` with ``energy`` a function of one saved state.
        energy: Values ``(n,)``, or a function ``energy(y)`` of one state (with a Solution).
        label: Legend label (one call per method overlays several).
        quantity: The quantity's symbol, for the axis label (``"E"``, ``"L_z"``, ``"H"``).
        relative: Divide by ``|E(0)|``; ``False`` plots ``|E(t) - E(0)|``.

    Points where the error is exactly zero (``t = 0``, and exact conservation) are not drawn.
    """
    fig, ax = _figure(ax)
    if hasattr(t, "total_energy") and hasattr(t, "times"):
        times, values = np.asarray(t.times), np.asarray(t.total_energy)
    elif hasattr(t, "ts") and hasattr(t, "ys"):
        if not callable(energy):
            raise TypeError("energy_error: with a Solution, energy must be a function of "
                            "one saved state, energy(y)")
        times, values = np.asarray(t.ts), np.asarray(jax.vmap(energy)(t.ys))
    else:
        if energy is None:
            raise TypeError("energy_error: give (t, energy) arrays, a Trajectory, or a "
                            "Solution and a function")
        times, values = np.asarray(t), np.asarray(energy)
    if values.shape != times.shape or times.ndim != 1:
        raise ValueError(f"energy_error: times {times.shape} and values {values.shape} must "
                         "be the same 1-D shape (plot ensemble members one call each)")
    ok = np.isfinite(times)
    times, values = times[ok], values[ok]
    err = np.abs(values - values[0])
    if relative:
        if values[0] == 0:
            raise ValueError(f"energy_error: {quantity}(0) = 0, so the relative error is "
                             "undefined; pass relative=False")
        err = err / np.abs(values[0])
    ax.plot(times, _positive(err), label=label, **line_kw)
    ax.set_yscale("log")
    ax.set_xlabel(_label("t", t_unit))
    q0 = f"{quantity}(0)"
    ax.set_ylabel(f"|{quantity}(t) - {q0}| / |{q0}|" if relative else f"|{quantity}(t) - {q0}|")
    _legend(ax, always=label is not None)
    return fig, ax


# -- convergence and work-precision ------------------------------------------------------------


def fitted_order(dts: ArrayLike, errors: ArrayLike) -> float:
    """The slope of ``log(error)`` against ``log(dt)`` by least squares (the empirical
    order), over the points where the error is positive and finite."""
    dts, errors = np.asarray(dts, float), np.asarray(errors, float)
    ok = np.isfinite(errors) & (errors > 0) & np.isfinite(dts) & (dts > 0)
    if ok.sum() < 2:
        return float("nan")
    slope, _ = np.polyfit(np.log(dts[ok]), np.log(errors[ok]), 1)
    return float(slope)


def convergence(dts: ArrayLike | Mapping[str, ArrayLike],
                errors: ArrayLike | Mapping[str, ArrayLike], *,
                order: float | Mapping[str, float] | None = None, ax: Axes | None = None,
                label: str | None = None,
                dt_unit: str | None = None, error_label: str = "error",
                fit: slice | None = None, floor: float = 0.0, marker: str = "o",
                **line_kw) -> tuple[Any, Any]:
    """Error against step size on log-log axes, with the fitted slope (the empirical order)
    in the legend and drawn through the points, and the theoretical slope for comparison.

    Args:
        dts: Step sizes ``(n,)`` (or ``{label: dts}`` matching ``errors``).
        errors: Errors ``(n,)``, or ``{label: errors}`` for several methods.
        order: The theoretical order: a number, or ``{label: order}``; drawn as a grey
            dashed line of that slope through the fitted points, labelled ``order p``.
        label: The legend label of a single series.
        fit: Which points enter the fit (a slice of the points sorted by increasing
            ``dt``; all by default), e.g. ``slice(2, None)`` drops the two smallest steps.
        floor: Errors at or below it are left out of the fit (the round-off floor, e.g.
            ``1e-13`` in float64); they are still drawn.
    """
    fig, ax = _figure(ax)
    if isinstance(errors, Mapping):
        series = {k: (dts[k] if isinstance(dts, Mapping) else dts, v) for k, v in errors.items()}
    else:
        series = {label: (dts, errors)}
    for k, (name, (d, e)) in enumerate(series.items()):
        d, e = np.asarray(d, float), np.asarray(e, float)
        idx = np.argsort(d)
        d, e = d[idx], e[idx]
        used = np.zeros(d.shape, bool)
        used[fit if fit is not None else slice(None)] = True
        used &= e > floor
        slope = fitted_order(d[used], e[used])
        color = line_kw.get("color", f"C{k % 10}")
        text = f"slope {slope:.2f}"
        ax.loglog(d, _positive(e), marker=marker, ms=4, color=color,
                  label=f"{name} ({text})" if name else text,
                  **{k2: v for k2, v in line_kw.items() if k2 != "color"})
        ok = used & np.isfinite(e) & (e > 0)
        if ok.sum() >= 2 and np.isfinite(slope):
            xs = d[ok]
            centre = np.exp(np.mean(np.log(xs))), np.exp(np.mean(np.log(e[ok])))
            ax.loglog(xs, centre[1] * (xs / centre[0]) ** slope, color=color, lw=0.8, ls=":",
                      label="_")
            p = order.get(name) if isinstance(order, Mapping) else order
            if p is not None:
                # The theoretical slope, through the fitted points' centre, shifted down by
                # half a decade so that it does not hide them.
                ax.loglog(xs, 0.3 * centre[1] * (xs / centre[0]) ** p, color="0.45", lw=1.0,
                          ls="--", label="_")
                ax.annotate(f"order {p:g}", (centre[0], 0.3 * centre[1]),
                            textcoords="offset points", xytext=(0, -11), ha="center",
                            fontsize=8, color="0.35")
    ax.set_xlabel(_label("dt", dt_unit))
    ax.set_ylabel(error_label)
    _legend(ax, always=True, fontsize=8)
    return fig, ax


def work_precision(results: Mapping[str, tuple], *, cost: str = "time", ax: Axes | None = None,
                   cost_unit: str | None = None, error_label: str = "error",
                   **line_kw) -> tuple[Any, Any]:
    """A work-precision diagram: error against cost, one line per method, log-log (lower
    left is better).

    Args:
        results: ``{method: (costs, errors)}``, each ``(n,)``, e.g. over a sweep of
            tolerances or step sizes.
        cost: ``"time"`` (wall time, in ``cost_unit``, seconds by default), ``"fevals"``
            (right-hand-side evaluations) or any other name for the horizontal axis.
    """
    fig, ax = _figure(ax)
    markers = "os^vD<>ph*"
    for k, (name, (c, e)) in enumerate(results.items()):
        c, e = np.asarray(c, float), np.asarray(e, float)
        idx = np.argsort(c)
        ax.loglog(c[idx], _positive(e[idx]), marker=markers[k % len(markers)], ms=4,
                  label=name, **line_kw)
    if cost == "time":
        xlabel = _label("wall time", cost_unit or "s")
    elif cost == "fevals":
        xlabel = _label("function evaluations", cost_unit)
    else:
        xlabel = _label(cost, cost_unit)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(error_label)
    _legend(ax, always=True, fontsize=8)
    return fig, ax


# -- fitting ---------------------------------------------------------------------------------


def fit_history(result: Any, *, ax: Axes | None = None, label: str | None = None,
                **line_kw) -> tuple[Any, Any]:
    """The loss against optimiser step (log scale), from a :class:`~simlib.FitResult`, a
    loss history array, or ``{label: FitResult}`` for several runs."""
    fig, ax = _figure(ax)
    runs = result if isinstance(result, Mapping) else {label: result}
    for name, run in runs.items():
        hist = np.asarray(getattr(run, "history", run), float)
        (line,) = ax.plot(np.arange(hist.size), _positive(hist), label=name, **line_kw)
        if getattr(run, "converged", False):
            ax.plot(hist.size - 1, hist[-1], "o", ms=4, color=line.get_color(),
                    label="_converged")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    _legend(ax, always=label is not None or isinstance(result, Mapping))
    return fig, ax


def data_vs_model(t_data: ArrayLike, y_data: ArrayLike, model: Any, *, ax: Axes | None = None,
                  labels: Sequence[str] | None = None,
                  t_unit: str | None = None, y_label: str = "state",
                  y_unit: str | None = None) -> tuple[Any, Any]:
    """Observations as markers and the model as lines, one colour per component.

    Args:
        t_data: Observation times ``(n,)``.
        y_data: Observations ``(n,)`` or ``(n, k)`` (``nan`` for missing values).
        model: The fitted model: a :class:`~simlib.Solution` (saved densely for a smooth
            line), or ``(ts, ys)`` with ``ys`` shaped like the data's components.
        labels: A name per component (default ``y[0]``, ``y[1]``, ...).
    """
    fig, ax = _figure(ax)
    t_data = np.asarray(t_data)
    y_data = np.asarray(y_data)
    y_data = y_data.reshape(t_data.shape[0], -1)
    ts, ys = _times_and_states(model)
    values, names = _components(ts, ys)
    if values.shape[-1] != y_data.shape[-1]:
        raise ValueError(f"data_vs_model: the data has {y_data.shape[-1]} components, the "
                         f"model {values.shape[-1]}")
    names = list(labels) if labels is not None else names
    ok = np.isfinite(ts)
    for i in range(y_data.shape[-1]):
        color = f"C{i % 10}"
        ax.plot(ts[ok], values[ok, i], color=color, label=f"{names[i]} model")
        ax.plot(t_data, y_data[:, i], "o", ms=3.5, mfc="none", color=color,
                label=f"{names[i]} data")
    ax.set_xlabel(_label("t", t_unit))
    ax.set_ylabel(_label(y_label, y_unit))
    _legend(ax, always=True, fontsize=8)
    return fig, ax


# -- particles -------------------------------------------------------------------------------


def radial_distribution(r: Any, g: ArrayLike | None = None, *, space: Any = None,
                        r_max: float | None = None, n_bins: int = 100,
                        ax: Axes | None = None, label: str | None = None,
                        r_unit: str | None = None, **line_kw) -> tuple[Any, Any]:
    r"""The radial distribution function :math:`g(r)`, with :math:`g = 1` (an ideal gas)
    marked.

    Args:
        r, g: Bin centres and values, from
            :func:`simlib.particles.radial_distribution`; or ``r`` a
            :class:`~simlib.particles.Trajectory` (its frames averaged) or positions
            ``(n, d)``/``(n_frames, n, d)``, with ``space`` (periodic) and ``r_max``.
    """
    fig, ax = _figure(ax)
    if g is None:
        from .particles import radial_distribution as rdf

        positions = getattr(r, "positions", r)
        if space is None or r_max is None:
            raise TypeError("radial_distribution: computing g(r) needs space= and r_max=")
        # Jitted: eagerly, the per-frame lax.map runs op by op (docs/benchmarks.md).
        r, g = jax.jit(rdf, static_argnames=("r_max", "n_bins"))(
            positions, space, r_max=float(r_max), n_bins=int(n_bins))
    ax.plot(np.asarray(r), np.asarray(g), label=label, **line_kw)
    ax.axhline(1.0, color="0.6", lw=0.8, ls="--")
    ax.set_xlim(left=0.0)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel(_label("r", r_unit))
    ax.set_ylabel("g(r)")
    _legend(ax, always=label is not None)
    return fig, ax


# -- ensembles -------------------------------------------------------------------------------


def ensemble_fan(t: Any, values: ArrayLike | None = None, *, component: int | str = 0,
                 percentiles: Sequence[float] = (5, 25),
                 members: int = 0, ax: Axes | None = None, label: str | None = None,
                 color: str = "C0",
                 t_unit: str | None = None, y_label: str | None = None,
                 y_unit: str | None = None) -> tuple[Any, Any]:
    """The median of an ensemble over time, with percentile bands.

    Args:
        t: Times ``(n,)`` (or ``(m, n)``, the same for every member); or a batched
            :class:`~simlib.Solution` from ``vmap``.
        values: ``(m, n)``, one row per member (not needed with a Solution).
        component: With a Solution, which component (index or name, as in
            :func:`trajectory`), or a function of the saved states ``ys`` returning
            ``(m, n)``.
        percentiles: Lower percentiles of the bands, each drawn from ``p`` to ``100 - p``
            (darker for the inner ones).
        members: Also draw this many members as thin lines.
    """
    fig, ax = _figure(ax)
    if values is None:
        ts, ys = _times_and_states(t)
        if ts.ndim != 2:
            raise ValueError("ensemble_fan: a Solution must be batched (vmap), with ts of "
                             f"shape (members, times); got {ts.shape}")
        if callable(component):
            values, name = np.asarray(component(ys)), "value"
        else:
            comps, names = _components(ts, ys)
            i = _select(names, component)[0]
            values, name = comps[..., i], names[i]
        t = ts
    else:
        name = "value"
    t = np.asarray(t)
    values = np.asarray(values, float)
    if t.ndim == 2:
        if not np.allclose(t, t[:1], equal_nan=True):
            raise ValueError("ensemble_fan: the members are saved at different times; save "
                             "them at common times (SaveAt(ts=...))")
        t = t[0]
    if values.ndim != 2 or values.shape[1] != t.shape[0]:
        raise ValueError(f"ensemble_fan: values must be (members, {t.shape[0]}), got "
                         f"{values.shape}")
    for j in range(min(members, values.shape[0])):
        ax.plot(t, values[j], color=color, lw=0.5, alpha=0.35, label="_")
    for k, p in enumerate(sorted(percentiles)):
        lo, hi = np.nanpercentile(values, [p, 100 - p], axis=0)
        ax.fill_between(t, lo, hi, color=color, alpha=0.18 + 0.12 * k, lw=0,
                        label=f"{p:g}-{100 - p:g}%")
    median = np.nanmedian(values, axis=0)
    ax.plot(t, median, color=color, lw=1.6,
            label=f"{label}: median of {values.shape[0]}" if label
            else f"median of {values.shape[0]}")
    ax.set_xlabel(_label("t", t_unit))
    ax.set_ylabel(_label(y_label or name, y_unit))
    _legend(ax, always=True, fontsize=8)
    return fig, ax

