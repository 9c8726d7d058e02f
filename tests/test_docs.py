"""The documentation is true: its code runs, its API reference is complete, its tables current.

- docs/extending.md: the page's ``python`` code blocks are executed in order in one
  namespace (so the page cannot drift from what is tested), then each extension is
  checked against something outside simlib: the SSPRK3 solver against the closed form of
  y' = cos(t) y and its measured order, the Yukawa potential's forces against central
  differences of its energy and its energy against a numpy pair sum, the semi-implicit
  Euler integrator against a numpy loop of the same scheme and its order against the exact
  motion of a spring, the smooth-limiter controller against the closed form of y' = -a y
  and its gradient, and that its own factor ran (another step sequence, no factor above
  1 + pi/2).
- Every other page of docs/: its ``python`` blocks run in order in one namespace (a block
  right after a ``<!-- not run ... -->`` line is skipped); where a block is followed by a
  ``text title="Output"`` block, what it prints must be exactly that. The heavy pages run
  in the slow set.
- The ``>>>`` examples in simlib's docstrings run as doctests (float64, as everywhere in
  the suite).
- The API reference (docs/api/*.md, mkdocstrings ``::: name`` lines) documents every name
  in the ``__all__`` of simlib and of each public subpackage; every page of docs/ is in
  mkdocs.yml's nav; the README's comparison table is what docs/_tables.py renders from
  benchmarks/results now, and its links to docs/ resolve.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import pkgutil
import re
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import particles as sp

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = DOCS / "extending.md"


@pytest.fixture(scope="module")
def page():
    """The namespace after running every ``python`` block of the guide."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 4, "docs/extending.md should have four python examples"
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, str(GUIDE), "exec"), ns)  # noqa: S102 - our own docs
    return ns


# -- the solver ----------------------------------------------------------------------------


def test_ssprk3_matches_closed_form_and_has_order_three(page):
    errors = np.asarray(page["errors"])  # the page's errors at n = 20, 40, 80 steps
    orders = np.log2(errors[:-1] / errors[1:])
    np.testing.assert_allclose(orders, 3.0, atol=0.1)
    # Independently of the page's loop: a fine run against exp(sin t) at every save time.
    ts = np.linspace(0.0, 2.0, 11)
    sol = sl.solve(page["f"], jnp.array([1.0]), 0.0, 2.0, solver=page["SSPRK3"](),
                   dt=1e-3, saveat=sl.SaveAt(ts=ts))
    np.testing.assert_allclose(np.asarray(sol.ys[:, 0]), np.exp(np.sin(ts)), rtol=1e-9)
    assert page["SSPRK3"]().order == 3 and not page["SSPRK3"]().adaptive


def test_ssprk3_one_step_is_the_shu_osher_form(page):
    """One step of the tableau equals the Shu-Osher convex-combination form, written out."""
    def f(t, y):
        return np.cos(t) * y + t

    t, y, h = 0.3, 1.7, 0.1
    u1 = y + h * f(t, y)
    u2 = 0.75 * y + 0.25 * (u1 + h * f(t + h, u1))
    want = y / 3 + 2 / 3 * (u2 + h * f(t + h / 2, u2))
    sol = sl.solve(lambda t, y, a: jnp.cos(t) * y + t, jnp.array([y]), t, t + h,
                   solver=page["SSPRK3"](), dt=h)
    np.testing.assert_allclose(float(sol.ys[-1, 0]), want, rtol=1e-14)


# -- the pair potential --------------------------------------------------------------------


def test_yukawa_forces_match_finite_differences(page):
    energy, x, params = page["energy"], page["positions"], page["params"]
    forces = np.asarray(page["forces"])
    h = 1e-5
    rng = np.random.default_rng(0)
    for i, k in zip(rng.integers(0, x.shape[0], 6), rng.integers(0, 3, 6), strict=True):
        e = jnp.zeros_like(x).at[i, k].set(h)
        fd = -(float(energy(x + e, params)) - float(energy(x - e, params))) / (2 * h)
        np.testing.assert_allclose(forces[i, k], fd, rtol=1e-6, atol=1e-8)


def test_yukawa_energy_matches_numpy_pair_sum(page):
    x, box, params = np.asarray(page["positions"]), float(page["box"]), page["params"]
    a, kappa, r_cut = params["A"], params["kappa"], 2.5
    d = x[:, None, :] - x[None, :, :]
    d -= box * np.round(d / box)
    r = np.sqrt(np.sum(d * d, axis=-1))
    iu = np.triu_indices(len(x), 1)
    r = r[iu][r[iu] < r_cut]
    want = np.sum(a * np.exp(-kappa * r) / r - a * np.exp(-kappa * r_cut) / r_cut)
    np.testing.assert_allclose(float(page["u"]), want, rtol=1e-12)


# -- the integrator ------------------------------------------------------------------------


def _numpy_symplectic_euler(x, v, k, r0, m, dt, n):
    for _ in range(n):
        d = x[1] - x[0]
        r = np.linalg.norm(d)
        f1 = -k * (r - r0) * d / r
        v = v + dt * np.stack([-f1, f1]) / m
        x = x + dt * v
    return x


def test_semi_implicit_euler_matches_numpy_loop(page):
    got = np.asarray(page["traj"].positions[-1])
    want = _numpy_symplectic_euler(np.array([[0.0, 0, 0], [1.2, 0, 0]]), np.zeros((2, 3)),
                                   1.0, 1.0, 1.0, 1e-3, 2000)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_semi_implicit_euler_is_first_order(page):
    integrator, spring = page["SemiImplicitEuler"](), page["spring"]
    x0 = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    t1 = 2.0
    exact = 1 + 0.2 * np.cos(np.sqrt(2.0) * t1)
    errs = []
    for n in (500, 1000, 2000):
        traj = sp.simulate(spring, sp.State(x0, jnp.zeros_like(x0), 1.0),
                           dict(k=1.0, r0=1.0), space=sp.free(), dt=t1 / n, n_steps=n,
                           integrator=integrator)
        sep = float(traj.positions[-1, 1, 0] - traj.positions[-1, 0, 0])
        errs.append(abs(sep - exact))
    orders = np.log2(np.asarray(errs[:-1]) / np.asarray(errs[1:]))
    np.testing.assert_allclose(orders, 1.0, atol=0.1)


def test_custom_integrator_is_differentiable(page):
    """Gradients flow through the user's step: d(separation)/dk against central differences."""
    integrator, spring = page["SemiImplicitEuler"](), page["spring"]
    x0 = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])

    def sep(k):
        traj = sp.simulate(spring, sp.State(x0, jnp.zeros_like(x0), 1.0), dict(k=k, r0=1.0),
                           space=sp.free(), dt=1e-2, n_steps=100, integrator=integrator)
        return traj.positions[-1, 1, 0] - traj.positions[-1, 0, 0]

    h = 1e-6
    fd = (float(sep(1.0 + h)) - float(sep(1.0 - h))) / (2 * h)
    np.testing.assert_allclose(float(jax.grad(sep)(1.0)), fd, rtol=1e-6)


# -- the controller ------------------------------------------------------------------------


def test_smooth_limiter_controller_is_accurate_and_differentiable(page):
    sol = page["smooth"]
    np.testing.assert_allclose(float(sol.ys[-1, 0]), np.exp(-10.0), rtol=1e-7)

    def y1(a):
        return sl.solve(page["decay"], jnp.ones(1), 0.0, 1.0, args=a, solver=sl.Tsit5(),
                        rtol=1e-10, atol=1e-12, controller=page["SmoothLimiter"]()).ys[-1, 0]

    np.testing.assert_allclose(float(jax.grad(y1)(1.5)), -np.exp(-1.5), rtol=1e-7)


def test_smooth_limiter_is_what_ran(page):
    """Its step sequence is not the default's, and no accepted step grew by more than the
    limiter's bound 1 + pi/2 (the default allows 10)."""
    kw = dict(args=1.0, solver=sl.Tsit5(), rtol=1e-8, atol=1e-10,
              saveat=sl.SaveAt(steps=True))
    ours = sl.solve(page["decay"], jnp.ones(1), 0.0, 10.0,
                    controller=page["SmoothLimiter"](), **kw)
    default = sl.solve(page["decay"], jnp.ones(1), 0.0, 10.0, **kw)
    assert int(ours.stats["num_steps"]) != int(default.stats["num_steps"])
    ts = np.asarray(ours.ts)
    h = np.diff(ts[np.isfinite(ts)])
    assert np.all(h[1:] / h[:-1] <= 1 + np.pi / 2 + 1e-9)


# -- every guide's code runs ---------------------------------------------------------------

FENCE = re.compile(r'(<!-- not run[^\n]*-->\n)?```(python|text title="Output")\n(.*?)```', re.S)
# pages run in the default suite (a few seconds each); every other page runs in the slow set
FAST_PAGES = {"common-errors.md", "systems.md", "neural-ode.md"}
# pages with their own tests: extending.md above, long-time.md below, stiff.md in
# tests/test_stiff.py (test_stiff_guide_runs_as_written), events.md in test_events.py,
# files.md in test_io.py, results.md in test_results.py, plotting.md in test_plot.py,
# ensembles.md in test_sharding.py (on 8 devices), sde.md in test_sde.py
OWN_TESTS = {"extending.md", "long-time.md", "stiff.md", "events.md", "files.md",
             "results.md", "plotting.md", "ensembles.md", "sde.md"}


def run_page(path: Path, ns: dict | None = None) -> list[tuple[str, str]]:
    """Run a page's python blocks in order, in one namespace (``ns`` if given), in the
    current directory.

    Returns ``(printed, expected)`` for every block followed by an Output block.
    """
    import matplotlib

    matplotlib.use("Agg")
    ns = {"__name__": "__docs__"} if ns is None else ns
    checks, printed = [], None
    for skip, kind, body in FENCE.findall(path.read_text()):
        if kind != "python":
            checks.append((printed, body))
            continue
        if skip:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, str(path), "exec"), ns)  # noqa: S102 - our own docs
        printed = out.getvalue()
    import matplotlib.pyplot as plt

    plt.close("all")
    return checks


def _page_params():
    for path in sorted(DOCS.glob("*.md")):
        if path.name in OWN_TESTS or "```python" not in path.read_text():
            continue
        marks = [] if path.name in FAST_PAGES else [pytest.mark.slow]
        yield pytest.param(path, id=path.name, marks=marks)


@pytest.mark.parametrize("path", list(_page_params()))
def test_page_code_runs(path, tmp_path, monkeypatch):
    if path.name == "common-errors.md":
        if jax.default_backend() != "cpu":
            pytest.skip("the page shows CPU messages (fast_cpu_loops, float64 step counts)")
        monkeypatch.delenv("XLA_FLAGS", raising=False)  # its fast_cpu_loops block raises
    monkeypatch.chdir(tmp_path)  # pages that save figures write them here
    for printed, expected in run_page(path):
        assert printed == expected, (
            f"{path.name}: a block printed\n{printed}\nbut the page shows\n{expected}")


@pytest.mark.slow
def test_long_time_page_claims(tmp_path, monkeypatch):
    """docs/long-time.md's statements, against the closed-form Kepler orbit and energy."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    run_page(DOCS / "long-time.md", ns)
    energy, position = ns["energy_error"], ns["position_error"]
    q, p = ns["y0"]
    e0 = 0.5 * float(jnp.sum(p**2)) - 1.0 / float(jnp.linalg.norm(q))  # H, mu = 1
    np.testing.assert_allclose(float(ns["E0"]), e0, rtol=1e-15)
    ratio = {k: float(v[-200:].max() / v[:200].max()) for k, v in energy.items()}
    assert 0.8 < ratio["VelocityVerlet"] < 1.25 and 0.8 < ratio["PEFRL"] < 1.25, ratio
    assert ratio["RK4"] > 5, ratio                      # linear drift: about 10x
    assert float(energy["RK4"][-1]) > float(energy["VelocityVerlet"][-200:].max())
    final = {k: float(v[-1]) for k, v in position.items()}
    assert final["PEFRL"] < 0.05 and final["PEFRL"] < 0.1 * min(
        final["RK4"], final["VelocityVerlet"]), final


def test_getting_started_has_its_five_steps():
    text = (DOCS / "getting-started.md").read_text()
    heads = re.findall(r"^## (.+)$", text, flags=re.M)
    assert heads == ["Install", "A first solve", "A first plot", "A first gradient",
                     "A first fit", "Where to go next"]


def test_common_errors_covers_every_result_code():
    text = (DOCS / "common-errors.md").read_text()
    missing = [r.name for r in sl.Result if f"`{r.name}`" not in text]
    assert not missing, f"docs/common-errors.md: no entry for sl.Result.{missing}"


# -- docstring examples --------------------------------------------------------------------

def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {}
    modules = [sl] + [importlib.import_module(m.name)
                      for m in pkgutil.walk_packages(sl.__path__, "simlib.")]
    for module in modules:
        for test in finder.find(module):
            if test.examples:
                found.setdefault(test.name, test)
    return found


DOCTESTS = _doctests()
# doctests that compile a particle simulation (about 8 s) or a neighbour-list update
# (3-4 s): slow set
SLOW_DOCTESTS = {"simlib.particles", "simlib.particles._simulate.simulate",
                 "simlib.particles._neighbors.neighbor_list",
                 "simlib.particles._electrostatics.ewald", "simlib.particles._electrostatics.pme"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.slow] if n in SLOW_DOCTESTS else [])
    for n in sorted(DOCTESTS)])
def test_docstring_examples(name):
    test = DOCTESTS[name]
    test.globs = dict(test.globs)  # a fresh copy per run
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=out.write)
    assert result.failed == 0, out.getvalue()


def test_doctests_were_found():
    assert {"simlib._solve.solve", "simlib.fit._fit.fit"} <= set(DOCTESTS)


# -- the API reference ---------------------------------------------------------------------

API = DOCS / "api"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def _resolve(path: str):
    """The object a mkdocstrings identifier names (the longest importable module prefix,
    then attributes)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _documented():
    """``{identifier: page}`` for every ``::: identifier`` in docs/api/*.md."""
    return {ident: page.name for page in sorted(API.glob("*.md"))
            for ident in DIRECTIVE.findall(page.read_text())}


def _public_modules():
    """simlib and its public submodules: ``[(module name, module, API page)]``."""
    mods = [("simlib", sl, "docs/api/simlib.md")]
    for info in pkgutil.iter_modules(sl.__path__):
        if not info.name.startswith("_"):
            name = f"simlib.{info.name}"
            mods.append((name, importlib.import_module(name), f"docs/api/{info.name}.md"))
    return mods


def test_every_public_name_is_in_the_api_reference():
    """Each name in the ``__all__`` of simlib and of its public submodules has a ``:::``
    entry (its own, or one of the same object under another module); a module without
    ``__all__`` is documented whole. The message says what to add where."""
    documented = _documented()
    objects = {}
    for ident in documented:
        obj = _resolve(ident)
        if callable(obj) or isinstance(obj, type):
            objects.setdefault(id(obj), ident)
    problems = []
    for modname, module, page in _public_modules():
        names = getattr(module, "__all__", None)
        if names is None:
            if modname not in documented:
                problems.append(f"{modname} has no __all__: document it whole with "
                                f"'::: {modname}' in {page} (and add the page to mkdocs.yml)")
            continue
        missing = []
        for name in names:
            obj = getattr(module, name)
            if f"{modname}.{name}" in documented:
                continue
            if (callable(obj) or isinstance(obj, type)) and id(obj) in objects:
                continue
            if isinstance(obj, types.ModuleType) and (API / f"{name}.md").exists():
                continue  # a submodule listed in __all__, with its own page
            missing.append(name)
        if missing:
            lines = "\n".join(f"    ::: {modname}.{n}" for n in missing)
            where = (f"add to {page} (under the heading where it belongs)"
                     if (ROOT / page).exists() else
                     f"create {page} (titled '# `{modname}`'), add it to mkdocs.yml's nav "
                     "under 'API reference', and put in it")
            problems.append(f"{len(missing)} public name(s) of {modname} are missing from the "
                            f"API reference; {where}:\n{lines}")
    assert not problems, "\n".join(problems)


def test_public_names_have_docstrings():
    """The API reference shows each public function and class with its own docstring."""
    import inspect

    bare = []
    for modname, module, _ in _public_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if not (callable(obj) or inspect.isclass(obj)) or isinstance(obj, types.ModuleType):
                continue
            doc = (obj.__doc__ or "").strip()
            if not doc or (inspect.isclass(obj) and doc.startswith(f"{name}(")):
                bare.append(f"{modname}.{name}")  # none, or namedtuple's generated one
    assert not bare, f"public names without a docstring of their own: {bare}"


def test_api_reference_names_exist():
    """No ``:::`` entry names something that is gone (mkdocs would fail later, less clearly)."""
    stale = []
    for ident, page in _documented().items():
        try:
            _resolve(ident)
        except (ImportError, AttributeError):
            stale.append(f"docs/api/{page}: ::: {ident}")
    assert not stale, "API reference entries for names that do not exist:\n" + "\n".join(stale)


def test_every_page_is_in_the_nav():
    """mkdocs only reports pages missing from the nav; here it is an error. The helpers'
    pages of issues 10, 11 and 14 sit commented out in mkdocs.yml until they are merged."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    listed = set(re.findall(r"^\s*- (?:[^:#\n]+: )?(\S+\.md)\s*$", nav, flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing = sorted(pages - listed)
    absent = sorted(listed - pages)
    assert not missing, (f"docs pages not in mkdocs.yml's nav: {missing} (uncomment or add "
                         "their nav lines)")
    assert not absent, f"mkdocs.yml's nav lists pages that do not exist: {absent}"


# -- the README ----------------------------------------------------------------------------

def _tables():
    sys.path.insert(0, str(DOCS))
    try:
        import _tables
    finally:
        sys.path.pop(0)
    return _tables


def test_readme_comparison_table_is_current():
    tables = _tables()
    readme = (ROOT / "README.md").read_text()
    assert tables.BEGIN in readme and tables.END in readme, "README lost its comparison table"
    current = readme[readme.index(tables.BEGIN):readme.index(tables.END) + len(tables.END)]
    assert current == tables.comparison_table(), (
        "README.md's comparison table differs from benchmarks/results/*.json: run "
        "`python docs/_tables.py --write-readme`")


def test_comparison_table_reads_the_files_it_cites():
    """Spot-check two cells against the JSON files directly."""
    import json

    table = _tables().comparison_table()
    ode = json.loads((ROOT / "benchmarks/results/ode.json").read_text())
    t = {(r["case"], r["members"], r["method"]): r["time_s"] for r in ode["timings"]}
    ratio = t[("fixed", 10000, "diffrax vmap")] / t[("fixed", 10000, "simlib vmap")]
    assert f"{ratio:.3g}x (`diffeqsolve` under vmap)" in table
    particles = json.loads((ROOT / "benchmarks/results/particles.json").read_text())
    if particles.get("versions", {}).get("jax_md"):
        assert f"jax-md {particles['versions']['jax_md']}" in table
    else:
        assert "jax-md was not installed" in table


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local, "the README links no docs pages"
    broken = [link for link in local if not (ROOT / link).exists()]
    assert not broken, f"README links to missing files: {broken}"
