"""The Kepler (two-body) problem, its invariants and its closed-form solution.

All functions are written in ``jax.numpy`` and keep the floating-point
precision of their inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ._types import Args, Array, ArrayLike

KEPLER_DEFAULT_ARGS: tuple[float] = (1.0,)
"""Default ``(mu,)`` of :func:`kepler`."""

KEPLER_NEWTON_ITERATIONS: int = 30
"""Newton iterations used by :func:`kepler_exact` to solve Kepler's equation."""

_TWO_PI = 2.0 * jnp.pi


def kepler(t: ArrayLike, y: tuple[ArrayLike, ArrayLike], args: Args = None) -> tuple[Array, Array]:
    r"""Planar Kepler problem (two bodies in relative coordinates), separable form.

    .. math::

        \dot q = p, \qquad \dot p = -\mu \frac{q}{\lVert q \rVert^3},

    the Hamiltonian flow of :math:`H = \lVert p\rVert^2/2 - \mu/\lVert q\rVert`
    (see :func:`kepler_energy`), with ``q`` the relative position, ``p`` the
    relative velocity (momentum per unit reduced mass).

    Args:
        t: Time (unused; the system is autonomous).
        y: Tuple ``(q, p)``, each of shape ``(2,)`` (leading batch axes are
            allowed; the coordinates are the last axis).
        args: ``(mu,)``: gravitational parameter :math:`\mu = G(m_1 + m_2)`
            [length^3/time^2]. ``None`` selects the default ``(1.0,)``.

    Returns:
        Tuple ``(dq/dt, dp/dt)`` with the shapes of ``(q, p)``.

    References:
        C. D. Murray and S. F. Dermott, *Solar System Dynamics*, Cambridge
        University Press, 1999, Chapter 2.
    """
    del t
    (mu,) = KEPLER_DEFAULT_ARGS if args is None else args
    q, p = y
    q = jnp.asarray(q)
    p = jnp.asarray(p)
    r2 = jnp.sum(q**2, axis=-1, keepdims=True)
    r3 = r2 * jnp.sqrt(r2)
    return p, -mu * q / r3


def kepler_energy(y: tuple[ArrayLike, ArrayLike], args: Args = None) -> Array:
    r"""Energy (Hamiltonian) of :func:`kepler` per unit reduced mass.

    .. math:: H(q, p) = \tfrac12 \lVert p\rVert^2 - \frac{\mu}{\lVert q\rVert}.

    Negative for bound (elliptic) orbits, where :math:`H = -\mu/(2a)`.

    Args:
        y: Tuple ``(q, p)`` (leading batch axes allowed).
        args: ``(mu,)``; ``None`` selects the default ``(1.0,)``.

    Returns:
        The energy, with the batch shape of ``q``.

    References:
        C. D. Murray and S. F. Dermott, *Solar System Dynamics*, Cambridge
        University Press, 1999, Chapter 2.
    """
    (mu,) = KEPLER_DEFAULT_ARGS if args is None else args
    q, p = y
    q = jnp.asarray(q)
    p = jnp.asarray(p)
    return 0.5 * jnp.sum(p**2, axis=-1) - mu / jnp.sqrt(jnp.sum(q**2, axis=-1))


def kepler_angular_momentum(y: tuple[ArrayLike, ArrayLike], args: Args = None) -> Array:
    r"""Angular momentum of :func:`kepler` per unit reduced mass (conserved).

    .. math:: h = q_x p_y - q_y p_x .

    Args:
        y: Tuple ``(q, p)`` (leading batch axes allowed).
        args: ``(mu,)`` (unused; accepted for a uniform signature).

    Returns:
        ``h``, with the batch shape of ``q``; positive for counter-clockwise
        motion.

    References:
        C. D. Murray and S. F. Dermott, *Solar System Dynamics*, Cambridge
        University Press, 1999, Chapter 2.
    """
    del args
    q, p = y
    q = jnp.asarray(q)
    p = jnp.asarray(p)
    return q[..., 0] * p[..., 1] - q[..., 1] * p[..., 0]


class KeplerElements(NamedTuple):
    """Orbital elements of a planar elliptic Kepler orbit (see :func:`kepler_elements`).

    Attributes:
        a: Semi-major axis.
        e_vec: Eccentricity vector (points to the periapsis), shape ``(2,)``.
        e: Eccentricity ``|e_vec|``.
        n: Mean motion ``sqrt(mu / a**3)``; the period is ``2 pi / n``.
        E0: Eccentric anomaly at ``t = 0``, in ``(-pi, pi]``.
        M0: Mean anomaly at ``t = 0``, ``E0 - e sin(E0)``.
        omega: Argument of periapsis, the angle of ``e_vec`` from the x axis.
        h: Angular momentum (its sign is the sense of rotation).
    """

    a: Array
    e_vec: Array
    e: Array
    n: Array
    E0: Array
    M0: Array
    omega: Array
    h: Array


def _safe_norm2(x: Array, y: Array) -> tuple[Array, Array, Array]:
    """``sqrt(x^2 + y^2)`` and ``(x, y)`` replaced by ``(1, 0)`` where both vanish.

    Keeps ``sqrt`` and ``arctan2`` differentiable at the origin (circular orbits).
    """
    r2 = x**2 + y**2
    nonzero = r2 > 0
    safe_r2 = jnp.where(nonzero, r2, 1)
    norm = jnp.where(nonzero, jnp.sqrt(safe_r2), 0)
    return norm, jnp.where(nonzero, x, 1), jnp.where(nonzero, y, 0)


def kepler_elements(y0: tuple[ArrayLike, ArrayLike], args: Args = None) -> KeplerElements:
    r"""Orbital elements of the elliptic orbit through ``y0 = (q0, p0)`` at ``t = 0``.

    With :math:`r_0 = \lVert q_0\rVert`, :math:`v_0 = \lVert p_0\rVert` and
    :math:`\sigma_0 = q_0\cdot p_0`:

    .. math::

        a = \Bigl(\frac{2}{r_0} - \frac{v_0^2}{\mu}\Bigr)^{-1}, \quad
        \mathbf e = \frac{(v_0^2 - \mu/r_0)\, q_0 - \sigma_0\, p_0}{\mu}, \quad
        n = \sqrt{\mu / a^3},

    .. math::

        e\cos E_0 = 1 - r_0/a, \quad e\sin E_0 = \frac{\sigma_0}{\sqrt{\mu a}},
        \quad M_0 = E_0 - e\sin E_0, \quad \omega = \operatorname{atan2}(e_y, e_x).

    Args:
        y0: Initial state ``(q0, p0)``, each of shape ``(2,)``; must be bound
            (negative energy), otherwise the elements are NaN.
        args: ``(mu,)``; ``None`` selects the default ``(1.0,)``.

    Returns:
        A :class:`KeplerElements`.

    References:
        C. D. Murray and S. F. Dermott, *Solar System Dynamics*, Cambridge
        University Press, 1999, Sections 2.4-2.8.
    """
    (mu,) = KEPLER_DEFAULT_ARGS if args is None else args
    q0, p0 = y0
    q0 = jnp.asarray(q0)
    p0 = jnp.asarray(p0)
    r0 = jnp.sqrt(jnp.sum(q0**2, axis=-1))
    v2 = jnp.sum(p0**2, axis=-1)
    sigma0 = jnp.sum(q0 * p0, axis=-1)
    a = 1 / (2 / r0 - v2 / mu)
    e_vec = ((v2 - mu / r0)[..., None] * q0 - sigma0[..., None] * p0) / mu
    e_cos = 1 - r0 / a
    e_sin = sigma0 / jnp.sqrt(mu * a)
    e, x, y = _safe_norm2(e_cos, e_sin)
    E0 = jnp.arctan2(y, x)
    M0 = E0 - e_sin
    n = jnp.sqrt(mu / a**3)
    _, ex, ey = _safe_norm2(e_vec[..., 0], e_vec[..., 1])
    omega = jnp.arctan2(ey, ex)
    h = kepler_angular_momentum((q0, p0))
    return KeplerElements(a=a, e_vec=e_vec, e=e, n=n, E0=E0, M0=M0, omega=omega, h=h)


def solve_kepler_equation(
    M: ArrayLike, e: ArrayLike, iterations: int = KEPLER_NEWTON_ITERATIONS
) -> Array:
    r"""Solve Kepler's equation :math:`E - e\sin E = M` for the eccentric anomaly.

    Newton's method with a fixed number of iterations (``lax.fori_loop``), from
    the starting value :math:`E = M + 0.85\, e\, \operatorname{sign}(\sin M)`
    (Danby 1987), which converges for every ``M`` and ``0 <= e < 1``. ``M`` is
    first reduced to ``[-pi, pi)``; the result is shifted back, so
    ``E - M`` is periodic and ``E`` is continuous in ``M``.

    Args:
        M: Mean anomaly [rad], any shape.
        e: Eccentricity, ``0 <= e < 1``, broadcastable against ``M``.
        iterations: Number of Newton iterations (static).

    Returns:
        The eccentric anomaly ``E`` [rad], broadcast shape of ``M`` and ``e``.

    References:
        J. M. A. Danby, "The solution of Kepler's equation, III", *Celestial
        Mechanics* 40 (1987) 303-312.
    """
    Er, k = _solve_kepler_reduced(M, e, iterations)
    return Er + _TWO_PI * k


def _solve_kepler_reduced(M: ArrayLike, e: ArrayLike, iterations: int) -> tuple[Array, Array]:
    """Solve Kepler's equation for ``M - 2 pi k`` in ``[-pi, pi)``; return ``(E_r, k)``."""
    M = jnp.asarray(M)
    e = jnp.asarray(e)
    k = jnp.floor((M + jnp.pi) / _TWO_PI)
    Mr = M - _TWO_PI * k
    Mr, e = jnp.broadcast_arrays(Mr, e)
    E_init = Mr + 0.85 * e * jnp.sign(jnp.sin(Mr))

    def newton(_: int, E: Array) -> Array:
        return E - (E - e * jnp.sin(E) - Mr) / (1 - e * jnp.cos(E))

    Er = jax.lax.fori_loop(0, iterations, newton, E_init)
    return Er, jnp.broadcast_to(k, Er.shape)


def kepler_exact(
    t: ArrayLike, y0: tuple[ArrayLike, ArrayLike], args: Args = None
) -> tuple[Array, Array]:
    r"""Closed-form solution of :func:`kepler` for an elliptic orbit.

    The orbital elements of ``y0`` (given at ``t = 0``) come from
    :func:`kepler_elements`; Kepler's equation
    :math:`E - e\sin E = M_0 + n t` is solved for the eccentric anomaly by
    Newton's method (:func:`solve_kepler_equation`, 30 iterations). With
    :math:`\Delta E = E - E_0` the state follows from the Lagrange ``f`` and
    ``g`` coefficients,

    .. math::

        q(t) = F q_0 + G p_0, \qquad p(t) = \dot F q_0 + \dot G p_0,

    .. math::

        F = 1 - \frac{a}{r_0}(1 - \cos\Delta E), \quad
        G = r_0\sqrt{a/\mu}\,\sin\Delta E + \frac{\sigma_0 a}{\mu}(1 - \cos\Delta E),

    .. math::

        \dot F = -\frac{\sqrt{\mu a}}{r r_0}\sin\Delta E, \quad
        \dot G = 1 - \frac{a}{r}(1 - \cos\Delta E), \quad r = a(1 - e\cos E),

    which is the perifocal solution :math:`(a(\cos E - e), b\sin E)` rotated by
    the argument of periapsis (and reflected for clockwise orbits), written in
    the basis :math:`(q_0, p_0)`. This form is free of cancellation for many
    periods and stays well defined for circular orbits, where the periapsis
    direction is not.

    Args:
        t: Time, a scalar or an array of any shape.
        y0: Initial state ``(q0, p0)`` at ``t = 0``, each of shape ``(2,)``,
            with negative energy (bound orbit; otherwise the result is NaN).
        args: ``(mu,)``; ``None`` selects the default ``(1.0,)``.

    Returns:
        Tuple ``(q, p)``, each of shape ``jnp.shape(t) + (2,)``.

    References:
        C. D. Murray and S. F. Dermott, *Solar System Dynamics*, Cambridge
        University Press, 1999, Chapter 2. J. M. A. Danby, *Fundamentals of
        Celestial Mechanics*, 2nd ed., Willmann-Bell, 1988, Chapter 6.
    """
    (mu,) = KEPLER_DEFAULT_ARGS if args is None else args
    q0, p0 = y0
    q0 = jnp.asarray(q0)
    p0 = jnp.asarray(p0)
    el = kepler_elements((q0, p0), (mu,))
    t = jnp.asarray(t)
    r0 = jnp.sqrt(jnp.sum(q0**2))
    sigma0 = jnp.sum(q0 * p0)
    a = el.a
    # Only E mod 2 pi matters below: work with the reduced anomaly so that the
    # trigonometric arguments stay small however many periods have elapsed.
    E, _ = _solve_kepler_reduced(el.M0 + el.n * t, el.e, KEPLER_NEWTON_ITERATIONS)
    dE = E - el.E0
    c = jnp.cos(dE)
    s = jnp.sin(dE)
    r = a * (1 - el.e * jnp.cos(E))
    F = 1 - a / r0 * (1 - c)
    G = r0 * jnp.sqrt(a / mu) * s + sigma0 * a / mu * (1 - c)
    Fdot = -jnp.sqrt(mu * a) * s / (r * r0)
    Gdot = 1 - a / r * (1 - c)
    q = F[..., None] * q0 + G[..., None] * p0
    p = Fdot[..., None] * q0 + Gdot[..., None] * p0
    return q, p


__all__ = [
    "KEPLER_DEFAULT_ARGS",
    "KEPLER_NEWTON_ITERATIONS",
    "KeplerElements",
    "kepler",
    "kepler_angular_momentum",
    "kepler_elements",
    "kepler_energy",
    "kepler_exact",
    "solve_kepler_equation",
]
