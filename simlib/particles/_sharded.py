r"""Pair energies and forces sharded over devices: each device owns a slice of the
target particles and sees every source (replicated positions).

Device :math:`k` of :math:`D` computes :math:`F_i = -\sum_j u'(r_{ij})(x_i - x_j)/r_{ij}`
for its targets :math:`i \in [k m, (k+1) m)`, :math:`m = \lceil n/D \rceil`, against all
:math:`n` sources (all pairs, in tiles of rows; or its rows of a neighbour list), and
:math:`\tfrac12\sum_i\sum_j u(r_{ij})` over its rows, summed over devices with one
``psum``. The pair work splits evenly; each step moves the forces' slices and the
positions, :math:`O(n)` numbers, against :math:`O(n^2/D)` pair terms per device for
direct-sum gravity. Results equal the single-device sum up to the order of the additions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._sharding import check_mesh, default_mesh, place, shard_map
from ._energy import Energy, PairEnergy
from ._mixing import PairParams
from ._space import nan_unless_valid

__all__ = ["ShardedEnergy", "sharded"]


@jax.tree_util.register_pytree_node_class
class ShardedEnergy(Energy):
    """A :class:`PairEnergy` whose forces are computed with the targets split over
    ``mesh``; build it with :func:`sharded`."""

    def __init__(self, energy: PairEnergy, mesh: Mesh) -> None:
        self.energy = energy
        self.mesh = mesh

    def tree_flatten(self):
        return (self.energy,), self.mesh

    @classmethod
    def tree_unflatten(cls, mesh, children):
        return cls(children[0], mesh)

    @property
    def space(self):
        return self.energy.space

    @property
    def r_cut(self):
        return self.energy.r_cut

    def __repr__(self):
        return f"sharded({self.energy!r}, {self.mesh.size} devices)"

    def __call__(self, positions, params, neighbors=None):
        """The total energy (computed with the forces, in the same pass)."""
        return self.energy_and_forces(positions, params, neighbors)[0]

    def virial(self, positions, params, neighbors=None):
        """The pair virial, from the wrapped energy on one device."""
        return self.energy.virial(positions, params, neighbors)

    def energy_and_forces(self, positions, params, neighbors=None):
        """The energy and the forces ``(n, d)``; the forces come back sharded over the
        mesh along the particle axis when ``n`` divides evenly."""
        pe = self.energy
        positions, code = pe._check(positions, neighbors)
        n, _ = positions.shape
        mesh = self.mesh
        names = tuple(mesh.axis_names)
        m = -(-n // mesh.size)
        n_pad = m * mesh.size - n
        idx = None
        if neighbors is not None:
            idx = jnp.pad(neighbors.idx, ((0, n_pad), (0, 0)), constant_values=n)
            idx = place(idx, mesh, P(names))
        positions = place(positions, mesh, P())

        def local(x, params, idx):
            k = lax.axis_index(names)
            rows = k * m + jnp.arange(m)
            e, f = _rows_energy_and_forces(pe, x, params, rows, idx)
            return lax.psum(e, names), f

        e, f = shard_map(local, mesh, (P(), P(), None if idx is None else P(names)),
                         (P(), P(names)), check=True)(positions, params, idx)
        return nan_unless_valid(code, e, f if n_pad == 0 else f[:n])


def _rows_energy_and_forces(pe: PairEnergy, x, params, rows, idx):
    """Half the pair energy summed over target ``rows`` (global indices, those ``>= n``
    are padding) and the forces on them, against all particles (``idx`` None) or their
    rows of a neighbour list."""
    n, d = x.shape
    xt = x.T
    if idx is not None:
        valid = (idx < n) & (rows[:, None] < n)
        i = jnp.minimum(rows, n - 1)
        j = jnp.where(valid, idx, 0)
        dr = [pe.space.minimum_image(xt[k][i][:, None] - xt[k][j], k) for k in range(d)]
        pp = PairParams(params, n, lambda a: a[i][:, None], lambda a: a[j], pe.rules)
        u, c, _ = pe._terms(dr, valid, pp, True)
        forces = jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)], axis=1)
        return 0.5 * jnp.sum(u), forces

    m = rows.shape[0]
    tile = min(pe.tile, m)
    n_tiles = -(-m // tile)
    tiles = jnp.concatenate([rows, jnp.full((n_tiles * tile - m,), n, rows.dtype)])
    cols = jnp.arange(n)

    def one(r):
        i = jnp.minimum(r, n - 1)
        valid = (r[:, None] < n) & (r[:, None] != cols[None, :])
        dr = [pe.space.minimum_image(xt[k][i][:, None] - xt[k][None, :], k) for k in range(d)]
        pp = PairParams(params, n, lambda a: a[i][:, None], lambda a: a[None, :], pe.rules)
        u, c, _ = pe._terms(dr, valid, pp, True)
        return jnp.sum(u), jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)])

    e, f = lax.map(jax.checkpoint(one), tiles.reshape(n_tiles, tile))  # f: (tiles, d, tile)
    forces = jnp.moveaxis(f, 1, 2).reshape(-1, d)[:m]
    return 0.5 * jnp.sum(e), forces


def sharded(energy: PairEnergy, mesh: Mesh | None = None) -> ShardedEnergy:
    """``energy`` with its forces computed over several devices, each owning a slice of
    the targets and seeing all sources (all-pairs sums such as direct-sum gravity, or a
    neighbour list's rows). Use it wherever the energy goes, e.g. ``simulate``.

    Args:
        energy: A :class:`PairEnergy` from :func:`pair_energy`.
        mesh: The devices (default: all devices on one axis, :func:`simlib.ensemble_mesh`).

    Example:
        >>> from simlib import particles as sp
        >>> energy = sp.sharded(sp.pair_energy(sp.gravity, sp.free()))  # doctest: +SKIP
    """
    if not isinstance(energy, PairEnergy):
        raise TypeError(f"sharded() takes a pair energy from pair_energy(), got "
                        f"{type(energy).__name__}")
    mesh = default_mesh(axis_name="particles") if mesh is None else check_mesh(mesh)
    return ShardedEnergy(energy, mesh)
