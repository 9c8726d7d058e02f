"""``init_distributed()``: one call that joins this process to a multi-process JAX run.

A thin layer over :func:`jax.distributed.initialize`: explicit arguments, else the
``SIMLIB_COORDINATOR`` / ``SIMLIB_NUM_PROCESSES`` / ``SIMLIB_PROCESS_ID`` environment
variables (plain ``ssh`` launches), else JAX's own cluster detection (SLURM, Open MPI,
Kubernetes), else a single process. After it, ``jax.devices()`` lists the devices of all
processes and :func:`simlib.ensemble` spreads members over them; CPU processes talk
through JAX's CPU collectives (gloo).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax

__all__ = ["ProcessInfo", "init_distributed"]

logger = logging.getLogger("simlib")

_ENV = ("SIMLIB_COORDINATOR", "SIMLIB_NUM_PROCESSES", "SIMLIB_PROCESS_ID")


class ProcessInfo(NamedTuple):
    """Where this process stands: its index, the number of processes, and the devices
    it holds and that all processes hold together."""

    process_id: int
    num_processes: int
    local_device_count: int
    device_count: int


def _info() -> ProcessInfo:
    return ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(),
                       jax.device_count())


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment variable {name} must be an integer, "
                         f"got {value!r}") from None


def _is_initialized() -> bool:
    check = getattr(jax.distributed, "is_initialized", None)
    if check is not None:
        return bool(check())
    from jax._src import distributed  # older JAX: no public query

    return distributed.global_state.client is not None


def init_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *,
                     local_device_ids: int | Sequence[int] | None = None,
                     timeout: int = 300) -> ProcessInfo:
    """Join this process to a multi-process run (call it first, before any JAX
    computation); a no-op returning the current state when already joined.

    Args:
        coordinator_address: ``host:port`` of process 0, which all processes reach.
            Default: ``$SIMLIB_COORDINATOR``, else JAX's detection (``$JAX_COORDINATOR_ADDRESS``,
            SLURM, Open MPI, ...).
        num_processes: The number of processes. Default: ``$SIMLIB_NUM_PROCESSES`` or
            the cluster's.
        process_id: This process's index, ``0 <= process_id < num_processes``. Default:
            ``$SIMLIB_PROCESS_ID`` or the cluster's (e.g. ``$SLURM_PROCID``).
        local_device_ids: The local devices this process uses (default: all).
        timeout: Seconds to wait for all processes to join.

    Returns:
        A :class:`ProcessInfo`. Without arguments, environment variables or a detected
        cluster it joins nothing and reports one process.

    Example:
        >>> import simlib as sl
        >>> sl.init_distributed()  # on a laptop: nothing to join  # doctest: +SKIP
        ProcessInfo(process_id=0, num_processes=1, local_device_count=1, device_count=1)
    """
    if _is_initialized():
        return _info()
    coordinator_address = coordinator_address or os.environ.get(_ENV[0]) or None
    if num_processes is None:
        num_processes = _env_int(_ENV[1])
    if process_id is None:
        process_id = _env_int(_ENV[2])
    if coordinator_address is not None and not isinstance(coordinator_address, str):
        raise TypeError(f"coordinator_address must be a 'host:port' string, "
                        f"got {coordinator_address!r}")
    if coordinator_address is not None and ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    if num_processes is not None and (not isinstance(num_processes, int) or num_processes < 1):
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}")
    if process_id is not None and num_processes is not None and not (
            isinstance(process_id, int) and 0 <= process_id < num_processes):
        raise ValueError(f"process_id must be an integer in [0, num_processes={num_processes}), "
                         f"got {process_id!r}")
    if not isinstance(timeout, int) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")

    explicit = (coordinator_address, num_processes, process_id) != (None, None, None)
    if "jax_cpu_collectives_implementation" in jax.config.values and \
            jax.config.values["jax_cpu_collectives_implementation"] in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   local_device_ids=local_device_ids,
                                   initialization_timeout=timeout)
    except ValueError as err:
        if explicit or "should be defined" not in str(err) and "must be defined" not in str(err):
            raise
        logger.info("init_distributed: no coordinator given and no cluster detected; "
                    "running as a single process")
    except RuntimeError as err:
        raise RuntimeError(f"init_distributed() must be called before any JAX computation "
                           f"in this process: {err}") from err
    return _info()
