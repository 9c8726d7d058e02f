r"""Particle state and integrators: velocity Verlet (NVE) and BAOAB Langevin dynamics.

Both are the splittings of the ODE core's symplectic family specialised to particles: the
force at the new positions is kept in the carry and reused as the first half-kick of the
next step (one force evaluation per step), and the neighbour list is updated between the
drift and the force.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from .._solver._base import register_static

if TYPE_CHECKING:
    from ._model import Model


class State(NamedTuple):
    """Positions ``(n, d)``, velocities ``(n, d)`` and masses ``(n,)`` (or a scalar)."""

    positions: jax.Array
    velocities: jax.Array
    masses: jax.Array


class Carry(NamedTuple):
    """What the step loop carries from one step to the next (jax-md's simulation state).

    Made by :meth:`Integrator.start` and advanced by :meth:`Integrator.step`.

    Attributes:
        positions: ``(n, d)``, wrapped into a periodic box.
        velocities: ``(n, d)``.
        forces: ``(n, d)`` at ``positions`` (the next step's first half-kick reuses them).
        potential_energy: The energy at ``positions``.
        neighbors: The neighbour list, updated at ``positions`` (``None`` without one).
        step: The steps taken, an int32 from 0 (stochastic integrators draw step ``k``'s
            noise from ``fold_in(key, k)``).
        extra: The integrator's own state (a thermostat's, a barostat's box); ``None``
            for :class:`NVE`.
    """

    positions: jax.Array
    velocities: jax.Array
    forces: jax.Array
    potential_energy: jax.Array
    neighbors: object
    step: jax.Array
    extra: object = None     # the integrator's own state (thermostat, box); None for NVE


def kinetic(v, masses):
    """:math:`K = \\tfrac12 \\sum_i m_i |v_i|^2`."""
    m = jnp.asarray(masses, v.dtype)
    m = m[:, None] if m.ndim == 1 else m
    return 0.5 * jnp.sum(m * v * v)


def inverse_mass(masses: jax.Array, like: jax.Array) -> jax.Array:
    """:math:`1/m` in ``like``'s dtype, shaped to broadcast against ``(n, d)`` velocities."""
    m = jnp.asarray(masses, like.dtype)
    return (1.0 / m)[:, None] if m.ndim == 1 else 1.0 / m


def velocity_verlet(model, carry: Carry, masses, params, dt, v: jax.Array) -> Carry:
    """One velocity Verlet step from velocities ``v`` (the forces in ``carry`` are at its
    positions): half kick, drift, forces at the new positions, half kick."""
    inv_m = inverse_mass(masses, v)
    v = v + (0.5 * dt) * carry.forces * inv_m
    x = model.space.shift(carry.positions, dt * v)
    nbrs = carry.neighbors.update(x) if carry.neighbors is not None else None
    e, f = model.energy_and_forces(x, params, nbrs)
    v = v + (0.5 * dt) * f * inv_m
    return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                          neighbors=nbrs, step=carry.step + 1)


class Integrator:
    """A particle integrator: ``start(model, state, params, neighbors) -> carry`` once, then
    ``step(model, carry, masses, params, dt, key) -> carry`` once per step.

    The pair plays the part of jax-md's ``(init_fn, apply_fn)``: :func:`simulate` is a loop
    over it, and a loop of one's own (``lax.scan``, ``fori_loop``) can drive it the same way
    (docs/particles.md, "Your own loop"). The model (:class:`Model`), the parameters,
    ``dt`` and the key are arguments rather than closed over, so they stay pytree leaves:
    differentiable, and new values do not recompile.

    Subclasses provide ``step``, called once per step inside :func:`simulate`'s scan:
    ``model.space.shift(x, dx)`` moves positions and ``model.energy_and_forces(x, params,
    neighbors)`` evaluates the energy; ``carry`` holds ``positions``, ``velocities`` and the
    ``forces`` and ``potential_energy`` at them, ``neighbors`` and ``step``. Return
    ``carry._replace(...)`` with forces and energy at the new positions, the neighbour list
    updated (``neighbors.update(x)`` when not ``None``) and ``step + 1``. A subclass must be
    a pytree (it is an argument of a compiled function; array attributes such as ``kT`` as
    leaves) and sets ``stochastic = True`` if it needs ``key``. See docs/extending.md.
    """

    stochastic = False
    time_symmetric = False  # a step undone by the step with -dt (adjoint=Reversible())

    def start(self, model: Model, state: State, params: Any, neighbors: Any = None) -> Carry:
        """The carry at the start of a run: the positions wrapped into ``model.space``, the
        neighbour list updated at them (``neighbors.update``), the energy and forces there
        (one evaluation), step 0 and the integrator's own state (:meth:`init`) in
        ``extra``. ``neighbors`` is a list allocated beforehand (:func:`neighbor_list`) or
        ``None``; ``state`` is a :class:`State`."""
        x = model.space.wrap(jnp.asarray(state.positions))
        nbrs = neighbors.update(x) if neighbors is not None else None
        e, f = model.energy_and_forces(x, params, nbrs)
        step = jnp.zeros((), jnp.int32)
        carry = Carry(x, jnp.asarray(state.velocities, x.dtype), f, e, nbrs, step)
        return carry._replace(extra=self.init(model, carry, state.masses, params))

    def step(self, model: Model, carry: Carry, masses: jax.Array, params: Any, dt: jax.Array,
             key: jax.Array) -> Carry:
        """One step of size ``dt`` from ``carry``: the new positions and velocities, the
        forces and energy at the new positions, the list updated there, ``step + 1``
        (every subclass defines it)."""
        raise NotImplementedError(f"{type(self).__name__} must define step(model, carry, "
                                  f"masses, params, dt, key)")

    def init(self, model, carry: Carry, masses, params):
        """The integrator's own state at the start (``carry.extra``); ``None`` by default."""
        return None

    def observe(self, carry: Carry, masses) -> dict:
        """Per-frame records of the integrator: ``conserved`` (here the total energy
        :math:`K + U`, which only :class:`NVE` conserves) and whatever else it adds."""
        return dict(conserved=carry.potential_energy + kinetic(carry.velocities, masses))

    def check(self, carry: Carry) -> jax.Array:
        """A :class:`~simlib.Result` code for the integrator's own state (0: healthy)."""
        return jnp.int32(0)


@register_static
@dataclass(frozen=True)
class NVE(Integrator):
    r"""Velocity Verlet, the microcanonical ensemble (constant N, V, E).

    :math:`v_{1/2} = v + \tfrac{h}{2} F(x)/m`, :math:`x' = x + h v_{1/2}`,
    :math:`v' = v_{1/2} + \tfrac{h}{2} F(x')/m`. Second order, symplectic and
    time-reversible. Swope, Andersen, Berens & Wilson, J. Chem. Phys. 76, 637 (1982).
    """

    time_symmetric = True

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        return velocity_verlet(model, carry, masses, params, dt, carry.velocities)


@jax.tree_util.register_pytree_node_class
class Langevin(Integrator):
    r"""Langevin dynamics at temperature ``kT`` with friction ``gamma``, BAOAB splitting.

    :math:`dv = F/m\,dt - \gamma v\,dt + \sqrt{2\gamma kT/m}\,dW`, integrated as a half kick
    (B), a half drift (A), the exact Ornstein-Uhlenbeck step
    :math:`v \leftarrow c v + \sqrt{(1 - c^2) kT/m}\,\xi` with :math:`c = e^{-\gamma h}` (O),
    a half drift and a half kick. Configurational averages are exact to second order in the
    step. Leimkuhler & Matthews, Appl. Math. Res. Express 2013, 34 (2013).

    ``kT`` and ``gamma`` are array leaves: ``jax.grad`` sees them and new values do not
    recompile. Needs an explicit ``key`` in :func:`simulate`.
    """

    stochastic = True

    def __init__(self, kT: float, gamma: float) -> None:
        self.kT = kT
        self.gamma = gamma

    def tree_flatten(self):
        return (self.kT, self.gamma), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)

    def __repr__(self):
        return f"Langevin(kT={self.kT!r}, gamma={self.gamma!r})"

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        v0 = carry.velocities
        inv_m = inverse_mass(masses, v0)
        half = 0.5 * dt
        v = v0 + half * carry.forces * inv_m
        x = model.space.shift(carry.positions, half * v)
        c = jnp.exp(-jnp.asarray(self.gamma, v0.dtype) * dt)
        noise = jax.random.normal(jax.random.fold_in(key, carry.step), v0.shape, v0.dtype)
        v = c * v + jnp.sqrt((1.0 - c * c) * jnp.asarray(self.kT, v0.dtype) * inv_m) * noise
        x = model.space.shift(x, half * v)
        nbrs = carry.neighbors.update(x) if carry.neighbors is not None else None
        e, f = model.energy_and_forces(x, params, nbrs)
        v = v + half * f * inv_m
        return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                              neighbors=nbrs, step=carry.step + 1)
