"""Which mechanism ran, not only which value came out (issue 22).

Values alone cannot tell the strategies apart: ``Checkpointed()`` without its
``jax.checkpoint``, or ``ForwardMode()`` running reverse mode, gives the same gradient. So
these tests read what the compiled or traced computation contains: the temporaries XLA
allocates (``memory_analysis()``) and whether the traced gradient has a reversed
(transposed) loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib.systems import lotka_volterra

P0 = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([10.0, 5.0])


def lv_final(p, adjoint, kw):
    sol = sl.solve(lotka_volterra, Y0, 0.0, 1.0, args=tuple(p), adjoint=adjoint, **kw)
    return jnp.sum(sol.ys ** 2)


def temp_bytes(fn, *args) -> int:
    """Bytes of temporaries XLA allocates for ``jit(fn)(*args)`` (buffers live at once)."""
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_checkpointed_stores_segments_not_steps():
    """A 1,000-step RK4 gradient: Direct() keeps every step's residuals (measured 138 KB of
    temporaries), Checkpointed() only the segment starts and one segment's residuals
    (8 KB). With its jax.checkpoint removed, Checkpointed() allocated 146 KB."""
    kw = dict(solver=sl.RK4(), dt=1e-3)
    grad = jax.grad(lv_final)
    direct = temp_bytes(lambda p: grad(p, sl.Direct(), kw), P0)
    ckpt = temp_bytes(lambda p: grad(p, sl.Checkpointed(), kw), P0)
    assert direct > 10 * ckpt, (direct, ckpt)


def _has_reversed_loop(jaxpr) -> bool:
    """Whether a jaxpr (or one nested in it) has a ``scan`` run in reverse: the transpose
    of a loop, which reverse mode builds and forward mode never does."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan" and eqn.params.get("reverse"):
            return True
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and _has_reversed_loop(inner):
                    return True
    return False


CASES = {"fixed": dict(solver=sl.RK4(), dt=0.05),
         "adaptive": dict(solver=sl.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=64)}


@pytest.mark.parametrize("case", ["fixed", pytest.param("adaptive", marks=pytest.mark.slow)])
def test_forward_mode_transposes_no_loop(case):
    """The traced gradient (nothing is compiled): ForwardMode(), and the default with 4
    differentiated components, push tangents forward; Direct() transposes the loop (the
    control that shows the check can see reverse mode)."""
    kw = CASES[case]

    def traced(adjoint):
        return jax.make_jaxpr(jax.grad(lambda p: lv_final(p, adjoint, kw)))(P0).jaxpr

    assert _has_reversed_loop(traced(sl.Direct()))
    assert not _has_reversed_loop(traced(sl.ForwardMode()))
    assert not _has_reversed_loop(traced(None))


# ---- transformations: what works is checked against finite differences, the rest raises
# at trace time with a message that says what to use
def test_forward_mode_fixed_step_supports_every_transformation():
    """ForwardMode() on a fixed-step run is a custom JVP: jacfwd and hessian go through
    (they raised, or died in XLA, while it was a custom VJP)."""
    kw = dict(solver=sl.RK4(), dt=0.05)

    def loss(p):
        return lv_final(p, sl.ForwardMode(), kw)

    def direct(p):
        return lv_final(p, sl.Direct(), kw)

    # Direct() is JAX's own autodiff through lax.scan; its derivatives, the hessian
    # included, are checked against central differences in the slow set
    # (tests/test_adjoint_table.py::test_direct_matches_finite_differences)
    np.testing.assert_allclose(jax.jacfwd(loss)(P0), jax.grad(direct)(P0), rtol=1e-10)
    np.testing.assert_allclose(jax.hessian(loss)(P0), jax.hessian(direct)(P0), rtol=1e-9)


@pytest.mark.parametrize("adjoint", [
    None, pytest.param(sl.Direct(), marks=pytest.mark.slow),
    pytest.param(sl.ForwardMode(), marks=pytest.mark.slow)], ids=["default", "direct", "forward"])
def test_adaptive_second_derivatives_are_refused_by_name(adjoint):
    """The adaptive loop's second derivative came out NaN (jacrev(jacrev(...)) with
    Direct()) or died in XLA (hessian with the default or ForwardMode()): refused at trace
    time, naming what works."""
    kw = CASES["adaptive"]
    with pytest.raises(TypeError, match="second derivatives.*fixed-step run"):
        jax.jacrev(jax.jacrev(lambda p: lv_final(p, adjoint, kw)))(P0)


@pytest.mark.parametrize("solver_cls", [sl.Rodas5P, sl.Rosenbrock23, sl.Kvaerno5, sl.BDF,
                                        sl.BackwardEuler])
def test_jac_setting_chooses_the_jacobian_function_that_runs(solver_cls, monkeypatch):
    """jac="rev" must build J with jax.jacrev and jac="fwd" with jax.jacfwd: both give the
    same J (and the same steps), so the test spies on which one is called while the solve
    is traced. Run against jac="rev" mapped to jacfwd in _linalg's dense solver, it fails
    (jacrev never called)."""
    calls = {"jacfwd": 0, "jacrev": 0}
    real = {"jacfwd": jax.jacfwd, "jacrev": jax.jacrev}

    def spy(name):
        def wrapped(*a, **k):
            calls[name] += 1
            return real[name](*a, **k)
        return wrapped

    monkeypatch.setattr(jax, "jacfwd", spy("jacfwd"))
    monkeypatch.setattr(jax, "jacrev", spy("jacrev"))

    def robertson(t, y, args):
        k1, k2, k3 = args
        return jnp.array([-k1 * y[0] + k3 * y[1] * y[2],
                          k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2, k2 * y[1] ** 2])

    y0 = jnp.array([1.0, 0.0, 0.0])
    kw = dict(args=(0.04, 3e7, 1e4))
    kw.update(dict(dt=1e-3) if solver_cls is sl.BackwardEuler else dict(rtol=1e-6, atol=1e-10))
    for jac, used, unused in (("rev", "jacrev", "jacfwd"), ("fwd", "jacfwd", "jacrev")):
        calls.update(jacfwd=0, jacrev=0)
        solver = solver_cls(jac=jac)
        jax.make_jaxpr(lambda y, solver=solver: sl.solve(robertson, y, 0.0, 0.1, solver=solver,
                                                         **kw).ys)(y0)
        assert calls[used] > 0 and calls[unused] == 0, (jac, calls)
