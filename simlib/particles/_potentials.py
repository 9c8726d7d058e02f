"""Pair potentials ``u(r, params)``: pure functions of the distance.

Each potential reads its parameters from ``params`` by name. Inside
:func:`~simlib.particles.pair_energy` the values it sees are already combined for the pair
(see :mod:`._mixing`), so one function serves equal and mixed particles alike. Any user
function with the same signature works the same way, as long as it acts elementwise on
``r``. Cutoffs and the energy shift at the cutoff are applied by ``pair_energy``.

A potential whose pair sum does not converge under the minimum-image convention (a
``1/r`` tail: Coulomb, gravity) carries the attribute ``long_range = True``;
``pair_energy`` refuses it in a periodic box. Give a user potential the same attribute to
get the same check (``functools.wraps`` copies it to a wrapper).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def lennard_jones(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Lennard-Jones 12-6: :math:`u = 4\epsilon[(\sigma/r)^{12} - (\sigma/r)^6]`.

    Params: ``sigma``, ``epsilon`` (scalars, per-particle arrays mixed by Lorentz-Berthelot,
    or ``(S, S)`` tables indexed by ``species``). Truncate with ``pair_energy(r_cut=...)``
    and shift to zero there with ``shift=True``. Lennard-Jones, Proc. R. Soc. A 106, 463 (1924).
    """
    s6 = (params["sigma"] / r) ** 6
    return 4.0 * params["epsilon"] * (s6 * s6 - s6)


def wca(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Weeks-Chandler-Andersen: Lennard-Jones cut at its minimum :math:`2^{1/6}\sigma` and
    shifted up by :math:`\epsilon`, so it is purely repulsive and goes to zero smoothly.

    Params: ``sigma``, ``epsilon``. Weeks, Chandler & Andersen, J. Chem. Phys. 54, 5237 (1971).
    """
    sigma, epsilon = params["sigma"], params["epsilon"]
    inside = r < 2.0 ** (1.0 / 6.0) * sigma
    r_safe = jnp.where(inside, r, 2.0 * sigma)
    s6 = (sigma / r_safe) ** 6
    return jnp.where(inside, 4.0 * epsilon * (s6 * s6 - s6) + epsilon, 0.0)


def morse(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Morse: :math:`u = D[(1 - e^{-\alpha(r - r_0)})^2 - 1]`, zero at infinity, ``-D`` at ``r0``.

    Params: ``D`` (well depth), ``alpha`` (inverse width), ``r0`` (bond length).
    Morse, Phys. Rev. 34, 57 (1929).
    """
    x = 1.0 - jnp.exp(-params["alpha"] * (r - params["r0"]))
    return params["D"] * (x * x - 1.0)


def harmonic(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Harmonic spring: :math:`u = \tfrac12 k (r - r_0)^2`.

    Params: ``k`` (stiffness), ``r0`` (rest length); scalars, or one value per bond when used
    with :func:`~simlib.particles.bond_energy`.
    """
    return 0.5 * params["k"] * (r - params["r0"]) ** 2


def gravity(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Newtonian gravity with Plummer softening: :math:`u = -G m_i m_j / \sqrt{r^2 + \epsilon^2}`.

    Params: ``G``, ``softening`` (:math:`\epsilon`, may be 0 for point masses that never
    meet) and ``masses`` (per particle; the pair sees :math:`m_i m_j`). Plummer, MNRAS 71,
    460 (1911); Aarseth, *Gravitational N-Body Simulations* (2003), §2.
    """
    return -params["G"] * params["masses"] / jnp.sqrt(r * r + params["softening"] ** 2)


gravity.long_range = True


def coulomb(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Coulomb in free space: :math:`u = k q_i q_j / r`.

    Params: ``charges`` (per particle; the pair sees :math:`q_i q_j`) and optionally
    ``k`` (Coulomb's constant, 1 by default, i.e. Gaussian reduced units). Not for periodic
    boxes: the minimum image of a 1/r potential is not a converged lattice sum (use Ewald).
    """
    k = params["k"] if "k" in params else 1.0
    return k * params["charges"] / r


coulomb.long_range = True


def is_long_range(potential) -> bool:
    """Whether ``potential`` (or the function a ``functools.partial`` wraps) is marked
    ``long_range``: its minimum-image pair sum in a periodic box does not converge."""
    while potential is not None:
        if getattr(potential, "long_range", False):
            return True
        potential = getattr(potential, "func", None) or getattr(potential, "__wrapped__", None)
    return False


def born_mayer_huggins(r: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Born-Mayer-Huggins (the Tosi-Fumi form for alkali halides):
    :math:`u = A\,e^{(\sigma - r)/\rho} - C/r^6 - D/r^8`.

    An exponential (Born-Mayer) overlap repulsion of strength ``A`` and range ``rho``
    centred on the sum of the ionic radii ``sigma``, and the dipole-dipole (``C``) and
    dipole-quadrupole (``D``) dispersion attractions. Add the Coulomb energy of the ions
    separately (:func:`~simlib.particles.pme` or :func:`~simlib.particles.ewald` in a
    periodic box). Params: ``A``, ``rho``, ``sigma``, ``C``, ``D``: scalars or ``(S, S)``
    tables indexed by ``params["species"]`` (the usual case: one value per pair of ion
    species); :func:`tosi_fumi_nacl` gives NaCl's. Huggins & Mayer, J. Chem. Phys. 1, 643
    (1933); Tosi & Fumi, J. Phys. Chem. Solids 25, 45 (1964).
    """
    r2 = r * r
    r6 = r2 * r2 * r2
    return (params["A"] * jnp.exp((params["sigma"] - r) / params["rho"])
            - params["C"] / r6 - params["D"] / (r6 * r2))


def tosi_fumi_nacl(dtype: jnp.dtype | None = None) -> dict[str, jax.Array | float]:
    r"""The Tosi-Fumi parameters of :func:`born_mayer_huggins` for NaCl, species 0 = Na⁺
    and 1 = Cl⁻, as ``(2, 2)`` tables ``A``, ``sigma``, ``C``, ``D`` and the scalar ``rho``,
    in nm and kJ/mol (the units of :func:`spce_water`: nm, ps, amu, kJ/mol, e).

    Tosi & Fumi, J. Phys. Chem. Solids 25, 45 (1964):
    :math:`A_{ij} = c_{ij} b` with :math:`b = 0.338\times10^{-19}` J and the Pauling factors
    :math:`c_{+-} = 1`, :math:`c_{++} = 1.25`, :math:`c_{--} = 0.75`;
    :math:`\sigma_{ij} = \sigma_i + \sigma_j` with the radii 0.1170 nm (Na⁺) and 0.1585 nm
    (Cl⁻); :math:`\rho` = 0.0317 nm; the dispersion coefficients of Mayer (J. Chem. Phys. 1,
    270 (1933)) as Tosi and Fumi used them, :math:`C_{+-}, C_{++}, C_{--}` = 11.2, 1.68,
    116 :math:`\times10^{-79}` J m⁶ and :math:`D_{+-}, D_{++}, D_{--}` = 13.9, 0.8, 233
    :math:`\times10^{-99}` J m⁸ (per ion pair; times Avogadro's number for kJ/mol). These
    are the values of LAMMPS's ``pair_style born`` example (its Na-Na line, in kcal/mol
    and Å: 6.08 0.317 2.340 24.18 11.51) and of Anwar, Frenkel & Noro, J. Chem. Phys. 118,
    728 (2003). The charges (+1, -1 e) and masses (22.98977, 35.453 amu) are not included.

    Example:
        >>> from simlib import particles as sp
        >>> tf = sp.tosi_fumi_nacl()
        >>> round(float(tf["A"][0, 1]), 3), float(tf["sigma"][0, 1]), tf["rho"]
        (20.355, 0.2755, 0.0317)
    """
    per_mol = 6.02214076e23 * 1e-3 * 1e-19          # 1e-19 J per pair -> kJ/mol
    b = 0.338 * per_mol
    c = np.array([[1.25, 1.0], [1.0, 0.75]])
    radii = np.array([0.1170, 0.1585])
    tables = dict(
        A=c * b,
        sigma=radii[:, None] + radii[None, :],
        C=np.array([[1.68, 11.2], [11.2, 116.0]]) * per_mol * 1e-6,   # 1e-79 J m^6
        D=np.array([[0.8, 13.9], [13.9, 233.0]]) * per_mol * 1e-8,     # 1e-99 J m^8
    )
    dtype = dtype or jnp.result_type(float)
    out = {name: jnp.asarray(value, dtype) for name, value in tables.items()}
    out["rho"] = 0.0317
    return out
