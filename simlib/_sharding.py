"""Small helpers over ``jax.sharding`` shared by :mod:`simlib.ensemble` and the sharded
particle energies: a default mesh, ``shard_map`` and placement that work on every
supported JAX (``jax.shard_map`` and ``AxisType`` are recent)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

_AxisType = getattr(jax.sharding, "AxisType", None)


def default_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = "members"
                 ) -> Mesh:
    """A one-axis :class:`~jax.sharding.Mesh` over ``devices`` (default: all devices of
    all processes, ``jax.devices()``); its axis is ``Auto`` where JAX has axis types."""
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices is empty")
    if not isinstance(axis_name, str) or not axis_name:
        raise ValueError(f"axis_name must be a non-empty string, got {axis_name!r}")
    if _AxisType is None:
        return jax.make_mesh((len(devices),), (axis_name,), devices=devices)
    return jax.make_mesh((len(devices),), (axis_name,), axis_types=(_AxisType.Auto,),
                         devices=devices)


def check_mesh(mesh) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh(...)), "
                        f"got {mesh!r}")
    return mesh


def is_explicit(mesh: Mesh) -> bool:
    types = getattr(mesh, "axis_types", None) or ()
    return _AxisType is not None and any(t == _AxisType.Explicit for t in types)


def place(x, mesh: Mesh, spec: P):
    """``x`` constrained to ``NamedSharding(mesh, spec)`` inside a traced function
    (``reshard`` on a mesh with ``Explicit`` axes, a sharding constraint otherwise)."""
    sharding = NamedSharding(mesh, spec)
    if is_explicit(mesh):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def shard_map(f, mesh: Mesh, in_specs, out_specs, check: bool = False):
    """``jax.shard_map``, or ``jax.experimental.shard_map.shard_map`` on JAX versions
    without it. ``check``: JAX's replication checks (which also make reverse mode through
    collectives right); off where the body holds host callbacks, which they reject."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=check)
    from jax.experimental.shard_map import shard_map as legacy

    return legacy(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check)
