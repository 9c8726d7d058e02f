"""A loop of one's own over simulate's parts (issue 25): ``Model``, ``Integrator.start``
and ``Integrator.step``, the neighbour list's ``update``/``overflow`` and ``reallocate``,
driven by ``lax.scan``/``fori_loop``. It reproduces ``simulate`` bit for bit (the parts
are the ones simulate drives), and conserves energy as velocity Verlet must (its error
goes as dt^2), with the potential energy of a pair sum written here in numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from simlib import particles as sp

LJ = dict(sigma=1.0, epsilon=1.0)


@pytest.fixture(scope="module")
def lj():
    """108 particles from an fcc lattice at density 0.8 and kT = 1.2, LJ cut at 2.2 and
    shifted, a neighbour list with skin 0.3 (the system of test_particle_dynamics)."""
    x, box = sp.lattice(3, 0.8)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, 2.2, shift=True)
    v = sp.maxwell_boltzmann(1.0, 1.2, key=jax.random.key(0), n=len(x))
    return dict(x=x, v=v, box=box, space=space, energy=energy)


@jax.jit
def run(integrator, model, carry, masses, params, dt, key, n_frames, save_every):
    """``n_frames`` frames of ``save_every`` steps: ``fori_loop`` over steps inside
    ``lax.scan`` over frames. Everything the steps read is an argument (not closed over:
    XLA would fold constants and round differently from simulate in the last bit)."""

    def frame(carry, _):
        carry = lax.fori_loop(
            0, save_every, lambda i, c: integrator.step(model, c, masses, params, dt, key),
            carry)
        return carry, (carry.positions, carry.velocities, carry.potential_energy)

    return lax.scan(frame, carry, None, length=n_frames)


run = jax.jit(run.__wrapped__, static_argnums=(7,))   # n_frames: a scan length


def start(integrator, model, state, params, nbrs):
    """The first carry, with the list reallocated until it holds the start (eager)."""
    carry = integrator.start(model, state, params, nbrs)
    while nbrs is not None and carry.neighbors.did_overflow():
        nbrs = sp.reallocate(carry.neighbors, carry.positions)
        carry = integrator.start(model, state, params, nbrs)
    return carry


@pytest.fixture(scope="module")
def cluster():
    """32 particles of an fcc lattice at density 0.8 in free space, all pairs, no cutoff."""
    x, _ = sp.lattice(2, 0.8)
    v = sp.maxwell_boltzmann(1.0, 0.5, key=jax.random.key(1), n=len(x))
    space = sp.free()
    return dict(x=x, v=v, box=None, space=space,
                energy=sp.pair_energy(sp.lennard_jones, space))


@pytest.mark.parametrize("system, name, capacity", [
    ("cluster", "nve", None),
    pytest.param("lj", "nve", None, marks=pytest.mark.slow),
    # capacity 8: too small at the start, so both reallocate the list before the first step
    pytest.param("lj", "langevin", 8, marks=pytest.mark.slow)])
def test_own_loop_reproduces_simulate_bit_for_bit(request, system, name, capacity):
    s = request.getfixturevalue(system)
    integrator = sp.NVE() if name == "nve" else sp.Langevin(kT=1.0, gamma=1.0)
    key = jax.random.key(3)
    nbrs = None if system == "cluster" else sp.neighbor_list(s["space"], s["x"], 2.2, 0.3,
                                                             capacity=capacity)
    state = sp.State(s["x"], s["v"], 1.0)
    traj = sp.simulate(s["energy"], state, LJ, space=s["space"], dt=0.005, n_steps=60,
                       save_every=20, neighbors=nbrs, integrator=integrator, key=key)
    assert int(traj.stats["n_reallocations"]) == (capacity is not None)

    model = sp.Model(s["energy"], s["space"])
    carry = start(integrator, model, state, LJ, nbrs)
    assert np.array_equal(carry.positions, traj.positions[0])
    masses, dt = jnp.asarray(1.0), jnp.asarray(0.005)
    carry, (x, v, e) = run(integrator, model, carry, masses, LJ, dt, key, 3, 20)
    assert np.array_equal(x, traj.positions[1:])
    assert np.array_equal(v, traj.velocities[1:])
    assert np.array_equal(e, traj.potential_energy[1:])
    assert np.array_equal(carry.positions, traj.final.positions)
    assert int(carry.step) == int(traj.stats["n_steps"]) == 60
    if nbrs is not None:
        assert not carry.neighbors.did_overflow()
        assert int(carry.neighbors.n_builds) == int(traj.neighbors.n_builds)
    # and the energy carried is a numpy pair sum's at the positions carried
    r_cut = np.inf if s["box"] is None else 2.2
    assert float(e[-1]) == pytest.approx(numpy_energy(np.asarray(x[-1]), s["box"], r_cut),
                                         rel=1e-12)


def numpy_energy(x, box, r_cut=2.2):
    """The LJ energy of ``x`` (shifted at a finite ``r_cut``) by a numpy pair sum, over
    minimum images in a periodic ``box`` (``None``: free space)."""
    d = x[:, None] - x[None]
    if box is not None:
        d -= box * np.round(d / box)
    r = np.linalg.norm(d, axis=-1)
    np.fill_diagonal(r, np.inf)
    u = 4 * (r**-12 - r**-6)
    if np.isfinite(r_cut):
        u = np.where(r < r_cut, u - 4 * (r_cut**-12 - r_cut**-6), 0.0)
    return 0.5 * u.sum()


@pytest.mark.slow
def test_own_loop_conserves_energy_as_velocity_verlet(lj):
    """NVE by hand over 1 time unit at dt and dt/2: the total energy stays within 1e-3 of
    its start, and its fluctuation shrinks four-fold (second order); the potential energy
    the loop carries is numpy's pair sum at the positions it carries."""
    model = sp.Model(lj["energy"], lj["space"])
    nve = sp.NVE()
    nbrs = sp.neighbor_list(lj["space"], lj["x"], 2.2, 0.3)
    carry0 = start(nve, model, sp.State(lj["x"], lj["v"], 1.0), LJ, nbrs)
    masses, key = jnp.asarray(1.0), jax.random.key(0)
    spread = {}
    for dt, every in ((0.005, 4), (0.0025, 8)):
        carry, (x, v, e) = run(nve, model, carry0, masses, LJ, jnp.asarray(dt), key, 50, every)
        assert not carry.neighbors.did_overflow()
        total = np.asarray(e) + 0.5 * np.sum(np.asarray(v) ** 2, axis=(1, 2))
        e0 = float(carry0.potential_energy) + 0.5 * float(np.sum(np.asarray(lj["v"]) ** 2))
        assert np.abs(total - e0).max() < 1e-3 * abs(e0)
        spread[dt] = np.std(total)
        assert float(e[-1]) == pytest.approx(numpy_energy(np.asarray(x[-1]), lj["box"]),
                                             rel=1e-12)
    assert spread[0.005] / spread[0.0025] == pytest.approx(4.0, rel=0.2)
