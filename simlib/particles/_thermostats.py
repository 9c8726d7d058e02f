r"""Thermostats with a conserved quantity: Nose-Hoover chains and stochastic velocity rescaling.

Both wrap velocity Verlet in a symmetric splitting, thermostat(h/2) · Verlet(h) ·
thermostat(h/2) (Trotter, Suzuki), so they stay second order with one force evaluation a
step, and both report a conserved quantity in :attr:`Trajectory.conserved`, the check
that the run samples what it should (its drift goes as :math:`h^2`).

Degrees of freedom: :math:`N_f = d(n - 1)` by default, the kinetic degrees of freedom of
a system whose total momentum is conserved and zero (a periodic box; both thermostats
scale all velocities by one factor, so they keep it zero). Give ``dof`` otherwise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ._dynamics import Carry, Integrator, kinetic, velocity_verlet

# Suzuki-Yoshida weights (Yoshida, Phys. Lett. A 150, 262 (1990)): a symmetric composition of
# 2nd-order steps of lengths w_j h, of order 2 (1 weight), 4 (3) or 6 (5 weights, the
# "fourth-order" set of Martyna, Tuckerman, Tobias & Klein 1996, eq. 29).
_W3 = 1.0 / (2.0 - 2.0 ** (1.0 / 3.0))
_W5 = 1.0 / (4.0 - 4.0 ** (1.0 / 3.0))
SUZUKI_YOSHIDA = {1: (1.0,), 3: (_W3, 1.0 - 2.0 * _W3, _W3),
                  5: (_W5, _W5, 1.0 - 4.0 * _W5, _W5, _W5)}


def degrees_of_freedom(dof: int | None, positions: jax.Array) -> int:
    """``dof``, or by default :math:`d(n - 1)` for ``n`` particles in ``d`` dimensions
    (the centre-of-mass momentum is conserved)."""
    n, d = positions.shape
    return d * (n - 1) if dof is None else int(dof)


class ChainState(NamedTuple):
    """The chain's positions :math:`\\xi_k` and momenta :math:`p_{\\xi_k}`, each ``(M,)``."""

    xi: jax.Array
    p_xi: jax.Array


@jax.tree_util.register_pytree_node_class
class NoseHooverChain(Integrator):
    r"""Nose-Hoover chain thermostat (NVT): deterministic, with a conserved extended energy.

    Martyna, Klein & Tuckerman, J. Chem. Phys. 97, 2635 (1992):

    .. math::
        \dot v_i = F_i/m_i - \frac{p_{\xi_1}}{Q_1} v_i,\quad
        \dot\xi_k = \frac{p_{\xi_k}}{Q_k},\quad
        \dot p_{\xi_k} = G_k - p_{\xi_k}\frac{p_{\xi_{k+1}}}{Q_{k+1}},\quad
        G_1 = 2K - N_f kT,\ G_k = \frac{p_{\xi_{k-1}}^2}{Q_{k-1}} - kT,

    the last thermostat without the friction term, masses :math:`Q_1 = N_f kT\tau^2` and
    :math:`Q_{k>1} = kT\tau^2`. It conserves

    .. math::
        H = K + U + \sum_k \frac{p_{\xi_k}^2}{2Q_k} + N_f kT\,\xi_1 + kT\sum_{k>1}\xi_k

    (:attr:`Trajectory.conserved`). The chain is propagated over each half step by
    ``n_inner`` sub-steps composed with Suzuki-Yoshida weights (``suzuki_yoshida`` = 1,
    3 or 5 of them), each a symmetric Trotter splitting (Martyna, Tuckerman, Tobias &
    Klein, Mol. Phys. 87, 1117 (1996), §4): second order in ``dt`` overall, one force
    evaluation a step.

    Args:
        kT: Temperature (energy units); an array leaf.
        tau: The thermostat's time scale (a few tens of steps; e.g. ``100 * dt``).
        chain_length: Thermostats in the chain, :math:`M` (3 by default).
        n_inner: Sub-steps of the chain per half step.
        suzuki_yoshida: Weights per sub-step: 1, 3 or 5.
        dof: Degrees of freedom :math:`N_f`; ``d (n - 1)`` by default.
    """

    def __init__(self, kT: float, tau: float, chain_length: int = 3, n_inner: int = 1,
                 suzuki_yoshida: int = 3, dof: int | None = None) -> None:
        if int(chain_length) < 1:
            raise ValueError(f"NoseHooverChain: chain_length must be >= 1, got {chain_length!r}")
        if int(n_inner) < 1:
            raise ValueError(f"NoseHooverChain: n_inner must be >= 1, got {n_inner!r}")
        if suzuki_yoshida not in SUZUKI_YOSHIDA:
            raise ValueError(f"NoseHooverChain: suzuki_yoshida must be 1, 3 or 5, got "
                             f"{suzuki_yoshida!r}")
        self.kT, self.tau = kT, tau
        self.chain_length, self.n_inner = int(chain_length), int(n_inner)
        self.suzuki_yoshida = suzuki_yoshida
        self.dof = None if dof is None else int(dof)

    def tree_flatten(self):
        return (self.kT, self.tau), (self.chain_length, self.n_inner, self.suzuki_yoshida,
                                     self.dof)

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(*children, *static)

    def __repr__(self):
        return (f"NoseHooverChain(kT={self.kT!r}, tau={self.tau!r}, "
                f"chain_length={self.chain_length})")

    def _masses(self, nf, dtype):
        kT, tau = jnp.asarray(self.kT, dtype), jnp.asarray(self.tau, dtype)
        q = jnp.full((self.chain_length,), kT * tau * tau, dtype)
        return q.at[0].multiply(nf)

    def init(self, model, carry: Carry, masses, params):
        zeros = jnp.zeros((self.chain_length,), carry.velocities.dtype)
        return ChainState(zeros, zeros)

    def _chain(self, chain: ChainState, kinetic_energy, nf, time):
        """The chain and the velocity scale factor after ``time`` of the thermostat part."""
        dtype = kinetic_energy.dtype
        q = self._masses(nf, dtype)
        kT = jnp.asarray(self.kT, dtype)
        xi, p = chain.xi, chain.p_xi
        m = self.chain_length
        scale = jnp.ones((), dtype)

        def force(k, p, scale):
            if k == 0:
                return 2.0 * kinetic_energy * scale * scale - nf * kT
            return p[k - 1] * p[k - 1] / q[k - 1] - kT

        def kick(k, p, scale, d):
            """Half a sub-step ``d/2`` of p_k, with the friction of p_{k+1} split around it."""
            if k == m - 1:
                return p.at[k].add(0.5 * d * force(k, p, scale))
            friction = jnp.exp(-0.25 * d * p[k + 1] / q[k + 1])
            pk = p[k] * friction
            pk = pk + 0.5 * d * force(k, p, scale)
            return p.at[k].set(pk * friction)

        for _ in range(self.n_inner):
            for w in SUZUKI_YOSHIDA[self.suzuki_yoshida]:
                d = w * time / self.n_inner
                for k in reversed(range(m)):
                    p = kick(k, p, scale, d)
                scale = scale * jnp.exp(-d * p[0] / q[0])
                xi = xi + d * p / q
                for k in range(m):
                    p = kick(k, p, scale, d)
        return ChainState(xi, p), scale

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        nf = degrees_of_freedom(self.dof, carry.positions)
        half = 0.5 * dt
        chain, s = self._chain(carry.extra, kinetic(carry.velocities, masses), nf, half)
        carry = velocity_verlet(model, carry, masses, params, dt, s * carry.velocities)
        chain, s = self._chain(chain, kinetic(carry.velocities, masses), nf, half)
        return carry._replace(velocities=s * carry.velocities, extra=chain)

    def thermostat(self, chain: ChainState, v, masses, nf: int, time, key=None):
        """The thermostat alone for ``time``: velocities scaled, the chain advanced (the
        half steps of :meth:`step`; used by :class:`Settle`)."""
        chain, s = self._chain(chain, kinetic(v, masses), nf, time)
        return s * v, chain

    def extended_energy(self, chain: ChainState, nf: int, dtype):
        """The chain's part of the conserved quantity."""
        q = self._masses(nf, dtype)
        kT = jnp.asarray(self.kT, dtype)
        xi, p = chain
        weights = jnp.full_like(xi, 1.0).at[0].set(nf)
        return jnp.sum(0.5 * p * p / q) + kT * jnp.sum(weights * xi)

    def observe(self, carry: Carry, masses) -> dict:
        nf = degrees_of_freedom(self.dof, carry.positions)
        extended = self.extended_energy(carry.extra, nf, carry.velocities.dtype)
        return dict(conserved=carry.potential_energy + kinetic(carry.velocities, masses)
                    + extended)


CHI_SQUARE_NORMALS = 256
"""Up to this many degrees of freedom :func:`chi_square` sums squared normals."""

_CANDIDATES = 12
"""Marsaglia-Tsang candidates drawn at once; for ``k > 256`` each is accepted with
probability above 0.99, so that none being accepted has probability below 1e-24."""


def chi_square(key, k: int, dtype) -> jax.Array:
    r"""A chi-square variate of ``k`` degrees of freedom, :math:`S = 2G`, :math:`G \sim
    \Gamma(k/2, 1)`.

    Up to :data:`CHI_SQUARE_NORMALS` degrees of freedom, the sum of ``k`` squared normals.
    Above, Marsaglia and Tsang's squeeze-free method (ACM TOMS 26, 363 (2000)): with
    :math:`d = a - 1/3`, :math:`c = 1/\sqrt{9d}`, :math:`x` standard normal,
    :math:`v = (1 + cx)^3` and :math:`u` uniform, :math:`G = dv` is accepted when
    :math:`\log u < x^2/2 + d(1 - v + \log v)`. The right side is written as
    :math:`3d \sum_{n \ge 4} (-1)^{n+1} y^n / n`, :math:`y = cx`, whose terms cancel
    exactly what the float32 form would lose (:math:`d` is ~5e4 for 10^5 atoms). Twelve
    candidates are drawn at once and the first accepted one is taken, a fixed cost with no
    loop (a gamma variate's rejection loop compiled 4x slower, docs/benchmarks.md); the
    last candidate stands in if none is accepted (probability below 1e-24). On 2 CPU cores
    this took 0.2 ms where 96,000 squared normals took 6 ms.
    """
    if k <= CHI_SQUARE_NORMALS:
        return jnp.sum(jax.random.normal(key, (k,), dtype) ** 2)
    key_x, key_u = jax.random.split(key)
    x = jax.random.normal(key_x, (_CANDIDATES,), dtype)
    u = jax.random.uniform(key_u, (_CANDIDATES,), dtype, minval=jnp.finfo(dtype).tiny)
    return _marsaglia_tsang(x, u, k)


def _marsaglia_tsang(x, u, k: int):
    """:func:`chi_square` above :data:`CHI_SQUARE_NORMALS` from its candidates: standard
    normals ``x`` and uniforms ``u`` in (0, 1), ``(_CANDIDATES,)`` each."""
    d = k / 2.0 - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    y = c * x
    series = jnp.zeros_like(y)                          # sum_{n=4}^{13} (-1)^(n+1) y^n / n
    for n in range(13, 3, -1):
        series = series * y + (-1.0) ** (n + 1) / n
    series = series * y ** 4
    inside = y > -1.0                                        # v > 0
    safe = jnp.where(inside, y, 0.0)
    direct = 3.0 * jnp.log1p(safe) - 3.0 * safe + 1.5 * safe * safe - safe ** 3
    log_accept = d * jnp.where(jnp.abs(y) < 0.1, 3.0 * series, direct)
    ok = inside & (jnp.log(u) < log_accept)
    first = jnp.where(jnp.any(ok), jnp.argmax(ok), _CANDIDATES - 1)
    return 2.0 * d * (1.0 + y[first]) ** 3


def bussi_kinetic(kinetic_energy, target, nf: int, c, key):
    r"""The kinetic energy after stochastic velocity rescaling over a time with
    :math:`c = e^{-t/\tau}` (Bussi, Donadio & Parrinello, J. Chem. Phys. 126, 014101 (2007),
    eq. A7): with :math:`R_1` standard normal and :math:`S` a chi-square variable of
    :math:`N_f - 1` degrees of freedom,

    .. math::
        K' = cK + (1 - c)\frac{\bar K}{N_f}(R_1^2 + S)
             + 2R_1\sqrt{c(1 - c)\frac{K\bar K}{N_f}}.

    ``target`` is :math:`\bar K = N_f kT / 2`. The exact solution of the kinetic energy's
    stochastic equation, so the canonical distribution holds for any ``c``. :math:`S` comes
    from :func:`chi_square`.
    """
    dtype = kinetic_energy.dtype
    key_r, key_s = jax.random.split(key)
    r1 = jax.random.normal(key_r, (), dtype)
    s = chi_square(key_s, nf - 1, dtype)
    return bussi_kinetic_from(kinetic_energy, target, nf, c, r1, s)


def bussi_draws(key: jax.Array, nf: int, count: int, extra: int,
                dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    r"""The random numbers of ``count`` :func:`bussi_kinetic` updates with ``nf`` degrees
    of freedom, and ``extra`` more standard normals, drawn at once: ``(normals, s)`` with
    ``normals`` ``(count + extra,)`` (the updates' :math:`R_1`, then the extra ones) and
    ``s`` ``(count,)`` chi-square variates of ``nf - 1`` degrees of freedom
    (:func:`chi_square`'s method). Above :data:`CHI_SQUARE_NORMALS` degrees of freedom it
    is two draws of random bits whatever ``count`` (one of normals, one of uniforms), where
    separate calls of :func:`bussi_kinetic` make six per update: on the CPU each draw is
    several small XLA kernels, and a constant-pressure step with two thermostat half-steps
    spent half its kernels on them."""
    k = nf - 1
    if k <= CHI_SQUARE_NORMALS:
        key_n, key_s = jax.random.split(key)
        s = jax.vmap(lambda kk: chi_square(kk, k, dtype))(jax.random.split(key_s, count))
        return jax.random.normal(key_n, (count + extra,), dtype), s
    key_n, key_u = jax.random.split(key)
    normals = jax.random.normal(key_n, (count * (1 + _CANDIDATES) + extra,), dtype)
    u = jax.random.uniform(key_u, (count, _CANDIDATES), dtype, minval=jnp.finfo(dtype).tiny)
    x = normals[count + extra:].reshape(count, _CANDIDATES)
    s = jnp.stack([_marsaglia_tsang(x[i], u[i], k) for i in range(count)])
    return normals[:count + extra], s


def bussi_kinetic_from(kinetic_energy: jax.Array, target: jax.Array, nf: int, c: jax.Array,
                       r1: jax.Array, s: jax.Array) -> jax.Array:
    r""":func:`bussi_kinetic` with its draws given (from :func:`bussi_draws`): ``r1``
    standard normal, ``s`` chi-square with ``nf - 1`` degrees of freedom."""
    return (kinetic_energy + (1.0 - c) * (target * (s + r1 * r1) / nf - kinetic_energy)
            + 2.0 * r1 * jnp.sqrt(kinetic_energy * target / nf * (1.0 - c) * c))


@jax.tree_util.register_pytree_node_class
class Bussi(Integrator):
    r"""Stochastic velocity rescaling (canonical sampling through velocity rescaling, NVT).

    Bussi, Donadio & Parrinello, J. Chem. Phys. 126, 014101 (2007). All velocities are
    scaled by one factor :math:`\alpha = \sqrt{K'/K}` drawn so that the kinetic energy
    follows

    .. math::
        dK = (\bar K - K)\frac{dt}{\tau} + 2\sqrt{\frac{K\bar K}{N_f\tau}}\,dW,
        \qquad \bar K = \tfrac12 N_f kT,

    exactly (:func:`bussi_kinetic`), for half a step on each side of velocity Verlet.
    The canonical distribution holds for any ``tau``; large ``tau`` perturbs the dynamics
    least, ``tau -> 0`` is velocity resampling of the kinetic energy. The effective energy
    :math:`\tilde H = K + U + \sum (K_{before} - K_{after})` (the total energy plus the heat
    the thermostat took out) is conserved up to the Verlet error,
    :attr:`Trajectory.conserved`. Needs an explicit ``key``.

    Args:
        kT: Temperature; an array leaf.
        tau: The thermostat's relaxation time.
        dof: Degrees of freedom :math:`N_f`; ``d (n - 1)`` by default.
    """

    stochastic = True

    def __init__(self, kT: float, tau: float, dof: int | None = None) -> None:
        self.kT, self.tau = kT, tau
        self.dof = None if dof is None else int(dof)

    def tree_flatten(self):
        return (self.kT, self.tau), self.dof

    @classmethod
    def tree_unflatten(cls, dof, children):
        return cls(*children, dof)

    def __repr__(self):
        return f"Bussi(kT={self.kT!r}, tau={self.tau!r})"

    def init(self, model, carry: Carry, masses, params):
        return jnp.zeros((), carry.velocities.dtype)       # the heat taken out so far

    def _rescale(self, v, masses, nf, time, key, heat):
        dtype = v.dtype
        k = kinetic(v, masses)
        c = jnp.exp(-time / jnp.asarray(self.tau, dtype))
        target = 0.5 * nf * jnp.asarray(self.kT, dtype)
        new = bussi_kinetic(k, target, nf, c, key)
        alpha = jnp.sqrt(new / k)
        return alpha * v, heat + k - new

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        nf = degrees_of_freedom(self.dof, carry.positions)
        k1, k2 = jax.random.split(jax.random.fold_in(key, carry.step))
        half = 0.5 * dt
        v, heat = self._rescale(carry.velocities, masses, nf, half, k1, carry.extra)
        carry = velocity_verlet(model, carry, masses, params, dt, v)
        v, heat = self._rescale(carry.velocities, masses, nf, half, k2, heat)
        return carry._replace(velocities=v, extra=heat)

    def thermostat(self, heat, v, masses, nf: int, time, key):
        """The thermostat alone for ``time``: velocities rescaled, the heat updated (the
        half steps of :meth:`step`; used by :class:`Settle`)."""
        return self._rescale(v, masses, nf, time, key, heat)

    def extended_energy(self, heat, nf: int, dtype):
        """The heat taken out so far, the thermostat's part of the conserved quantity."""
        return heat

    def observe(self, carry: Carry, masses) -> dict:
        return dict(conserved=carry.potential_energy + kinetic(carry.velocities, masses)
                    + carry.extra)
