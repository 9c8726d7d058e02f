r"""A box of SPC/E water: rigid three-site molecules on a lattice, and their energy.

SPC/E (Berendsen, Grigera & Straatsma, J. Phys. Chem. 91, 6269 (1987)): O-H 0.1 nm, H-O-H
109.47°, charges -0.8476 e (O) and +0.4238 e (H), Lennard-Jones between oxygens only,
:math:`\sigma` = 0.3166 nm and :math:`\epsilon` = 0.650 kJ/mol. Units are those of
GROMACS and OpenMM: nm, ps, amu (g/mol), kJ/mol, e.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from ._electrostatics import pme
from ._energy import Energy, PairEnergy, SumEnergy, pair_energy
from ._potentials import lennard_jones
from ._space import periodic

#: The Coulomb constant :math:`1/4\pi\epsilon_0` in kJ mol⁻¹ nm e⁻² (OpenMM's ONE_4PI_EPS0).
COULOMB_KJ_NM = 138.935457644382
#: Boltzmann's constant in kJ mol⁻¹ K⁻¹ (CODATA 2018 times Avogadro's number).
BOLTZMANN_KJ = 0.00831446261815324
AVOGADRO = 6.02214076e23

SPCE = dict(d_oh=0.1, angle=109.47, q_o=-0.8476, q_h=0.4238, sigma=0.3166, epsilon=0.650,
            m_o=15.9994, m_h=1.008)


class Water(NamedTuple):
    r"""A water box: ``positions (3w, 3)`` in nm (O, H, H of each molecule in turn), the
    cubic ``box`` side (nm), ``masses``, ``charges``, ``sigma`` and ``epsilon`` per atom
    (Lennard-Jones on the oxygens only: zero ``epsilon`` on the hydrogens, so that every
    O-H and H-H pair drops out of the Lorentz-Berthelot mixed sum), ``molecules (w, 3)``,
    the intramolecular ``exclusions (3w, 2)`` for the Coulomb sum, and the rigid geometry
    ``d_oh``, ``d_hh`` (nm)."""

    positions: jax.Array
    box: float
    masses: jax.Array
    charges: jax.Array
    sigma: jax.Array
    epsilon: jax.Array
    molecules: np.ndarray
    exclusions: np.ndarray
    d_oh: float
    d_hh: float

    @property
    def params(self) -> dict:
        """The parameters of :func:`spce_energy`'s energy."""
        return dict(sigma=self.sigma, epsilon=self.epsilon, charges=self.charges)

    @property
    def density(self) -> float:
        """The mass density in g/cm³."""
        grams = float(jnp.sum(self.masses)) / AVOGADRO
        return grams / (self.box * 1e-7) ** 3


def _rotations(n: int, key) -> np.ndarray:
    """``n`` rotation matrices: uniformly random from ``key``, or all the identity."""
    if key is None:
        return np.broadcast_to(np.eye(3), (n, 3, 3))
    q = np.array(jax.random.normal(key, (n, 4)), float)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
    ], 1)


# One orientation for every molecule on the simple cubic lattice: the dipole along
# (1, 2, 3)/|.|, the H-H vector perpendicular to it. The nearest intermolecular pair is
# then 0.19 nm (an H and its neighbour's O), none closer.
_DIPOLE = np.array([1.0, 2.0, 3.0]) / math.sqrt(14.0)
_ACROSS = np.cross(_DIPOLE, [1.0, 0.0, 0.0])
_ACROSS /= np.linalg.norm(_ACROSS)
# densities spce_water accepts (g/cm³): liquid water, well beyond its range in pressure and
# temperature; outside it the lattice packs molecules into each other or leaves a gas
_DENSITY_RANGE = (0.5, 1.5)


def spce_water(n_molecules: int, *, density: float = 0.997, key: jax.Array | None = None,
               dtype: DTypeLike | None = None) -> Water:
    r"""``n_molecules`` SPC/E molecules on a simple cubic lattice at ``density`` (g/cm³).

    The oxygens sit on the first ``n_molecules`` sites of an :math:`m^3` lattice,
    :math:`m = \lceil w^{1/3} \rceil`, in a cubic box of side
    :math:`L = (w M_{H_2O} / \rho N_A)^{1/3}`. All molecules share one orientation (no
    intermolecular pair closer than 0.19 nm at the default density), or, with ``key``,
    each gets a uniformly random one (then pairs may come closer: relax before a run).
    Velocities are not set: draw them with :func:`maxwell_boltzmann` and project them
    with :meth:`Settle.constrain_velocities`. ``density`` must lie in 0.5 to 1.5 g/cm³
    (liquid water; ``ValueError`` otherwise).

    Example:
        >>> from simlib import particles as sp
        >>> water = sp.spce_water(216)
        >>> water.positions.shape, round(water.box, 4), round(water.density, 6)
        ((648, 3), 1.8644, 0.997)
    """
    w = int(n_molecules)
    if w < 1:
        raise ValueError(f"spce_water: n_molecules must be positive, got {n_molecules!r}")
    low, high = _DENSITY_RANGE
    if not low <= density <= high:
        raise ValueError(f"spce_water: density must be {low} to {high} g/cm³ (liquid water; "
                         f"0.997 at 25 °C), got {density!r}")
    p = SPCE
    m_water = p["m_o"] + 2 * p["m_h"]
    box = (w * m_water / AVOGADRO / density) ** (1.0 / 3.0) * 1e7          # cm -> nm
    m = math.ceil(round(w ** (1.0 / 3.0), 9))
    sites = np.stack(np.meshgrid(*[np.arange(m)] * 3, indexing="ij"), -1).reshape(-1, 3)[:w]
    oxygens = (sites + 0.5) * (box / m)
    half = math.radians(p["angle"]) / 2
    d_oh = p["d_oh"]
    d_hh = 2 * d_oh * math.sin(half)
    local = np.stack([np.zeros(3),
                      d_oh * (math.cos(half) * _DIPOLE + math.sin(half) * _ACROSS),
                      d_oh * (math.cos(half) * _DIPOLE - math.sin(half) * _ACROSS)])
    offsets = np.einsum("wij,aj->wai", _rotations(w, key), local)            # (w, 3, 3)
    x = (oxygens[:, None, :] + offsets).reshape(-1, 3) % box
    dtype = dtype or jnp.result_type(float)
    per = lambda o, h: jnp.asarray(np.tile([o, h, h], w), dtype)            # noqa: E731
    molecules = np.arange(3 * w).reshape(w, 3)
    exclusions = np.concatenate([molecules[:, [0, 1]], molecules[:, [0, 2]],
                                 molecules[:, [1, 2]]])
    return Water(jnp.asarray(x, dtype), float(box), per(p["m_o"], p["m_h"]),
                 per(p["q_o"], p["q_h"]), per(p["sigma"], 0.0), per(p["epsilon"], 0.0),
                 molecules, exclusions, d_oh, d_hh)


@jax.tree_util.register_pytree_node_class
class _DispersionTail(Energy):
    r"""The Lennard-Jones energy and virial beyond ``cutoff`` with :math:`g(r) = 1` there,
    for per-atom ``sigma``, ``epsilon`` mixed by Lorentz-Berthelot:
    :math:`U = rac{8\pi}{3V}\sum_{i,j}\epsilon_{ij}\sigma_{ij}^3[rac13 s_{ij}^9 - s_{ij}^3]`,
    :math:`W = rac{16\pi}{V}\sum_{i,j}\epsilon_{ij}\sigma_{ij}^3[rac23 s_{ij}^9
    - s_{ij}^3]`, :math:`s_{ij} = \sigma_{ij}/r_c` (Allen & Tildesley 2017, §2.8); no force."""

    r_cut = None

    def __init__(self, space, cutoff: float) -> None:
        self.space, self.cutoff = space, float(cutoff)

    def tree_flatten(self):
        return (self.space,), self.cutoff

    @classmethod
    def tree_unflatten(cls, cutoff, children):
        return cls(children[0], cutoff)

    def _sums(self, positions, params):
        sigma = jnp.broadcast_to(jnp.asarray(params["sigma"], positions.dtype),
                                 positions.shape[:1])
        eps = jnp.broadcast_to(jnp.asarray(params["epsilon"], positions.dtype),
                               positions.shape[:1])
        s_ij = 0.5 * (sigma[:, None] + sigma[None, :])
        es3 = jnp.sqrt(eps[:, None] * eps[None, :]) * s_ij**3
        s3 = (s_ij / self.cutoff) ** 3
        volume = self.space.volume(3)
        return es3, s3, volume

    def __call__(self, positions, params, neighbors=None):
        es3, s3, volume = self._sums(positions, params)
        return 8.0 * jnp.pi / (3.0 * volume) * jnp.sum(es3 * (s3**3 / 3.0 - s3))

    def energy_and_forces(self, positions, params, neighbors=None):
        return self(positions, params), jnp.zeros_like(positions)

    def virial(self, positions, params, neighbors=None):
        es3, s3, volume = self._sums(positions, params)
        return 16.0 * jnp.pi / volume * jnp.sum(es3 * (2.0 * s3**3 / 3.0 - s3))

    def virial_tensor(self, positions, params, neighbors=None):
        return self.virial(positions, params) / 3.0 * jnp.eye(3, dtype=positions.dtype)


@jax.tree_util.register_pytree_node_class
class _WaterEnergy(SumEnergy):
    """``lj + coulomb (+ tail)`` whose forces take the Lennard-Jones and real-space Coulomb
    pairs in one native pass where it serves (the same sum as the terms apart). As a pytree
    the Lennard-Jones term shares the Coulomb term's space (one box leaf), so that under
    ``jit`` both see the same box and the fused pass applies."""

    def tree_flatten(self):
        lj, coulomb, *rest = self.terms
        return (coulomb, tuple(rest)), lj.tree_flatten()[1]

    @classmethod
    def tree_unflatten(cls, static, children):
        coulomb, rest = children
        return cls((PairEnergy.tree_unflatten(static, (coulomb.space,)), coulomb, *rest))

    def energy_and_forces(self, positions, params, neighbors=None):
        lj, coulomb, *rest = self.terms
        fused = coulomb._with_lj_energy_and_forces(lj, positions, params, neighbors)
        if fused is None:
            return super().energy_and_forces(positions, params, neighbors)
        e, f = fused
        for term in rest:
            e_t, f_t = term.energy_and_forces(positions, params, neighbors)
            e, f = e + e_t, f + f_t
        return e, f


def spce_energy(water: Water, r_cut: float, *, tolerance: float = 1e-6,
                alpha: float | None = None, grid: tuple[int, int, int] | int | None = None,
                order: int = 5, shift: bool = False,
                tail_correction: bool = False) -> Energy:
    r"""The SPC/E energy of ``water``: oxygen-oxygen Lennard-Jones truncated at ``r_cut``
    (plain truncation, as OpenMM's ``NonbondedForce`` without a switch or dispersion
    correction) plus smooth PME (:func:`pme`) with the intramolecular pairs excluded, in
    kJ/mol. Call it as ``energy(positions, water.params, neighbors=None)``. ``shift``
    shifts the Lennard-Jones term to zero at the cutoff (for NVE energy conservation: a
    plain truncation jumps by :math:`u(r_c)` when a pair crosses it); ``tolerance``,
    ``alpha``, ``grid`` and ``order`` are :func:`pme`'s. ``tail_correction=True`` adds
    the Lennard-Jones energy and virial beyond ``r_cut`` (uniform density there; no force),
    as published SPC/E densities include it (GROMACS's ``DispCorr = EnerPres``).
    """
    space = periodic(water.box)
    lj = pair_energy(lennard_jones, space, r_cut, shift=shift)
    coulomb = pme(space, r_cut, tolerance=tolerance, alpha=alpha, grid=grid, order=order,
                  exclusions=water.exclusions, coulomb_constant=COULOMB_KJ_NM)
    if tail_correction:
        return _WaterEnergy((lj, coulomb, _DispersionTail(space, r_cut)))
    return _WaterEnergy((lj, coulomb))
