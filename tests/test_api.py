"""The public surface of simlib, pinned."""

from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl

PUBLIC = [
    "AbstractAdjoint",
    "AbstractSDESolver",
    "AbstractSolver",
    "BDF",
    "BandedLU",
    "DenseLU",
    "NewtonKrylov",
    "SparseLU",
    "BackwardEuler",
    "Bosh3",
    "Bounded",
    "BrownianPath",
    "ButcherTableau",
    "Checkpointed",
    "Direct",
    "Dopri5",
    "Dopri8",
    "Euler",
    "EulerMaruyama",
    "Event",
    "EventRecord",
    "ExplicitRungeKutta",
    "FitResult",
    "ForwardMode",
    "Heun",
    "Identity",
    "ImplicitMidpoint",
    "Kvaerno3",
    "Kvaerno5",
    "Leapfrog",
    "Midpoint",
    "Milstein",
    "PEFRL",
    "PIDController",
    "ProcessInfo",
    "Positive",
    "RK4",
    "Result",
    "Reversible",
    "Rodas5",
    "Rodas5P",
    "Rosenbrock23",
    "SRA1",
    "SaveAt",
    "SemiImplicitEuler",
    "Solution",
    "SolverError",
    "StochasticHeun",
    "SymplecticSplitting",
    "Tsit5",
    "VelocityVerlet",
    "Yoshida4",
    "ensemble",
    "ensemble_mesh",
    "fast_cpu_loops",
    "fit",
    "io",
    "init_distributed",
    "keep_compiled_programs",
    "least_squares",
    "log_density",
    "mse_loss",
    "multiple_shooting",
    "particles",
    "pde",
    "plot",
    "raise_solver_errors",
    "solve",
    "solve_ensemble",
    "split_keys",
    "systems",
    "trajectory_residuals",
]

# Concrete solvers and the orders the literature gives them.
SOLVER_ORDERS = {
    "Euler": 1,
    "Midpoint": 2,
    "Heun": 2,
    "RK4": 4,
    "Bosh3": 3,
    "Tsit5": 5,
    "Dopri5": 5,
    "Dopri8": 8,
    "SemiImplicitEuler": 1,
    "VelocityVerlet": 2,
    "Leapfrog": 2,
    "Yoshida4": 4,
    "PEFRL": 4,
    "Rosenbrock23": 2,
    "Rodas5": 5,
    "Rodas5P": 5,
    "BDF": 1,  # variable order 1 to 5; it starts at order 1
    "Kvaerno3": 3,
    "Kvaerno5": 5,
    "BackwardEuler": 1,
    "ImplicitMidpoint": 2,
    # SDE methods: ``order`` is the strong order
    "EulerMaruyama": 0.5,
    "Milstein": 1.0,
    "StochasticHeun": 0.5,
    "SRA1": 1.5,
}
ADAPTIVE = {"Heun", "Bosh3", "Tsit5", "Dopri5", "Dopri8", "Rosenbrock23",
            "Rodas5", "Rodas5P", "BDF", "Kvaerno3", "Kvaerno5", "StochasticHeun"}
SYMPLECTIC = {"SemiImplicitEuler", "VelocityVerlet", "Leapfrog", "Yoshida4", "PEFRL"}


def test_all_is_pinned():
    assert sorted(sl.__all__) == sorted(PUBLIC)
    assert len(set(sl.__all__)) == len(sl.__all__)
    for name in sl.__all__:
        assert hasattr(sl, name), name


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring(name):
    doc = inspect.getdoc(getattr(sl, name))
    assert doc and len(doc.strip()) > 10, name


def test_solver_classes_are_exactly_the_known_ones():
    concrete = {
        name for name in sl.__all__
        if inspect.isclass(getattr(sl, name))
        and issubclass(getattr(sl, name), sl.AbstractSolver)
        and name not in ("AbstractSolver", "AbstractSDESolver", "ExplicitRungeKutta",
                         "SymplecticSplitting")
    }
    assert concrete == set(SOLVER_ORDERS)


@pytest.mark.parametrize("name", sorted(SOLVER_ORDERS))
def test_solver_order_and_reference(name):
    cls = getattr(sl, name)
    solver = cls()
    assert isinstance(solver, sl.AbstractSolver)
    assert solver.order == SOLVER_ORDERS[name]
    assert isinstance(solver.reference, str) and len(solver.reference) > 15
    assert any(ch.isdigit() for ch in solver.reference)  # cites a year or a volume
    assert solver.adaptive == (name in ADAPTIVE)
    assert solver.symplectic == (name in SYMPLECTIC)
    # Solvers are stateless values: equal and hashable by type, usable as static args.
    assert solver == cls() and hash(solver) == hash(cls())
    if solver.settings():  # a configurable solver (BDF) shows its settings
        assert repr(solver).startswith(f"{cls.__name__}(")
        assert all(f"{k}=" in repr(solver) for k, _ in solver.settings())
    else:
        assert repr(solver) == f"{cls.__name__}()"


def test_result_codes():
    assert sl.Result.SUCCESSFUL == 0
    assert {r.name for r in sl.Result} == {
        "SUCCESSFUL", "MAX_STEPS_REACHED", "NONFINITE_STATE", "STEP_SIZE_TOO_SMALL",
        "NEIGHBOR_LIST_OVERFLOW", "NEIGHBOR_LIST_MISSED_PAIRS", "UNSTABLE_DYNAMICS",
        "NEWTON_FAILED", "EVENT_CAPACITY_EXCEEDED", "INVALID_SAVE_TIMES", "INVALID_TOLERANCE",
        "INVALID_TIME_ARGUMENT", "TIME_NOT_RESOLVED", "NONFINITE_Y0", "NONFINITE_ARGS",
        "BOX_TOO_SMALL", "INVALID_BOX", "CONSTRAINTS_NOT_CONVERGED",
        "INCONSISTENT_INITIAL_CONDITIONS", "INVALID_MASS_MATRIX", "SETTLE_FAILED",
    }
    assert issubclass(sl.SolverError, RuntimeError)


def test_solve_signature():
    params = inspect.signature(sl.solve).parameters
    assert list(params)[:4] == ["f", "y0", "t0", "t1"]
    for kw in ("solver", "dt", "rtol", "atol", "args", "saveat", "max_steps", "throw"):
        assert params[kw].kind is inspect.Parameter.KEYWORD_ONLY, kw
    assert params["throw"].default is True
    assert params["saveat"].default == sl.SaveAt(t1=True)
    assert set(sl.Solution._fields) == {"ts", "ys", "stats", "result"}


@pytest.mark.parametrize("kw", [{"solver": sl.Tsit5(), "rtol": 1e-8, "atol": 1e-10},
                                {"solver": sl.RK4(), "dt": 0.05}], ids=["adaptive", "fixed"])
def test_default_saveat_is_t1_only(kw):
    sol = sl.solve(lambda t, y, a: -y, jnp.array([1.0, 3.0]), 0.0, 1.5, **kw)
    assert sol.ts.shape == (1,)
    assert sol.ys.shape == (1, 2)
    assert float(sol.ts[0]) == 1.5
    np.testing.assert_allclose(np.asarray(sol.ys[0]), math.exp(-1.5) * np.array([1.0, 3.0]),
                               rtol=1e-6)
    assert int(sol.result) == 0
    assert set(sol.stats) == {"num_steps", "num_accepted", "num_rejected", "num_fevals",
                              "t_final"}


PARTICLES_PUBLIC = [
    "MIXING_RULES", "NVE", "BondEnergy", "Energy", "Integrator", "Langevin", "MinimizeResult",
    "NeighborList", "PairEnergy", "Space", "State", "Trajectory", "angular_momentum",
    "bond_energy", "coulomb", "forces", "free", "gravity", "harmonic", "kinetic_energy",
    "lattice", "lennard_jones", "maxwell_boltzmann", "mean_square_displacement", "minimize",
    "missing_pairs", "morse", "neighbor_list", "pair_energy", "pair_search", "periodic",
    "plummer", "pressure",
    "radial_distribution", "reallocate", "simulate", "temperature", "total_momentum", "wca",
    "Ewald", "EwaldParameters", "PME", "ewald", "ewald_parameters", "pme",
    "ShardedEnergy", "sharded", "CheckpointError", "checkpoint_info", "CellList", "cell_list",
    "AngleEnergy", "angle_energy", "dihedral_energy", "bond_angle", "dihedral_angle",
    "harmonic_angle", "periodic_torsion", "harmonic_improper",
    "Topology", "TopologyError", "read_lammps_data", "excluded_pairs", "diffusion_coefficient",
    "PairCorrection", "pair_correction", "pressure_tensor",
]
PARTICLES_PUBLIC += ["Bussi", "NoseHooverChain", "Rattle", "StochasticCellRescaling",
                     "molecular_pressure"]  # issue 27
PARTICLES_PUBLIC += ["Settle", "Water", "spce_energy", "spce_water"]  # issue 27: water
PARTICLES_PUBLIC += ["born_mayer_huggins", "tosi_fumi_nacl"]  # issue 27: molten salt
PARTICLES_PUBLIC += ["block_average", "peak_position"]  # issue 27: analysis observables
PARTICLES_PUBLIC += ["Carry", "Model"]  # issue 25: simulate's parts, for a loop of one's own


def test_particles_all_is_pinned():
    from simlib import particles as sp

    assert sl.particles is sp
    assert sorted(sp.__all__) == sorted(PARTICLES_PUBLIC)
    for name in sp.__all__:
        assert inspect.getdoc(getattr(sp, name)), name


def test_simulate_signature():
    from simlib import particles as sp

    params = inspect.signature(sp.simulate).parameters
    assert list(params)[:3] == ["energy", "state", "params"]
    for kw in ("space", "dt", "n_steps", "integrator", "save_every", "neighbors", "key",
               "throw", "adjoint"):
        assert params[kw].kind is inspect.Parameter.KEYWORD_ONLY, kw


def test_import_is_lazy_and_every_public_name_resolves():
    """``import simlib`` loads neither JAX nor any submodule but ``_version``; ``sl.solve``
    loads the ODE core without the particle engine, files or plotting; ``from simlib.fit
    import ...`` before
    ``sl.fit`` leaves ``sl.fit`` the function; every name in ``__all__`` resolves, and each
    lazy entry is the object its module defines (a fresh process: this one has loaded all)."""
    import subprocess
    import sys

    script = (
        "import sys, importlib, types\n"
        "import simlib as sl\n"
        "assert 'jax' not in sys.modules, 'jax'\n"
        "assert [m for m in sys.modules if m.startswith('simlib.')] == ['simlib._version']\n"
        "sl.solve\n"
        "loaded = {m for m in sys.modules if m.startswith('simlib')}\n"
        "for heavy in ('simlib.particles', 'simlib.io', 'simlib.plot', 'simlib.fit'):\n"
        "    assert heavy not in loaded, heavy\n"
        "from simlib.fit import FitResult\n"
        "assert callable(sl.fit) and not isinstance(sl.fit, types.ModuleType)\n"
        "for name in sl.__all__:\n"
        "    getattr(sl, name)\n"
        "for name, (module, attr) in sl._LAZY.items():\n"
        "    obj = importlib.import_module(module, 'simlib')\n"
        "    assert getattr(sl, name) is (obj if attr is None else getattr(obj, attr)), name\n"
        "assert set(sl._LAZY) == set(sl.__all__), set(sl._LAZY) ^ set(sl.__all__)\n"
        "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.stdout.strip() == "ok", run.stderr[-2000:]


def test_the_lazy_table_is_the_type_checking_imports():
    """``simlib/__init__.py`` names each public object twice: in ``if TYPE_CHECKING:``
    imports (for type checkers and the API reference) and in ``_LAZY`` (what is loaded);
    the two must agree, name for name and module for module."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(sl.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    imported = {}
    for node in block.body:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            imported[alias.asname or alias.name] = ((module, alias.name) if node.module
                                                    else ("." + alias.name, None))
    assert imported == {k: v for k, v in sl._LAZY.items() if k != "plot"}
