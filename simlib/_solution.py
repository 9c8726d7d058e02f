"""``SaveAt`` (what to save) and ``Solution`` (what ``solve`` returns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np

from ._errors import Result
from ._solver._base import PyTree


@dataclass(frozen=True)
class SaveAt:
    """Which times a :func:`solve` returns.

    Exactly one of ``t1``, ``ts`` and ``steps`` selects the output; ``t0=True``
    additionally puts the initial state first.

    Attributes:
        t0: Also save the initial state.
        t1: Save the final state only (the default of ``solve``).
        ts: Save at these times, which must lie in ``[t0, t1]`` and be ordered in the
            direction of integration. Fixed-step runs step exactly onto them;
            adaptive runs use the method's dense output.
        steps: Save after every step. Adaptive runs return ``max_steps`` rows, the
            unused ones filled with ``inf``; ``stats["num_accepted"]`` says how many
            are real.
    """

    t0: bool = False
    t1: bool = False
    ts: Any = None
    steps: bool = False

    def mode(self) -> str:
        chosen = [name for name, on in (("t1", self.t1), ("ts", self.ts is not None),
                                        ("steps", self.steps)) if on]
        if len(chosen) != 1:
            raise ValueError(
                f"saveat: choose exactly one of t1=True, ts=..., steps=True; got {chosen or 'none'}"
            )
        return chosen[0]


class Solution(NamedTuple):
    """The result of :func:`solve`.

    Attributes:
        ts: Saved times, shape ``(n_save,)``.
        ys: Saved states: ``y0``'s pytree with a leading axis over ``ts``.
        stats: ``num_steps`` (attempts), ``num_accepted``, ``num_rejected``,
            ``num_fevals`` (right-hand-side evaluations, dense-output extras excluded)
            and ``t_final`` (where the integration stopped).
        result: A :class:`~simlib.Result` code; 0 means success.
    """

    ts: jax.Array
    ys: PyTree
    stats: dict
    result: jax.Array

    @property
    def message(self) -> str:
        """A readable account of ``result`` (for unbatched solutions)."""
        code = int(np.asarray(self.result).ravel()[0])
        if code == 0:
            return "the integration reached t1"
        return Result(code).name
