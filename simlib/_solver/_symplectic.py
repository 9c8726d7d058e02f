"""Symplectic splitting methods for separable systems ``y = (q, p)``.

For ``dq/dt = V(p)`` and ``dp/dt = F(q)`` (the vector field ``f(t, (q, p), args)``
returning ``(V, F)`` with ``V`` depending on ``p`` only and ``F`` on ``q`` only),
a splitting method alternates exact flows of the two parts:

    kick:  p <- p + b_i h F(q)        drift:  q <- q + a_i h V(p)

in the order ``kick b_0, drift a_0, kick b_1, ..., drift a_{m-1}, kick b_m``.
These maps are symplectic, so energy errors stay bounded instead of drifting
(Hairer, Lubich and Wanner, *Geometric Numerical Integration*, 2nd ed., 2006).
When the first and last kicks are nonzero, the force at the end of a step is the
force at the start of the next; it is carried between steps (one evaluation per
step for velocity Verlet).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from ._base import AbstractSolver, PyTree, VectorField, register_static


def _kick(p: PyTree, force: PyTree, coef: float, h) -> PyTree:
    return jax.tree_util.tree_map(
        lambda x, fx: x + jnp.asarray(coef * h, x.dtype) * fx, p, force
    )


class SymplecticSplitting(AbstractSolver):
    """A symplectic composition of kicks ``b`` and drifts ``a`` (see the module docstring)."""

    symplectic = True
    kicks: ClassVar[tuple[float, ...]]
    drifts: ClassVar[tuple[float, ...]]

    @property
    def time_symmetric(self) -> bool:  # type: ignore[override]
        """Whether the coefficients read the same backwards (``Phi_{-h} = Phi_h^{-1}``)."""
        return (all(abs(a - b) < 1e-15 for a, b in zip(self.kicks, self.kicks[::-1],
                                                         strict=True))
                and all(abs(a - b) < 1e-15 for a, b in zip(self.drifts, self.drifts[::-1],
                                                           strict=True)))

    @property
    def carries_force(self) -> bool:
        return self.kicks[0] != 0.0 and self.kicks[-1] != 0.0

    def _force(self, f: VectorField, t, q, p, args):
        return f(t, (q, p), args)[1]

    def _velocity(self, f: VectorField, t, q, p, args):
        return f(t, (q, p), args)[0]

    @property
    def fevals_per_step(self) -> int:  # type: ignore[override]
        kicks = sum(1 for b in self.kicks if b != 0.0) - (1 if self.carries_force else 0)
        return kicks + len(self.drifts)

    @property
    def init_fevals(self) -> int:  # type: ignore[override]
        return 1 if self.carries_force else 0

    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> PyTree:
        """The force at the start of the first step, when it is carried between steps."""
        if not self.carries_force:
            return None
        q, p = y
        return self._force(f, t, q, p, args) if f0 is None else f0[1]

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        """One step of size ``h``. Returns ``(y1, None, None, force_at_end)``."""
        q, p = y
        tq = t
        force = None
        for i, b in enumerate(self.kicks):
            if b != 0.0:
                if i == 0 and self.carries_force:
                    force = state
                else:
                    force = self._force(f, tq, q, p, args)
                p = _kick(p, force, b, h)
            if i < len(self.drifts):
                a = self.drifts[i]
                v = self._velocity(f, tq, q, p, args)
                q = jax.tree_util.tree_map(
                    lambda x, vx, a=a: x + jnp.asarray(a * h, x.dtype) * vx, q, v
                )
                tq = tq + a * h
        new_state = force if self.carries_force else None
        return (q, p), None, None, new_state


def _splitting(name: str, kicks, drifts, order: int, doc: str, reference: str):
    if abs(sum(kicks) - 1.0) > 1e-14 or abs(sum(drifts) - 1.0) > 1e-14:
        raise ValueError(f"{name}: kick and drift coefficients must each sum to 1")
    cls = type(
        name,
        (SymplecticSplitting,),
        {
            "kicks": tuple(kicks),
            "drifts": tuple(drifts),
            "order": order,
            "reference": reference,
            "__doc__": doc,
        },
    )
    cls.__module__ = "simlib"
    return register_static(cls)


SemiImplicitEuler = _splitting(
    "SemiImplicitEuler",
    (1.0, 0.0),
    (1.0,),
    1,
    "Semi-implicit (symplectic) Euler: p += h F(q); q += h V(p). Order 1.",
    "Hairer, Lubich and Wanner, Geometric Numerical Integration (2006), I.1.2",
)
VelocityVerlet = _splitting(
    "VelocityVerlet",
    (0.5, 0.5),
    (1.0,),
    2,
    "Velocity Verlet (Stormer-Verlet, kick-drift-kick leapfrog), order 2, time-reversible. "
    "One force evaluation per step.",
    "Verlet, Phys. Rev. 159 (1967) 98; Hairer, Lubich and Wanner (2006), I.1.4",
)
Leapfrog = VelocityVerlet

_CBRT2 = 2.0 ** (1.0 / 3.0)
_W1 = 1.0 / (2.0 - _CBRT2)
_W0 = -_CBRT2 / (2.0 - _CBRT2)
Yoshida4 = _splitting(
    "Yoshida4",
    (_W1 / 2, (_W1 + _W0) / 2, (_W0 + _W1) / 2, _W1 / 2),
    (_W1, _W0, _W1),
    4,
    "Yoshida's fourth-order triple-jump composition of velocity Verlet, time-reversible.",
    "H. Yoshida, Construction of higher order symplectic integrators, "
    "Phys. Lett. A 150 (1990) 262-268",
)

_XI = 0.1786178958448091
_LAMBDA = -0.2123418310626054
_CHI = -0.06626458266981849
PEFRL = _splitting(
    "PEFRL",
    (0.0, (1 - 2 * _LAMBDA) / 2, _LAMBDA, _LAMBDA, (1 - 2 * _LAMBDA) / 2, 0.0),
    (_XI, _CHI, 1 - 2 * (_CHI + _XI), _CHI, _XI),
    4,
    "Position-extended Forest-Ruth-like method, order 4, four force evaluations per "
    "step with an error constant about 100 times smaller than Forest-Ruth's.",
    "I. P. Omelyan, I. M. Mryglod and R. Folk, Optimized Verlet-like algorithms for "
    "molecular dynamics simulations, Comput. Phys. Commun. 146 (2002) 188-202",
)
