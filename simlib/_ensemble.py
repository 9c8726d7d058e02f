"""``ensemble()``: ``vmap`` over members, sharded over a mesh of devices.

Each device runs ``jax.vmap(fn)`` on its own slice of the members inside one
``jax.shard_map``: its loops (an adaptive solve's ``while_loop``) stop when its own
slowest member is done, with no collective per step, and the in-graph failure check
(``throw=True``) runs on each device's slice. Padding makes any member count fit the mesh.
With ``sequential=True`` each device runs its members one after another (``lax.map``)
instead: no member waits for another's steps or Newton iterations, at the price of no
vectorisation across members (the better choice for large sparse implicit solves on a CPU,
docs/pde.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ._errors import failure_check_shared_over
from ._sharding import check_mesh, default_mesh, place, shard_map

__all__ = ["ensemble", "ensemble_mesh"]


def ensemble_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = "members"
                  ) -> Mesh:
    """The default mesh of :func:`ensemble`: one axis over ``devices`` (default: all
    devices of all processes, ``jax.devices()``)."""
    return default_mesh(devices, axis_name)


def _normalise_in_axes(in_axes, n_args: int) -> tuple[int | None, ...]:
    if in_axes is None or isinstance(in_axes, int):
        in_axes = (in_axes,) * n_args
    in_axes = tuple(in_axes)
    if len(in_axes) != n_args:
        raise ValueError(f"in_axes has {len(in_axes)} entries but the ensemble was called with "
                         f"{n_args} positional arguments")
    for i, ax in enumerate(in_axes):
        if ax not in (0, None):
            raise ValueError(f"in_axes[{i}] must be 0 (batched over members along the leading "
                             f"axis) or None (shared by all members), got {ax!r}")
    return in_axes


def _member_count(args, in_axes) -> int:
    counts = {}
    for i, (arg, ax) in enumerate(zip(args, in_axes, strict=True)):
        if ax is None:
            continue
        for leaf in jax.tree_util.tree_leaves(arg):
            shape = jnp.shape(leaf)
            if not shape:
                raise ValueError(f"argument {i} is batched (in_axes 0) but has a scalar leaf; "
                                 "give it a leading member axis, or in_axes None")
            counts.setdefault(shape[0], i)
    if not counts:
        raise ValueError("no argument is batched: give at least one argument with in_axes 0")
    if len(counts) > 1:
        detail = ", ".join(f"{n} (argument {i})" for n, i in counts.items())
        raise ValueError(f"batched arguments disagree on the number of members: {detail}")
    return next(iter(counts))


def _pad(x, n_pad: int):
    """``x`` with its last member repeated ``n_pad`` times (a valid member, so padding
    never fails on its own account)."""
    if n_pad == 0:
        return x
    return jnp.concatenate([x, jnp.repeat(x[-1:], n_pad, axis=0)], axis=0)


def ensemble(fn: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0, *,
             mesh: Mesh | None = None, gather: bool = False,
             sequential: bool = False) -> Callable[..., Any]:
    """``jax.vmap(fn, in_axes)``, jitted, with the members sharded over ``mesh``.

    ``fn`` maps one member's arguments to a pytree of arrays (a :class:`~simlib.Solution`,
    a final state, a loss). The members (the leading axis of the arguments whose
    ``in_axes`` entry is 0) are split into equal slices, one per device, padded with
    copies of the last member when their number does not divide evenly; arguments with
    ``in_axes`` None are shared (replicated). Each device runs ``vmap(fn)`` on its slice
    inside :func:`jax.shard_map`, so adaptive members on one device never wait for
    another device's slow members, and ``throw=True`` checks each device's slice on that
    device, then gathers one candidate per device, so that every process raises the
    ensemble's first failing member. Parameter sweeps batch ``args``, initial-condition
    sweeps batch ``y0``.

    Args:
        fn: The per-member function.
        in_axes: 0 or None, or a tuple of them, one per positional argument (like
            :func:`jax.vmap`, but for whole arguments only).
        mesh: The devices to use; default :func:`ensemble_mesh` (all devices of all
            processes on one axis). With a mesh of several axes the members are split
            over all of them.
        gather: Return the results replicated on every device (so that ``np.asarray``
            works in every process) instead of sharded over the mesh along the member
            axis (``NamedSharding(mesh, PartitionSpec(axes))``, the default).
        sequential: Run each device's members one at a time (``lax.map``, in one compiled
            program) instead of ``vmap``-ed together. Under ``vmap`` an adaptive solve's
            members step in lockstep: every batched step, and every Newton iteration in it,
            costs all members' work until the slowest is done, and a large sparse LU's
            factors (1 MB a member at 2,048 states) no longer stay in cache between a
            member's solves. On a CPU that made a 64-member ensemble of a 2,048-state stiff
            PDE 3.1 times as costly as its members in turn (CPU seconds, docs/pde.md). The
            in-graph failure check (``throw=True``) then runs member by member and names
            no member.

    Returns:
        A function of the same positional arguments as ``fn``, whose outputs have a
        leading member axis.

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> decay = lambda t, y, k: -k * y
        >>> final = lambda k: sl.solve(decay, jnp.ones(1), 0.0, 1.0, solver=sl.Tsit5(),
        ...                            rtol=1e-8, atol=1e-10, args=k).ys[-1, 0]
        >>> out = sl.ensemble(final)(jnp.linspace(0.0, 1.0, 5))
        >>> round(float(out[-1]), 6)  # exp(-1)
        0.367879
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if mesh is not None:
        check_mesh(mesh)
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)

    @functools.wraps(fn)
    def run(*args):
        axes = _normalise_in_axes(in_axes, len(args))
        n = _member_count(args, axes)
        m = ensemble_mesh() if mesh is None else mesh
        return _run(fn, axes, m, bool(gather), bool(sequential), n, *args)

    return run


def _in_turn(fn: Callable[..., Any], in_axes: tuple[int | None, ...]) -> Callable[..., Any]:
    """``jax.vmap(fn, in_axes)``'s result with the members run one at a time
    (``lax.map`` over the batched arguments; the shared ones are closed over)."""

    def run(*args):
        batched = tuple(a for a, ax in zip(args, in_axes, strict=True) if ax == 0)

        def one(member):
            it = iter(member)
            return fn(*(next(it) if ax == 0 else a for a, ax in zip(args, in_axes,
                                                                   strict=True)))

        return lax.map(one, batched)

    return run


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _run(fn, in_axes, mesh: Mesh, gather: bool, sequential: bool, n: int, *args):
    names = tuple(mesh.axis_names)
    member = P(names)
    n_dev = mesh.size
    batch = _in_turn(fn, in_axes) if sequential else jax.vmap(fn, in_axes=in_axes)
    if n == 0:  # nothing to split: plain vmap
        return jax.vmap(fn, in_axes=in_axes)(*args)
    n_pad = -n % n_dev
    in_specs = tuple(P() if ax is None else member for ax in in_axes)
    padded = []
    for arg, ax, spec in zip(args, in_axes, in_specs, strict=True):
        leaves, tree = jax.tree_util.tree_flatten(arg)
        leaves = [place(x if ax is None else _pad(x, n_pad), mesh, spec) for x in leaves]
        padded.append(jax.tree_util.tree_unflatten(tree, leaves))
    per_device = shard_map(batch, mesh, in_specs, member)
    # each device's failure candidate is shared over the mesh, so that every process
    # raises (not only the one holding the failing member, leaving the others blocked)
    with failure_check_shared_over(mesh):
        out = per_device(*padded)
    if n_pad:  # an uneven count cannot stay sharded: gather, then drop the padding
        return jax.tree_util.tree_map(lambda x: place(x, mesh, P())[:n], out)
    return jax.tree_util.tree_map(lambda x: place(x, mesh, P() if gather else member), out)
