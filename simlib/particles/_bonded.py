r"""Bonded terms beyond pairs: bond angles and dihedrals (proper and improper) over fixed
lists of atoms, for molecules.

Each term reads its atoms' displacements by the minimum image (so a molecule may straddle
the periodic boundary) and passes an angle to a potential ``u(angle, params)``:

- bond angle of ``(i, j, k)`` (vertex ``j``): :math:`\theta = \operatorname{atan2}(|a \times b|,
  a \cdot b)` with :math:`a = x_i - x_j`, :math:`b = x_k - x_j`, in :math:`[0, \pi]`;
- dihedral of ``(i, j, k, l)``: with :math:`b_1 = x_j - x_i`, :math:`b_2 = x_k - x_j`,
  :math:`b_3 = x_l - x_k`, :math:`n_1 = b_1 \times b_2`, :math:`n_2 = b_2 \times b_3`,
  :math:`\phi = \operatorname{atan2}(|b_2|\, b_1 \cdot n_2,\; n_1 \cdot n_2)` in
  :math:`(-\pi, \pi]` (IUPAC sign: ``phi = pi`` is trans, ``0`` cis; Blondel & Karplus,
  J. Comput. Chem. 17, 1132 (1996), for the atan2 form, which has no singularity at
  ``0`` or ``pi`` as the arccos form has). An improper dihedral is the same angle of a
  different quadruple (central atom first, as in CHARMM), usually with a harmonic
  potential.

Forces are ``-grad U`` by reverse mode. The virial of a term is
:math:`W = -\sum_k b_k \cdot \partial u / \partial b_k` over its displacement vectors,
which is the :math:`\sum_a x_a \cdot f_a` of the term with the molecule unwrapped (a term's
forces sum to zero), so :func:`~simlib.particles.pressure` counts bonded terms correctly in
a periodic box.

Potentials (parameters: scalars, or one value per term):
:func:`harmonic_angle` (``k_theta``, ``theta0``), :func:`periodic_torsion` (``k_phi``,
``n_phi``, ``phi0``; AMBER/CHARMM form) and :func:`harmonic_improper` (``k_xi``, ``xi0``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from .._util import is_tracer
from ._energy import Energy, PairEnergy
from ._space import Space


def _norm(v):
    """``|v|`` over the last axis, with a finite gradient at ``v = 0`` (double where)."""
    s = jnp.sum(v * v, axis=-1)
    nonzero = s > 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, s, 1.0)), 0.0)


def bond_angle(a: ArrayLike, b: ArrayLike) -> jax.Array:
    r"""The angle between vectors ``a`` and ``b`` (last axis), :math:`\operatorname{atan2}
    (|a \times b|, a \cdot b)` in :math:`[0, \pi]`."""
    return jnp.arctan2(_norm(jnp.cross(a, b)), jnp.sum(a * b, axis=-1))


def dihedral_angle(b1: ArrayLike, b2: ArrayLike, b3: ArrayLike) -> jax.Array:
    r"""The dihedral angle of bond vectors ``b1, b2, b3`` (IUPAC sign, trans = pi):
    :math:`\operatorname{atan2}(|b_2|\, b_1 \cdot (b_2 \times b_3), (b_1 \times b_2)
    \cdot (b_2 \times b_3))` (Blondel & Karplus 1996)."""
    n1 = jnp.cross(b1, b2)
    n2 = jnp.cross(b2, b3)
    return jnp.arctan2(_norm(b2) * jnp.sum(b1 * n2, axis=-1), jnp.sum(n1 * n2, axis=-1))


def harmonic_angle(theta: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Harmonic bond angle: :math:`u = \tfrac12 k_\theta (\theta - \theta_0)^2`.

    Params: ``k_theta`` (energy per rad^2), ``theta0`` (rad)."""
    return 0.5 * params["k_theta"] * (theta - params["theta0"]) ** 2


def periodic_torsion(phi: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Periodic (proper) torsion: :math:`u = k_\phi [1 + \cos(n \phi - \phi_0)]`, the
    AMBER and CHARMM form (Cornell et al., J. Am. Chem. Soc. 117, 5179 (1995)).

    Params: ``k_phi`` (energy), ``n_phi`` (periodicity), ``phi0`` (phase, rad)."""
    return params["k_phi"] * (1.0 + jnp.cos(params["n_phi"] * phi - params["phi0"]))


def harmonic_improper(xi: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    r"""Harmonic improper dihedral: :math:`u = \tfrac12 k_\xi (\xi - \xi_0)^2`, with the
    difference wrapped into :math:`(-\pi, \pi]` (CHARMM; Brooks et al., J. Comput. Chem.
    4, 187 (1983)).

    Params: ``k_xi`` (energy per rad^2), ``xi0`` (rad)."""
    d = xi - params["xi0"]
    d = jnp.arctan2(jnp.sin(d), jnp.cos(d))
    return 0.5 * params["k_xi"] * d * d


@jax.tree_util.register_pytree_node_class
class AngleEnergy(Energy):
    r""":math:`U = \sum_t u(\text{angle}_t)` over a fixed list of bond angles or
    dihedrals. Build it with :func:`angle_energy` or :func:`dihedral_energy`."""

    def __init__(self, potential: Callable[..., jax.Array], space: Space,
                 atoms: ArrayLike) -> None:
        self.potential = potential
        self.space = space
        self.atoms = atoms
        self.r_cut = None

    def tree_flatten(self):
        return (self.space, self.atoms), self.potential

    @classmethod
    def tree_unflatten(cls, potential, children):
        return cls(potential, *children)

    def _vectors(self, positions):
        """The term's displacement vectors, minimum images: ``(a, b)`` for an angle,
        ``(b1, b2, b3)`` for a dihedral, each ``(m, 3)``."""
        x = [positions[self.atoms[:, c]] for c in range(self.atoms.shape[1])]
        d = self.space.displacement
        if self.atoms.shape[1] == 3:
            return d(x[0], x[1]), d(x[2], x[1])
        return d(x[1], x[0]), d(x[2], x[1]), d(x[3], x[2])

    def _from_vectors(self, vectors, params):
        angle = bond_angle(*vectors) if len(vectors) == 2 else dihedral_angle(*vectors)
        return jnp.sum(self.potential(angle, params))

    def angles(self, positions) -> jax.Array:
        """The angle of each term, ``(m,)`` (rad)."""
        vectors = self._vectors(jnp.asarray(positions))
        return bond_angle(*vectors) if len(vectors) == 2 else dihedral_angle(*vectors)

    def _in_range(self, positions, value):
        """``value``, or NaN where an atom index is outside ``[0, n)`` (checked in the
        graph, so a traced list cannot read a clamped index quietly)."""
        n = positions.shape[0]
        ok = jnp.all((self.atoms >= 0) & (self.atoms < n))
        return jnp.where(ok, value, jnp.nan)

    def __call__(self, positions, params, neighbors=None):
        positions = self._checked(positions)
        return self._in_range(positions, self._from_vectors(self._vectors(positions), params))

    def virial(self, positions, params, neighbors=None):
        r""":math:`W = -\sum_k b_k \cdot \partial U / \partial b_k` over the terms'
        displacement vectors."""
        positions = self._checked(positions)
        vectors = self._vectors(positions)
        grads = jax.grad(self._from_vectors)(vectors, params)
        return self._in_range(positions, -sum(jnp.sum(b * g)
                                              for b, g in zip(vectors, grads, strict=True)))

    def virial_tensor(self, positions, params, neighbors=None):
        r""":math:`W_{ab} = -\sum_k b_{k,a}\, \partial U / \partial b_{k,b}` over the terms'
        displacement vectors, ``(3, 3)``."""
        positions = self._checked(positions)
        vectors = self._vectors(positions)
        grads = jax.grad(self._from_vectors)(vectors, params)
        w = -sum(jnp.einsum("ma,mb->ab", b, g) for b, g in zip(vectors, grads, strict=True))
        return self._in_range(positions, w)

    def _checked(self, positions):
        positions = jnp.asarray(positions)
        if positions.ndim != 2 or positions.shape[1] != 3:
            raise ValueError(f"bond angles and dihedrals need 3-D positions of shape (n, 3), "
                             f"got {positions.shape}")
        if not is_tracer(self.atoms) and self.atoms.shape[0]:
            top = int(np.max(np.asarray(self.atoms)))
            if top >= positions.shape[0]:
                raise ValueError(f"an angle or dihedral names atom {top}, but positions has "
                                 f"{positions.shape[0]} atoms")
        return positions


def _atoms(name: str, atoms, width: int):
    atoms = jnp.asarray(atoms)
    if atoms.ndim != 2 or atoms.shape[1] != width or not jnp.issubdtype(atoms.dtype,
                                                                          jnp.integer):
        raise ValueError(f"{name}: the atom list must be an (m, {width}) integer array, got "
                         f"shape {atoms.shape} and dtype {atoms.dtype}")
    if is_tracer(atoms):
        return atoms      # checked in the graph: an index outside [0, n) gives NaN
    atoms_np = np.asarray(atoms)
    if atoms.shape[0] and not np.all(atoms_np >= 0):
        raise ValueError(f"{name}: atom indices must be non-negative")
    same = [(a, b) for a in range(width) for b in range(a + 1, width)]
    if atoms.shape[0] and any(np.any(atoms_np[:, a] == atoms_np[:, b]) for a, b in same):
        raise ValueError(f"{name}: an atom appears twice in one term")
    return atoms


def angle_energy(potential: Callable, space: Space, angles: ArrayLike) -> AngleEnergy:
    """The energy of ``potential(theta, params)`` over bond angles ``angles``, an ``(m, 3)``
    integer array of ``(i, j, k)`` with ``j`` the vertex. Parameters: scalars or one value
    per angle. Add it to pair and bond energies: ``pair_energy(...) + bond_energy(harmonic,
    space, bonds) + angle_energy(harmonic_angle, space, angles)``."""
    return AngleEnergy(potential, space, _atoms("angle_energy", angles, 3))


def dihedral_energy(potential: Callable, space: Space, dihedrals: ArrayLike) -> AngleEnergy:
    """The energy of ``potential(phi, params)`` over dihedrals ``dihedrals``, an ``(m, 4)``
    integer array of ``(i, j, k, l)`` (bonds i-j, j-k, k-l for a proper dihedral; for an
    improper one, the quadruple whose dihedral measures the out-of-plane angle). Parameters:
    scalars or one value per dihedral."""
    return AngleEnergy(potential, space, _atoms("dihedral_energy", dihedrals, 4))


@jax.tree_util.register_pytree_node_class
class PairCorrection(Energy):
    r"""Excluded and scaled pairs of a pair energy: :math:`U = (s - 1) \sum_{(i,j) \in P}
    u(r_{ij})`, so that ``pair + correction`` leaves the pairs :math:`P` out (``s = 0``) or
    scales them by ``s`` (AMBER's 1-4 pairs: 1/2 for Lennard-Jones). The pair energy's own
    potential, cutoff, shift and mixing rules apply to each listed pair. Build it with
    :func:`pair_correction`."""

    def __init__(self, pair: PairEnergy, pairs: ArrayLike, scale: ArrayLike) -> None:
        self.pair = pair
        self.pairs = pairs
        self.scale = scale
        self.space = pair.space
        self.r_cut = None

    def tree_flatten(self):
        return (self.pair, self.pairs, self.scale), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)

    def _pass(self, positions, params):
        from ._mixing import PairParams

        n, d = positions.shape
        i, j = self.pairs[:, 0], self.pairs[:, 1]
        dr = [self.space.minimum_image(positions[i, k] - positions[j, k], k) for k in range(d)]
        valid = (i >= 0) & (j < n) & (i != j)
        pp = PairParams(params, n, lambda a: a[i], lambda a: a[j], self.pair.rules)
        u, c, r = self.pair._terms(dr, valid, pp, True)
        ok = jnp.all((self.pairs >= 0) & (self.pairs < n))
        return u, c, r, ok

    def __call__(self, positions, params, neighbors=None):
        u, _, _, ok = self._pass(jnp.asarray(positions), params)
        return jnp.where(ok, (self.scale - 1.0) * jnp.sum(u), jnp.nan)

    def virial(self, positions, params, neighbors=None):
        _, c, r, ok = self._pass(jnp.asarray(positions), params)
        return jnp.where(ok, -(self.scale - 1.0) * jnp.sum(c * r * r), jnp.nan)

    def virial_tensor(self, positions, params, neighbors=None):
        positions = jnp.asarray(positions)
        _, c, _, ok = self._pass(positions, params)
        i, j = self.pairs[:, 0], self.pairs[:, 1]
        dr = self.space.displacement(positions[i], positions[j])
        w = -(self.scale - 1.0) * jnp.einsum("m,ma,mb->ab", c, dr, dr)
        return jnp.where(ok, w, jnp.nan)


def pair_correction(pair: PairEnergy, pairs: ArrayLike, scale: float = 0.0) -> PairCorrection:
    """Leave the pairs ``pairs`` (an ``(m, 2)`` integer array, e.g. from
    :func:`~simlib.particles.excluded_pairs`) out of the pair energy ``pair`` (``scale=0``)
    or scale them (``scale=0.5`` for AMBER's 1-4 Lennard-Jones): add the result to it,
    ``pair + pair_correction(pair, pairs_12_13) + pair_correction(pair, pairs_14, 0.5)``.
    Each pair must be listed once."""
    from ._energy import PairEnergy

    if not isinstance(pair, PairEnergy):
        raise TypeError(f"pair_correction: pair must come from pair_energy(...), got "
                        f"{type(pair).__name__}")
    pairs = _atoms("pair_correction", pairs, 2)
    if not is_tracer(pairs) and pairs.shape[0]:
        p = np.sort(np.asarray(pairs), axis=1)
        if len(np.unique(p, axis=0)) != len(p):
            raise ValueError("pair_correction: a pair is listed twice; it would be "
                             "corrected twice")
    return PairCorrection(pair, pairs, jnp.asarray(scale, float) if not isinstance(
        scale, (int, float)) else float(scale))
