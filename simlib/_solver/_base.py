"""The solver protocol shared by every stepper, and pytree arithmetic helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._static import Settings
from .._static import register_static as register_static  # the solvers register from here

PyTree = Any
VectorField = Callable[[Any, PyTree, Any], PyTree]


def axpy(y: PyTree, h, terms: list[tuple[float, PyTree]]) -> PyTree:
    """``y + h * sum_j coef_j * k_j`` leaf by leaf, skipping zero coefficients.

    ``h`` is cast to each leaf's dtype so that the state keeps its dtype.
    """
    terms = [(c, k) for c, k in terms if c != 0.0]
    if not terms:
        return y

    def leaf(y_leaf, *k_leaves):
        acc = terms[0][0] * k_leaves[0]
        for (c, _), k_leaf in zip(terms[1:], k_leaves[1:], strict=True):
            acc = acc + c * k_leaf
        return y_leaf + jnp.asarray(h, y_leaf.dtype) * acc

    return jax.tree_util.tree_map(leaf, y, *[k for _, k in terms])


def linear_combination(terms: list[tuple[float, PyTree]]) -> PyTree:
    """``sum_j coef_j * k_j`` leaf by leaf, skipping zero coefficients."""
    terms = [(c, k) for c, k in terms if c != 0.0]

    def leaf(*k_leaves):
        acc = terms[0][0] * k_leaves[0]
        for (c, _), k_leaf in zip(terms[1:], k_leaves[1:], strict=True):
            acc = acc + c * k_leaf
        return acc

    return jax.tree_util.tree_map(leaf, *[k for _, k in terms])


def sum_squares(tree: PyTree) -> jax.Array:
    """``sum(x^2)`` over every component of a pytree."""
    return sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree))


def safe_sqrt(x: jax.Array) -> jax.Array:
    """``sqrt(x)`` whose gradient at ``x = 0`` is zero instead of nan (the double-where)."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def tree_size(tree: PyTree) -> int:
    return sum(int(np.prod(jnp.shape(x))) for x in jax.tree_util.tree_leaves(tree))


def error_scale(y: PyTree, y1: PyTree, rtol, atol) -> PyTree:
    """``atol + rtol * max(|y|, |y1|)``, the per-component tolerance (Hairer et al. II.4)."""
    return jax.tree_util.tree_map(
        lambda a, b: atol + rtol * jnp.maximum(jnp.abs(a), jnp.abs(b)), y, y1
    )


def rms_error_ratio(y: PyTree, y1: PyTree, err: PyTree, rtol, atol, factor=1.0,
                    norm: Callable[[PyTree], jax.Array] | None = None) -> jax.Array:
    """``factor * sqrt(mean((err / (atol + rtol max(|y|, |y1|)))^2))`` over every component
    (``factor * norm(err / (atol + rtol max(|y|, |y1|)))`` with a ``norm``)."""
    scale = error_scale(y, y1, rtol, atol)
    scaled = jax.tree_util.tree_map(lambda e, s: e / s, err, scale)
    if norm is not None:
        return factor * norm(scaled)
    return factor * safe_sqrt(sum_squares(scaled) / tree_size(y))


class Field:
    """The vector field ``f(t, y, args)`` as a driver hands it to a solver.

    A driver calls the user's field with its own ``args``: the user's ``args`` and the
    values the field closes over (``jax.closure_convert``), a DAE's mass matrix ``M``
    (simlib/_dae.py), an SDE's Brownian path (simlib/_sde.py). A solver that needs one of
    those asks the field for it, explicitly:

    - :meth:`user_args`: the user's own ``args`` (what a callable ``jac(t, y, args)`` is
      given, or an SDE's ``(args, path, noise)``);
    - :meth:`mass`: ``M`` of ``M y' = f`` in the linear solver's format, ``None`` for an
      ODE (``M = I``).

    A plain function given to a solver directly (a test, a user's own loop) is not a
    ``Field``: :func:`user_args` and :func:`mass_matrix` then give ``args`` and ``None``.
    """

    def __call__(self, t, y: PyTree, args) -> PyTree:
        raise NotImplementedError

    def user_args(self, args):
        """The user's ``args`` inside the driver's ``args`` (here: ``args`` itself)."""
        return args

    def mass(self, args):
        """The mass matrix riding in the driver's ``args`` (here: ``None``, an ODE)."""
        return None


def user_args(f: VectorField, args):
    """The user's ``args`` inside ``args``, the driver's, for the field ``f``."""
    return f.user_args(args) if isinstance(f, Field) else args


def mass_matrix(f: VectorField, args):
    """The mass matrix of ``M y' = f`` in ``args`` (``None``: an ODE, ``M = I``)."""
    return f.mass(args) if isinstance(f, Field) else None


class AbstractSolver(Settings):
    """A one-step method ``y_{n+1} = Phi(t_n, y_n, h)``: the base class of every solver.

    The drivers (fixed step and adaptive) see a solver only through this protocol; they
    never look inside its error estimate, its dense output or its carried state.

    Attributes:
        order: Order of the method.
        adaptive: Whether ``step`` returns an embedded error estimate (``rtol``/``atol``).
        error_order: Order of the embedded method (``None``: ``order - 1``); the step-size
            controller uses ``error_order + 1``.
        symplectic: Whether the method needs a separable ``(q, p)`` state.
        reference: Where the method comes from.
        fevals_per_step: Evaluations of ``f`` in one ``step`` (carried state reused).
        init_fevals: Evaluations of ``f`` in ``init`` when it is not given ``f0``.

    Capabilities (class attributes with defaults, read by the drivers and the gradient
    strategies; a solver declares what it can do, nobody probes for it):
        time_symmetric: ``Phi_{-h}(Phi_h(y)) = y`` (``False`` by default), so that
            ``adjoint=Reversible()`` may re-create each state by stepping back
            (:class:`SymplecticSplitting` derives it from its coefficients).
        accepts_mass: The method solves ``M y' = f`` with a (singular) mass matrix
            (``solve(..., mass_matrix=M)``), reading ``M`` with :func:`mass_matrix`;
            ``False`` by default.
        has_interpolant: The class has its own dense output (:meth:`interpolate`), which
            events locate crossings on; else the drivers use a cubic Hermite polynomial.
            By default: whether the class overrides :meth:`interpolate`.

    Methods a subclass provides or overrides:
        init(f, t, y, args, f0=None): the state carried from step to step (an FSAL stage
            today; a Jacobian or an LU factorisation for an implicit method), any pytree of
            arrays with a shape fixed for the run; ``None`` by default. ``f0``, when given,
            is ``f(t, y, args)`` already evaluated by the driver: use it rather than
            evaluating ``f`` again.
        step(f, t, y, h, args, state): ``(y1, err, dense, state1)``, pure JAX on pytrees,
            ``h`` possibly traced. ``err`` is the solver's error information (``None`` for
            a fixed-step method), given back to ``error_ratio``; ``dense`` is opaque data
            for ``interpolate``, stored by the adaptive driver for ``SaveAt(ts=...)``;
            ``state1`` is the carried state after the step (an adaptive run keeps the old
            one when it rejects the step).
        error_ratio(y, y1, err, h, rtol, atol, norm=None): the scaled error of a step,
            accepted when at most one. The default takes ``err`` to be the local error
            estimate itself and returns its RMS norm
            ``sqrt(mean((err / (atol + rtol max(|y|, |y1|)))^2))`` (Hairer, Norsett and
            Wanner, *Solving ODEs I*, 2nd ed., 1993, II.4, eq. 4.11). ``norm`` is the
            :class:`PIDController`'s when it sets one (then passed as a keyword; a
            solver that takes no ``norm`` runs with the default controller's RMS norm).
        interpolate(f, args, t, y, h, y1, dense, theta): dense output ``y(t + theta h)``
            for ``theta`` in ``[0, 1]`` from a completed step (adaptive solvers).
        step_failed(err): whether the step's implicit solve failed (a Newton iteration
            that did not converge), ``False`` by default. The adaptive driver rejects such
            a step (``error_ratio`` should also return ``inf`` for it) and, if the step
            size then underflows, reports ``Result.NEWTON_FAILED``; the fixed-step driver
            reports ``Result.NEWTON_FAILED`` at the first failed step.
        num_fevals(n_steps, n_accepted): evaluations of ``f`` in ``n_steps`` step
            attempts of which ``n_accepted`` were accepted (``init`` excluded); by default
            ``n_steps * fevals_per_step``.
        state_fevals(state): evaluations counted in the final carried state, added to
            ``num_fevals`` by the adaptive driver (``0`` by default; ``BDF`` counts its
            Newton iterations there).

    Optional step control (a solver that picks its own step size and order, as
    :class:`BDF`; every other solver keeps the :class:`PIDController`'s formula):
        propose_step(h, ratio, accept, err, state, state1, rtol, atol, controller):
            ``None`` by default
            (the controller's PID factor, the carried state becoming ``state1`` if the
            step is accepted and staying ``state`` if not). A solver that defines it
            returns ``(factor, state_next)``: the next step is ``factor * h`` and the
            solver itself chooses the state carried on (``state`` before the attempt,
            ``state1`` from it; e.g. a new order, or a Jacobian kept after a rejection);
            ``controller`` is the :class:`PIDController` calling it (its ``safety``,
            ``factor_min`` and ``factor_max``).
            ``ratio`` is the driver's error ratio (``inf`` for a failed or non-finite step).
            The controller (:meth:`PIDController.propose`) clips the factor to its
            ``[factor_min, factor_max]`` and applies its ``dtmin``/``dtmax``.
            Such a solver needs tolerances, so it runs under the adaptive driver only.
        set_tolerances(state, rtol, atol): the state after ``init`` for a run at these
            tolerances (called once by the adaptive driver; the identity by default), for
            a solver whose ``step`` needs them (a Newton tolerance in units of the error).
        multistep: ``True`` when ``step`` depends on a history carried in the state (not
            only on ``(t, y)``): the reverse-mode replay of ``SaveAt(ts=...)`` then records
            each step's dense data rather than rebuilding it with ``step`` from ``init``,
            and such a solver's ``interpolate`` must not use its ``y1`` argument.

    Solvers are static arguments of the compiled cores, so they compare and hash by their
    class and their settings (:meth:`settings`: every instance attribute, which must be
    hashable); a solver configured in ``__init__`` therefore never reuses a function
    compiled for other settings. :class:`ExplicitRungeKutta` provides all of this from a
    :class:`ButcherTableau`. Adding a method: docs/extending.md.
    """

    order: int = 0
    adaptive: bool = False
    error_order: int | None = None
    symplectic: bool = False
    reference: str = ""
    fevals_per_step: int = 0
    init_fevals: int = 0
    multistep: bool = False
    propose_step = None  # optional step-control hook (see above); None: the PID formula
    time_symmetric: bool = False
    accepts_mass: bool = False
    has_interpolant: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "has_interpolant" not in cls.__dict__:
            cls.has_interpolant = cls.interpolate is not AbstractSolver.interpolate

    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> PyTree:
        return None

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        raise NotImplementedError

    def set_tolerances(self, state: PyTree, rtol, atol) -> PyTree:
        """The carried state for a run at ``rtol``/``atol`` (the identity by default)."""
        return state

    def error_ratio(self, y: PyTree, y1: PyTree, err: PyTree, h, rtol, atol,
                    norm: Callable[[PyTree], jax.Array] | None = None) -> jax.Array:
        """RMS norm (or ``norm``) of ``err / (atol + rtol max(|y|, |y1|))`` (Hairer et al.
        II.4)."""
        return rms_error_ratio(y, y1, err, rtol, atol, norm=norm)

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        raise NotImplementedError(f"{type(self).__name__} has no dense output")

    def step_failed(self, err: PyTree) -> jax.Array:
        """Whether the implicit solve of the step that returned ``err`` failed."""
        return jnp.asarray(False)

    def num_fevals(self, n_steps, n_accepted):
        return n_steps * self.fevals_per_step

    def state_fevals(self, state: PyTree):
        """Evaluations of ``f`` counted in the final carried state (``0`` by default),
        added by the adaptive driver to :meth:`num_fevals`: for a solver whose evaluations
        per step vary (Newton iterations)."""
        return 0


def projectors(m: jax.Array):
    """``(Q, B)`` of simlib/_dae.py's docstring for a mass matrix ``M`` (an ``(n,)``
    diagonal or ``(n, n)``): ``Q`` the projector onto ``M``'s left null space,
    ``B = U_r V_r^T``. A singular value counts as zero below ``n eps max(s)`` (numpy's
    ``matrix_rank``)."""
    m = lax.stop_gradient(m)  # the null spaces are held fixed under differentiation
    if m.ndim == 1:
        alg = (m == 0).astype(m.dtype)
        return jnp.diag(alg), jnp.diag(1 - alg)
    u, s, vt = jnp.linalg.svd(m)
    n = m.shape[0]
    tol = n * jnp.finfo(m.dtype).eps * jnp.max(s)
    zero = (s <= tol).astype(m.dtype)
    q = (u * zero) @ u.T
    b = (u * (1 - zero)) @ vt
    return q, b
