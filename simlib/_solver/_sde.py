"""Stochastic methods for ``dy = f(t, y) dt + g(t, y) dW``: Euler-Maruyama, Milstein,
stochastic Heun and Rößler's SRA1.

A method sees the drift and the diffusion through the driver's vector field, which for an
SDE returns the pair ``(f, g)`` (simlib/_sde.py), and the Brownian path through ``args``;
its carried state is the path's: ``(W(t), I(t))``, the path and its time integral at the
current time, for the tree (a step costs one path query), the step counter for
``BrownianSteps``. References: Kloeden and Platen, *Numerical Solution of
Stochastic Differential Equations* (1992), 10.2 (Euler-Maruyama), 10.3 (Milstein), 11.1
and 15 (Heun, Stratonovich); Rößler, "Runge-Kutta methods for the strong approximation of
solutions of stochastic differential equations", SIAM J. Numer. Anal. 48(3), 2010 (SRA1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._base import AbstractSolver, register_static, user_args

__all__ = ["AbstractSDESolver", "EulerMaruyama", "Milstein", "SRA1", "StochasticHeun",
           "noise_term"]

NOISE_TYPES = ("diagonal", "scalar", "general")


def _sde_args(f, args):
    """The solve's ``_SDEArgs`` (user args, path, noise) from the driver's ``args``."""
    return user_args(f, args)


def noise_term(noise: str, g, dw, y):
    """``g dW`` as a pytree like ``y``. ``dw`` is flat: ``(d,)`` for diagonal noise (``d``
    the size of ``y``, in leaf order), ``(1,)`` for scalar noise, ``(m,)`` for general."""
    if noise == "scalar":
        return jax.tree_util.tree_map(lambda gl: gl * dw[0].astype(gl.dtype), g)
    if noise == "general":
        return jax.tree_util.tree_map(lambda gl: gl @ dw.astype(gl.dtype), g)
    leaves, treedef = jax.tree_util.tree_flatten(g)
    sizes = np.cumsum([int(np.prod(x.shape)) for x in leaves])[:-1]
    parts = jnp.split(dw, sizes)
    return jax.tree_util.tree_unflatten(treedef, [
        gl * p.reshape(gl.shape).astype(gl.dtype) for gl, p in zip(leaves, parts, strict=True)])


def _add(*trees):
    return jax.tree_util.tree_map(lambda *xs: sum(xs[1:], xs[0]), *trees)


def _scale(c, tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(c, x.dtype) * x, tree)


class AbstractSDESolver(AbstractSolver):
    """A fixed-step method for ``dy = f dt + g dW``.

    Attributes:
        strong_order: Order of ``E|y_N - y(T)|`` in ``dt`` (on the same Brownian path).
        weak_order: Order of ``|E phi(y_N) - E phi(y(T))|`` for smooth ``phi``.
        calculus: ``"ito"`` or ``"stratonovich"``: which SDE the method solves.
        noise_types: The noise types it accepts (``"diagonal"``, ``"scalar"``,
            ``"general"``).
        needs_area: Whether a step uses ``int (W_s - W_t) ds`` as well as ``dW``.
        additive_noise_only: Whether the method is only convergent for ``g`` independent
            of ``y`` (``solve`` checks the diffusion's jaxpr and raises if it reads ``y``).
    """

    strong_order: float = 0.5
    weak_order: float = 1.0
    calculus: str = "ito"
    noise_types: tuple[str, ...] = NOISE_TYPES
    needs_area: bool = False
    additive_noise_only: bool = False
    fevals_per_step = 1

    def init(self, f, t, y, args, f0=None):
        a = _sde_args(f, args)
        return a.path._start(t, self.needs_area)

    def _increments(self, f, t, h, args, state):
        """``(sde_args, dW, dZ, state1)`` for the step ``[t, t + h]``; ``dZ`` is
        ``int_t^{t+h} (W_s - W_t) ds`` when the method needs it."""
        a = _sde_args(f, args)
        dw, dz, state1 = a.path._step(t, h, state, self.needs_area)
        return a, dw, dz, state1


@register_static
class EulerMaruyama(AbstractSDESolver):
    """Euler-Maruyama, ``y_{n+1} = y_n + f h + g dW`` (Itô; strong order 0.5, weak 1;
    Kloeden and Platen 1992, 10.2)."""

    order = 0.5
    reference = "Kloeden & Platen 1992, sec. 10.2"

    def step(self, f, t, y, h, args, state):
        a, dw, _, state1 = self._increments(f, t, h, args, state)
        drift, g = f(t, y, args)
        y1 = _add(y, _scale(h, drift), noise_term(a.noise, g, dw, y))
        return y1, None, None, state1


@register_static
class Milstein(AbstractSDESolver):
    """Milstein, ``y_{n+1} = y_n + f h + g dW + (1/2) (g' g) (dW^2 - h)`` (Itô; strong
    order 1, weak 1; Kloeden and Platen 1992, 10.3). ``g' g`` is the Jacobian-vector product
    of ``g`` along ``g`` (JAX forward mode); for diagonal noise ``g_i`` must depend on
    ``y_i`` only (commutative noise), for scalar noise it is exact."""

    order = 1.0
    strong_order = 1.0
    noise_types = ("diagonal", "scalar")
    reference = "Kloeden & Platen 1992, sec. 10.3"

    def step(self, f, t, y, h, args, state):
        a, dw, _, state1 = self._increments(f, t, h, args, state)

        def diffusion(y_):
            return f(t, y_, args)[1]

        drift, g = f(t, y, args)
        _, gg = jax.jvp(diffusion, (y,), (g,))
        corr = 0.5 * (dw * dw - h.astype(dw.dtype))
        y1 = _add(y, _scale(h, drift), noise_term(a.noise, g, dw, y),
                  noise_term(a.noise, gg, corr, y))
        return y1, None, None, state1


@register_static
class StochasticHeun(AbstractSDESolver):
    """Stochastic Heun (trapezoidal predictor-corrector), Stratonovich:
    ``y~ = y + f h + g dW``, ``y_{n+1} = y + (f + f~) h/2 + (g + g~) dW/2``
    (strong order 1 for commutative noise, 0.5 in general; weak 1; Kloeden and Platen
    1992, 11.1 and 15.1). Adaptive with ``rtol``/``atol``: the error estimate is
    ``y_{n+1} - y~`` (Heun against its Euler predictor), the path a
    ``VirtualBrownianPath`` of the key (docs/sde.md)."""

    order = 0.5
    calculus = "stratonovich"
    fevals_per_step = 2
    adaptive = True
    error_order = 1
    reference = "Kloeden & Platen 1992, sec. 11.1, 15.1"

    def step(self, f, t, y, h, args, state):
        a, dw, _, state1 = self._increments(f, t, h, args, state)
        drift, g = f(t, y, args)
        pred = _add(y, _scale(h, drift), noise_term(a.noise, g, dw, y))
        drift1, g1 = f(t + h, pred, args)
        y1 = _add(y, _scale(0.5 * h, _add(drift, drift1)),
                  _scale(0.5, noise_term(a.noise, _add(g, g1), dw, y)))
        # error estimate (adaptive runs): the step minus its Euler predictor,
        # (f~ - f) h/2 + (g~ - g) dW/2
        err = jax.tree_util.tree_map(lambda a_, b_: a_ - b_, y1, pred)
        return y1, err, None, state1

    def interpolate(self, f, args, t, y, h, y1, dense, theta):
        """Linear between the step's ends (the SDE's solution between steps is not a
        function of the step's data; saved values at ``SaveAt(ts=...)`` of an adaptive run
        are this interpolant)."""
        return jax.tree_util.tree_map(lambda a_, b_: a_ + theta * (b_ - a_), y, y1)


@register_static
class SRA1(AbstractSDESolver):
    """Rößler's SRA1 for additive noise (``g`` independent of ``y``; it may depend on
    ``t``): strong order 1.5, weak order 2 (Rößler 2010, SIAM J. Numer. Anal. 48(3),
    sec. 4, SRA1). Two drift stages; uses ``dZ = int_t^{t+h} (W_s - W_t) ds``:

    ``H = y + (3/4) h f(t, y) + (3/2) g(t + h) dZ / h``,
    ``y_{n+1} = y + h (f(t, y)/3 + 2 f(t + 3h/4, H)/3) + g(t + h) (dW - dZ/h)
    + g(t) dZ/h``.

    Itô and Stratonovich coincide for additive noise.
    """

    order = 1.5
    strong_order = 1.5
    weak_order = 2.0
    needs_area = True
    additive_noise_only = True
    fevals_per_step = 2
    reference = "Rößler 2010, SIAM J. Numer. Anal. 48(3), SRA1"

    def step(self, f, t, y, h, args, state):
        a, dw, dz, state1 = self._increments(f, t, h, args, state)
        hz = h.astype(dz.dtype)
        zh = jnp.where(hz != 0, dz / jnp.where(hz != 0, hz, 1.0), 0.0)  # h = 0: padding
        drift0, g0 = f(t, y, args)
        _, g1 = f(t + h, y, args)
        stage = _add(y, _scale(0.75 * h, drift0), _scale(1.5, noise_term(a.noise, g1, zh, y)))
        drift1, _ = f(t + 0.75 * h, stage, args)
        y1 = _add(y, _scale(h, _add(_scale(1.0 / 3.0, drift0), _scale(2.0 / 3.0, drift1))),
                  noise_term(a.noise, g1, dw - zh, y), noise_term(a.noise, g0, zh, y))
        return y1, None, None, state1
