"""Every public function, and every public class's ``__init__``, is fully type-annotated.

The public surface is what the API tests pin: ``__all__`` of ``simlib`` and of its public
modules. A function passes when every parameter but ``self``/``cls``, ``*args`` and
``**kwargs`` has an annotation and the return has one; a class passes when the
``__init__`` it uses (its own or a simlib base class's) does. An ``__init__`` inherited from
outside simlib (``Exception``, ``dict``, ``Enum``) is not simlib's to annotate.

``NOT_YET_ANNOTATED`` lists the names that do not pass yet. It may only shrink: a new public
name must be annotated, and a listed name that passes must leave the list.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

SURFACE = ("simlib", "simlib.particles", "simlib.systems", "simlib.fit", "simlib.pde",
           "simlib.plot", "simlib.io", "simlib.progress")

NOT_YET_ANNOTATED = frozenset()


def _public() -> dict[str, object]:
    """``{"module.name": object}`` for every public function and class."""
    out = {}
    for module_name in SURFACE:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out[f"{module_name}.{name}"] = obj
    return out


def _init(cls: type) -> object | None:
    """The ``__init__`` that ``cls`` uses, or None when it comes from outside simlib."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            own = klass.__module__.split(".")[0] == "simlib"
            init = vars(klass)["__init__"]
            return init if own and inspect.isfunction(init) else None
    return None


def _missing(obj: object) -> list[str]:
    """The parameters (and ``"return"``) of a function, or of a class's ``__init__``,
    without an annotation."""
    fn = _init(obj) if inspect.isclass(obj) else obj
    if fn is None:
        return []
    sig = inspect.signature(fn)
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [p.name for i, p in enumerate(sig.parameters.values())
               if p.kind not in skip and p.annotation is inspect.Parameter.empty
               and not (i == 0 and p.name in ("self", "cls"))]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


PUBLIC = _public()


def test_the_surface_is_found():
    assert len(PUBLIC) > 200
    assert {"simlib.solve", "simlib.particles.simulate", "simlib.plot.trajectory",
            "simlib.fit.least_squares", "simlib.pde.Grid"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(set(PUBLIC) - NOT_YET_ANNOTATED))
def test_public_callable_is_annotated(name):
    missing = _missing(PUBLIC[name])
    assert not missing, f"{name}: no annotation for {', '.join(missing)}"


def test_not_yet_annotated_only_shrinks():
    unknown = sorted(NOT_YET_ANNOTATED - set(PUBLIC))
    assert not unknown, f"not public names, remove them from NOT_YET_ANNOTATED: {unknown}"
    done = sorted(name for name in NOT_YET_ANNOTATED if not _missing(PUBLIC[name]))
    assert not done, f"annotated now, remove them from NOT_YET_ANNOTATED: {done}"


def test_an_unannotated_function_is_caught():
    def helper(x, y: int = 0):
        return x

    class Thing:
        def __init__(self, a: int):
            self.a = a

    assert _missing(helper) == ["x", "return"]
    assert _missing(Thing) == []  # a class outside simlib: its __init__ is not checked
    Thing.__module__ = "simlib.example"
    assert _missing(Thing) == ["return"]
