"""Mechanical systems: harmonic oscillator, damped driven pendulum, double pendulum.

All vector fields have the signature ``f(t, y, args)``, are written in
``jax.numpy`` and keep the floating-point precision of their inputs.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._types import Args, Array, ArrayLike

HARMONIC_OSCILLATOR_DEFAULT_ARGS: tuple[float, float] = (1.0, 1.0)
"""Default ``(k, m)`` of :func:`harmonic_oscillator`."""

DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS: tuple[float, float, float, float, float] = (
    9.81,
    1.0,
    0.5,
    1.2,
    2.0 / 3.0,
)
"""Default ``(g, L, gamma, A, Omega)`` of :func:`damped_driven_pendulum`."""

DOUBLE_PENDULUM_DEFAULT_ARGS: tuple[float, float, float, float, float] = (
    1.0,
    1.0,
    1.0,
    1.0,
    9.81,
)
"""Default ``(m1, m2, L1, L2, g)`` of :func:`double_pendulum`."""


# --------------------------------------------------------------------------- #
# Harmonic oscillator                                                          #
# --------------------------------------------------------------------------- #


def harmonic_oscillator(
    t: ArrayLike, y: tuple[ArrayLike, ArrayLike], args: Args = None
) -> tuple[Array, Array]:
    r"""Harmonic oscillator in Hamiltonian (symplectic) form.

    .. math::

        \dot q = p / m, \qquad \dot p = -k\, q,

    the Hamiltonian flow of :math:`H(q, p) = p^2/(2m) + k q^2/2`
    (see :func:`harmonic_oscillator_energy`). ``q`` and ``p`` may be arrays of
    any (equal) shape: each component is an independent oscillator.

    Args:
        t: Time (unused; the system is autonomous).
        y: Tuple ``(q, p)`` of position and momentum arrays.
        args: ``(k, m)``: spring constant ``k`` [force/length] and mass ``m``
            [mass]. ``None`` selects the defaults ``(1.0, 1.0)``.

    Returns:
        Tuple ``(dq/dt, dp/dt)`` with the shapes of ``(q, p)``.

    References:
        E. Hairer, C. Lubich and G. Wanner, *Geometric Numerical Integration*,
        2nd ed., Springer, 2006, Section I.1.
    """
    del t
    k, m = HARMONIC_OSCILLATOR_DEFAULT_ARGS if args is None else args
    q, p = y
    q = jnp.asarray(q)
    p = jnp.asarray(p)
    return p / m, -k * q


def harmonic_oscillator_energy(y: tuple[ArrayLike, ArrayLike], args: Args = None) -> Array:
    r"""Total energy of :func:`harmonic_oscillator`.

    .. math:: H(q, p) = \sum_i \frac{p_i^2}{2m} + \frac{k\, q_i^2}{2},

    summed over all components of ``q`` and ``p``. Conserved by the flow.

    Args:
        y: Tuple ``(q, p)``.
        args: ``(k, m)``, see :func:`harmonic_oscillator`; ``None`` selects the
            defaults ``(1.0, 1.0)``.

    Returns:
        The scalar energy.

    References:
        E. Hairer, C. Lubich and G. Wanner, *Geometric Numerical Integration*,
        2nd ed., Springer, 2006, Section I.1.
    """
    k, m = HARMONIC_OSCILLATOR_DEFAULT_ARGS if args is None else args
    q, p = y
    q = jnp.asarray(q)
    p = jnp.asarray(p)
    return jnp.sum(p**2) / (2 * m) + k * jnp.sum(q**2) / 2


def harmonic_oscillator_exact(
    t: ArrayLike, y0: tuple[ArrayLike, ArrayLike], args: Args = None
) -> tuple[Array, Array]:
    r"""Closed-form solution of :func:`harmonic_oscillator`.

    With :math:`\omega = \sqrt{k/m}` and ``y0 = (q0, p0)`` given at time 0,

    .. math::

        q(t) = q_0 \cos\omega t + \frac{p_0}{m\omega} \sin\omega t, \qquad
        p(t) = p_0 \cos\omega t - m\omega\, q_0 \sin\omega t.

    Args:
        t: Time, a scalar or an array of times.
        y0: Initial state ``(q0, p0)`` at ``t = 0``.
        args: ``(k, m)``, see :func:`harmonic_oscillator`; ``None`` selects the
            defaults ``(1.0, 1.0)``.

    Returns:
        Tuple ``(q, p)``, each of shape ``jnp.shape(t) + jnp.shape(q0)``.

    References:
        H. Goldstein, C. Poole and J. Safko, *Classical Mechanics*, 3rd ed.,
        Addison-Wesley, 2002, Chapter 6.
    """
    k, m = HARMONIC_OSCILLATOR_DEFAULT_ARGS if args is None else args
    q0, p0 = y0
    q0 = jnp.asarray(q0)
    p0 = jnp.asarray(p0)
    t = jnp.asarray(t)
    omega = jnp.sqrt(k / m)
    wt = jnp.reshape(omega * t, t.shape + (1,) * q0.ndim)
    c = jnp.cos(wt)
    s = jnp.sin(wt)
    q = q0 * c + p0 / (m * omega) * s
    p = p0 * c - m * omega * q0 * s
    return q, p


# --------------------------------------------------------------------------- #
# Damped driven pendulum                                                       #
# --------------------------------------------------------------------------- #


def damped_driven_pendulum(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""Damped, periodically driven pendulum.

    .. math::

        \ddot\theta = -\frac{g}{L}\sin\theta - \gamma\,\dot\theta
                      + A\cos(\Omega t),

    written as a first-order system in ``y = [theta, omega]``:
    ``theta' = omega``, ``omega' = -(g/L) sin(theta) - gamma omega + A cos(Omega t)``.

    Args:
        t: Time [s].
        y: State ``[theta, omega]``: angle from the downward vertical [rad] and
            angular velocity [rad/s]. Leading batch axes are allowed; the state
            is the last axis.
        args: ``(g, L, gamma, A, Omega)``: gravitational acceleration ``g``
            [m/s^2], length ``L`` [m], damping rate ``gamma`` [1/s], drive
            amplitude ``A`` [rad/s^2] and drive angular frequency ``Omega``
            [rad/s]. ``None`` selects the defaults ``(9.81, 1.0, 0.5, 1.2, 2/3)``.

    Returns:
        ``dy/dt`` with the shape of ``y``.

    References:
        G. L. Baker and J. P. Gollub, *Chaotic Dynamics: An Introduction*,
        2nd ed., Cambridge University Press, 1996.
    """
    g, L, gamma, A, Omega = DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    theta = y[..., 0]
    omega = y[..., 1]
    domega = -(g / L) * jnp.sin(theta) - gamma * omega + A * jnp.cos(Omega * t)
    return jnp.stack([omega, domega], axis=-1)


# --------------------------------------------------------------------------- #
# Double pendulum                                                              #
# --------------------------------------------------------------------------- #


def _double_pendulum_unpack(y: ArrayLike, args: Args) -> tuple[tuple, tuple]:
    """``((m1, m2, L1, L2, g), (theta1, theta2, omega1, omega2))`` of a double pendulum
    state (leading batch axes kept) and its ``args`` (``None``: the defaults)."""
    y = jnp.asarray(y)
    params = DOUBLE_PENDULUM_DEFAULT_ARGS if args is None else args
    return params, (y[..., 0], y[..., 1], y[..., 2], y[..., 3])


def double_pendulum(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""Planar double pendulum of two point masses on massless rigid rods.

    Angles are measured from the downward vertical. The Lagrangian is

    .. math::

        \mathcal L = \tfrac12 (m_1 + m_2) L_1^2 \dot\theta_1^2
          + \tfrac12 m_2 L_2^2 \dot\theta_2^2
          + m_2 L_1 L_2 \dot\theta_1 \dot\theta_2 \cos(\theta_1 - \theta_2)
          + (m_1 + m_2) g L_1 \cos\theta_1 + m_2 g L_2 \cos\theta_2 ,

    and the Euler-Lagrange equations are the linear system
    :math:`M(\theta)\,\ddot\theta = r(\theta, \dot\theta)` with
    :math:`\Delta = \theta_1 - \theta_2`,

    .. math::

        M = \begin{pmatrix} (m_1 + m_2) L_1^2 & m_2 L_1 L_2 \cos\Delta \\
                            m_2 L_1 L_2 \cos\Delta & m_2 L_2^2 \end{pmatrix},
        \quad
        r = \begin{pmatrix}
              -m_2 L_1 L_2 \dot\theta_2^2 \sin\Delta - (m_1 + m_2) g L_1 \sin\theta_1 \\
              \phantom{-}m_2 L_1 L_2 \dot\theta_1^2 \sin\Delta - m_2 g L_2 \sin\theta_2
            \end{pmatrix},

    solved here in closed form (Cramer's rule,
    :math:`\det M = m_2 L_1^2 L_2^2 (m_1 + m_2 \sin^2\Delta) > 0`).

    Args:
        t: Time [s] (unused; the system is autonomous).
        y: State ``[theta1, theta2, omega1, omega2]``: angles [rad] of the inner
            and outer rod and their angular velocities [rad/s]. Leading batch
            axes are allowed; the state is the last axis.
        args: ``(m1, m2, L1, L2, g)``: masses [kg], rod lengths [m] and
            gravitational acceleration [m/s^2]. ``None`` selects the defaults
            ``(1.0, 1.0, 1.0, 1.0, 9.81)``.

    Returns:
        ``dy/dt`` with the shape of ``y``.

    References:
        J. R. Taylor, *Classical Mechanics*, University Science Books, 2005,
        Chapter 7 (Lagrange's equations). T. Shinbrot, C. Grebogi, J. Wisdom and
        J. A. Yorke, "Chaos in a double pendulum", *Am. J. Phys.* 60 (1992)
        491-499.
    """
    del t
    (m1, m2, L1, L2, g), (th1, th2, w1, w2) = _double_pendulum_unpack(y, args)
    delta = th1 - th2
    cd = jnp.cos(delta)
    sd = jnp.sin(delta)
    m12 = m1 + m2
    # Mass matrix M = [[a, b], [b, d]] and right-hand side r = [r1, r2].
    a = m12 * L1**2
    b = m2 * L1 * L2 * cd
    d = m2 * L2**2
    r1 = -m2 * L1 * L2 * w2**2 * sd - m12 * g * L1 * jnp.sin(th1)
    r2 = m2 * L1 * L2 * w1**2 * sd - m2 * g * L2 * jnp.sin(th2)
    det = m2 * L1**2 * L2**2 * (m1 + m2 * sd**2)
    dw1 = (d * r1 - b * r2) / det
    dw2 = (a * r2 - b * r1) / det
    return jnp.stack([w1, w2, dw1, dw2], axis=-1)


def double_pendulum_energy(y: ArrayLike, args: Args = None) -> Array:
    r"""Total mechanical energy of :func:`double_pendulum` (conserved).

    .. math::

        E = \tfrac12 (m_1 + m_2) L_1^2 \dot\theta_1^2
          + \tfrac12 m_2 L_2^2 \dot\theta_2^2
          + m_2 L_1 L_2 \dot\theta_1 \dot\theta_2 \cos(\theta_1 - \theta_2)
          - (m_1 + m_2) g L_1 \cos\theta_1 - m_2 g L_2 \cos\theta_2 .

    The zero of potential energy is at the pivot.

    Args:
        y: State ``[theta1, theta2, omega1, omega2]``; leading batch axes are
            allowed.
        args: ``(m1, m2, L1, L2, g)``, see :func:`double_pendulum`; ``None``
            selects the defaults ``(1.0, 1.0, 1.0, 1.0, 9.81)``.

    Returns:
        The energy [J], with the batch shape of ``y``.

    References:
        J. R. Taylor, *Classical Mechanics*, University Science Books, 2005,
        Chapter 7.
    """
    (m1, m2, L1, L2, g), (th1, th2, w1, w2) = _double_pendulum_unpack(y, args)
    m12 = m1 + m2
    kinetic = (
        0.5 * m12 * L1**2 * w1**2
        + 0.5 * m2 * L2**2 * w2**2
        + m2 * L1 * L2 * w1 * w2 * jnp.cos(th1 - th2)
    )
    potential = -m12 * g * L1 * jnp.cos(th1) - m2 * g * L2 * jnp.cos(th2)
    return kinetic + potential


__all__ = [
    "DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS",
    "DOUBLE_PENDULUM_DEFAULT_ARGS",
    "HARMONIC_OSCILLATOR_DEFAULT_ARGS",
    "damped_driven_pendulum",
    "double_pendulum",
    "double_pendulum_energy",
    "harmonic_oscillator",
    "harmonic_oscillator_energy",
    "harmonic_oscillator_exact",
]
