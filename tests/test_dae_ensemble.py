"""``solve_ensemble`` with a mass matrix (DAEs ``M y' = f``): every member equal to
``jax.vmap(solve)`` with the same ``M`` and to a reference outside simlib (the RC
circuit's closed form from scipy.linalg.expm, Robertson against scipy's Radau on its ODE
form); a refused member reported by its Result code alone; bad arguments named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_dae import (
    PARAMS,
    T1,
    X0,
    circuit,
    circuit_exact,
    circuit_mass,
    consistent_y0,
    robertson_dae,
    robertson_reference,  # noqa: F401 - a module-scoped fixture
)

import simlib as sl

R3S = np.array([0.3, 0.5, 1.0, 2.0])
TS = np.array([0.1, 0.35, T1])
M = circuit_mass(jnp.asarray(PARAMS))  # C1, C2 shared; R3 per member


def _params():
    return jnp.asarray(np.stack([np.r_[PARAMS[:2], r3, PARAMS[3:]] for r3 in R3S]))


def _exact(i):
    p = PARAMS.copy()
    p[2] = R3S[i]
    return np.stack([circuit_exact(t, p) for t in TS])


def _y0s(v3):
    """The members' starts, all with node 3 at ``v3`` (inconsistent unless computed)."""
    return jnp.asarray(np.tile([X0[0], X0[1], 0.0], (len(R3S), 1))).at[:, 2].set(v3)


def test_an_inconsistent_member_is_reported_without_spoiling_the_others():
    """initialize='check', per-member R3: member 1 starts off Kirchhoff's law at node 3;
    with throw=False it alone has INCONSISTENT_INITIAL_CONDITIONS and NaN outputs and
    never runs, the others match expm; with throw=True a SolverError names it."""
    v3 = np.array([float(consistent_y0(p)[2]) for p in np.asarray(_params())])
    v3[1] = 9.0
    kw = dict(solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10, mass_matrix=M, min_bucket=4)
    sol = sl.solve_ensemble(circuit, _y0s(v3), 0.0, T1, args=_params(), args_axes=0,
                            throw=False, **kw)
    codes = np.asarray(sol.result)
    assert codes[1] == sl.Result.INCONSISTENT_INITIAL_CONDITIONS
    assert np.all(np.isnan(np.asarray(sol.ys[1])))
    assert int(sol.stats["num_steps"][1]) == 0  # never ran
    for i in (0, 2, 3):
        assert codes[i] == 0
        np.testing.assert_allclose(np.asarray(sol.ys[i, -1]), _exact(i)[-1], rtol=1e-7)
    with pytest.raises(sl.SolverError, match="member 1 .*y0 is inconsistent") as err:
        sl.solve_ensemble(circuit, _y0s(v3), 0.0, T1, args=_params(), args_axes=0, **kw)
    assert err.value.result == sl.Result.INCONSISTENT_INITIAL_CONDITIONS
    assert err.value.member == 1


@pytest.mark.slow
def test_members_equal_vmap_of_solve_and_the_closed_form():
    """initialize='consistent' (node 3 computed per member), saved times, small chunks
    and buckets: each member's steps and values equal vmap(solve)'s and expm's; with an
    inconsistent member under 'check', the codes equal vmap(solve)'s."""
    kw = dict(solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10, saveat=sl.SaveAt(ts=TS),
              mass_matrix=M, initialize="consistent")
    y0s = _y0s(jnp.zeros(len(R3S)))
    ens = sl.solve_ensemble(circuit, y0s, 0.0, T1, args=_params(), args_axes=0,
                            min_bucket=1, chunk_steps=8, **kw)
    vm = jax.vmap(lambda y, p: sl.solve(circuit, y, 0.0, T1, args=p, **kw))(y0s, _params())
    assert np.all(np.asarray(ens.result) == 0)
    np.testing.assert_array_equal(np.asarray(ens.stats["num_steps"]),
                                  np.asarray(vm.stats["num_steps"]))
    np.testing.assert_allclose(np.asarray(ens.ys), np.asarray(vm.ys), rtol=1e-12, atol=1e-14)
    for i in range(len(R3S)):  # the differential start kept, node 3 solved: expm's values
        np.testing.assert_allclose(np.asarray(ens.ys[i]), _exact(i), rtol=1e-7)
    kw["initialize"] = "check"
    y0s = y0s.at[:, 2].set(jnp.array([float(consistent_y0(p)[2]) for p in _params()]))
    y0s = y0s.at[2, 2].set(-3.0)
    ens = sl.solve_ensemble(circuit, y0s, 0.0, T1, args=_params(), args_axes=0,
                            throw=False, **kw)
    vm = jax.vmap(lambda y, p: sl.solve(circuit, y, 0.0, T1, args=p, throw=False, **kw))(
        y0s, _params())
    np.testing.assert_array_equal(np.asarray(ens.result), np.asarray(vm.result))
    assert int(ens.result[2]) == sl.Result.INCONSISTENT_INITIAL_CONDITIONS
    np.testing.assert_array_equal(np.isnan(np.asarray(ens.ys)), np.isnan(np.asarray(vm.ys)))
    good = np.array([0, 1, 3])
    np.testing.assert_allclose(np.asarray(ens.ys)[good], np.asarray(vm.ys)[good],
                               rtol=1e-12, atol=1e-14)


def test_bad_arguments_are_refused_naming_them():
    y0s, p = _y0s(0.0), jnp.asarray(PARAMS)
    kw = dict(rtol=1e-6, args=p)
    with pytest.raises(ValueError, match="mass_matrix .*Tsit5 does not"):
        sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Tsit5(), mass_matrix=M, **kw)
    with pytest.raises(ValueError, match=r"mass_matrix must be an \(3,\) diagonal"):
        sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Rodas5P(),
                          mass_matrix=jnp.ones((4, 3)), **kw)
    with pytest.raises(ValueError, match="mass_matrix must be finite"):
        sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Rodas5P(),
                          mass_matrix=jnp.array([1.0, jnp.nan, 0.0]), **kw)
    with pytest.raises(ValueError, match="initialize must be one of"):
        sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Rodas5P(), mass_matrix=M,
                          initialize="yes", **kw)
    with pytest.raises(ValueError, match="applies to a DAE"):
        sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Rodas5P(),
                          initialize="consistent", **kw)
    with pytest.raises(TypeError, match="cannot be traced"):
        jax.jit(lambda m: sl.solve_ensemble(circuit, y0s, 0.0, T1, solver=sl.Rodas5P(),
                                            mass_matrix=m, **kw).ys)(M)


@pytest.mark.slow
@pytest.mark.parametrize("solver", [sl.BDF(), sl.Kvaerno5(), sl.Rodas5()],
                         ids=["BDF", "Kvaerno5", "Rodas5"])
def test_robertson_ensemble_matches_vmap_and_scipy_radau(
        solver, robertson_reference):  # noqa: F811
    """Robertson as a DAE (M = diag(1, 1, 0)) over uneven spans (1e5 ... 1e11), a dense
    (3, 3) M: each member equals vmap(solve) and scipy's Radau on the ODE form."""
    ts, ref = robertson_reference
    t1s = np.array([1e5, 1e7, 1e9, 1e11])
    rtol, atol = 1e-6, 1e-12
    m = jnp.diag(jnp.array([1.0, 1.0, 0.0]))
    y0s = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (len(t1s), 1))
    save = ts[:12]  # up to 1e5: inside every member's span
    kw = dict(solver=solver, rtol=rtol, atol=atol, mass_matrix=m, saveat=sl.SaveAt(ts=save),
              max_steps=100_000)
    ens = sl.solve_ensemble(robertson_dae, y0s, 0.0, jnp.asarray(t1s), min_bucket=1, **kw)
    vm = jax.vmap(lambda y, t1: sl.solve(robertson_dae, y, 0.0, t1, **kw))(
        y0s, jnp.asarray(t1s))
    np.testing.assert_array_equal(np.asarray(ens.stats["num_steps"]),
                                  np.asarray(vm.stats["num_steps"]))
    np.testing.assert_allclose(np.asarray(ens.ys), np.asarray(vm.ys), rtol=1e-10,
                               atol=1e-20)
    err = np.abs(np.asarray(ens.ys) - ref[None, :12]) / (atol / rtol + np.abs(ref[:12]))
    assert err.max() < 20 * rtol, err.max() / rtol


def _member_params():
    """Four members with their own R3, C1 and C2 (so each has its own M)."""
    return jnp.asarray(np.stack([np.r_[PARAMS[:2], r3, 0.05 * (i + 1), 0.4 / (i + 1),
                                       PARAMS[5]] for i, r3 in enumerate(R3S)]))


@pytest.mark.slow
@pytest.mark.parametrize("dense", [False, True], ids=["diagonal", "dense"])
def test_a_mass_matrix_per_member_equals_each_members_own_solve_and_expm(dense):
    """mass_axes=0: M = diag(C1, C2, 0) per member ((4, 3) diagonals, or (4, 3, 3)
    matrices), node 3 computed per member (initialize='consistent', from v3 = 0): each
    member equals its own solve with its own M to 1e-12, and expm's closed form."""
    p = _member_params()
    ms = jax.vmap(circuit_mass)(p)
    if dense:
        ms = jax.vmap(jnp.diag)(ms)
    kw = dict(solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10, saveat=sl.SaveAt(ts=TS),
              initialize="consistent")
    y0s = _y0s(0.0)
    ens = sl.solve_ensemble(circuit, y0s, 0.0, T1, args=p, args_axes=0, mass_matrix=ms,
                            mass_axes=0, min_bucket=4, **kw)
    assert np.all(np.asarray(ens.result) == 0)
    for i in range(len(R3S)):
        one = sl.solve(circuit, y0s[i], 0.0, T1, args=p[i], mass_matrix=ms[i], **kw)
        assert int(ens.stats["num_steps"][i]) == int(one.stats["num_steps"])
        np.testing.assert_allclose(np.asarray(ens.ys[i]), np.asarray(one.ys), rtol=1e-12,
                                   atol=1e-14)
        np.testing.assert_allclose(np.asarray(ens.ys[i]),
                                   np.stack([circuit_exact(t, p[i]) for t in TS]), rtol=1e-7)
    # the members differ (their own C1, C2): a shared M would not give these
    assert np.ptp(np.asarray(ens.ys[:, -1, 0])) > 1e-2


def test_a_per_member_mass_matrix_rosenbrock23_default_suite():
    """The default suite's cheap case of the test above: Rosenbrock23, t1 only, the
    shipped (3,) diagonals per member: each member equals its own solve to 1e-12 and
    expm's closed form within 100 rtol (its measured error on this circuit: 44 rtol)."""
    p = _member_params()
    ms = jax.vmap(circuit_mass)(p)
    rtol = 1e-6
    kw = dict(solver=sl.Rosenbrock23(), rtol=rtol, atol=1e-8, initialize="consistent")
    y0s = _y0s(0.0)
    ens = sl.solve_ensemble(circuit, y0s, 0.0, T1, args=p, args_axes=0, mass_matrix=ms,
                            mass_axes=0, min_bucket=4, **kw)
    assert np.all(np.asarray(ens.result) == 0)
    one = jax.jit(lambda y, a, m: sl.solve(circuit, y, 0.0, T1, args=a, mass_matrix=m,
                                            **kw).ys[-1])
    for i in range(len(R3S)):
        np.testing.assert_allclose(np.asarray(ens.ys[i, -1]), np.asarray(one(y0s[i], p[i],
                                                                           ms[i])),
                                   rtol=1e-12, atol=1e-14)
        exact = circuit_exact(T1, p[i])
        np.testing.assert_allclose(np.asarray(ens.ys[i, -1]), exact, rtol=100 * rtol)
    assert np.ptp(np.asarray(ens.ys[:, -1, 0])) > 1e-2


def test_a_per_member_mass_matrix_of_the_wrong_shape_is_refused_naming_it():
    p = _member_params()
    kw = dict(solver=sl.Rodas5P(), rtol=1e-6, args=p, args_axes=0)
    ms = jax.vmap(circuit_mass)(p)
    with pytest.raises(ValueError, match=r"mass_matrix with mass_axes=0 .* \(4, 3\) stack "
                                         r".*got shape \(3,\)"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_matrix=ms[0], mass_axes=0, **kw)
    with pytest.raises(ValueError, match=r"mass_matrix with mass_axes=0 .*got shape \(3, 3\)"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_matrix=ms[:3], mass_axes=0,
                          **kw)
    with pytest.raises(ValueError, match=r"mass_matrix must be an \(3,\) diagonal .*got "
                                         r"shape \(4, 3\)"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_matrix=ms, **kw)
    with pytest.raises(ValueError, match="mass_axes must be None .* or 0"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_matrix=ms, mass_axes=1, **kw)
    with pytest.raises(ValueError, match="mass_axes=0 applies to a DAE"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_axes=0, **kw)
    with pytest.raises(ValueError, match="mass_matrix must be finite"):
        sl.solve_ensemble(circuit, _y0s(0.0), 0.0, T1, mass_matrix=ms.at[2, 1].set(jnp.inf),
                          mass_axes=0, **kw)
