"""Compiled programs kept across calls and processes, keyed on what they were built from.

``jax.jit`` finds a program again by the identity of its static arguments, so a new
process, or a new closure in the same one, traces and compiles anew. The calls simlib
makes for itself (an eager :func:`~simlib.solve`, :func:`~simlib.fit.fit`,
:func:`~simlib.fit.least_squares`, the examples) are keyed here instead on a
*fingerprint*: a SHA-256 over

* the code and the values the call's functions reach: each function's bytecode, constants,
  defaults and closure cells, and the globals its code names, recursively (the values of
  numbers and arrays, everything in a module of the user's; what a function of JAX, NumPy,
  SciPy, optax, the standard library or simlib is, by its name and the versions below);
* the structure, shapes and dtypes of the array arguments (their values are inputs of the
  program);
* the versions of Python, JAX, jaxlib and the other libraries named above, a hash of
  simlib's own source, the backend and its devices, JAX's tracing settings (x64 and the
  others ``jit`` keys on), ``XLA_FLAGS`` and ``SIMLIB_NATIVE``.

A program traced once simlib's native kernels had loaded (the failure check, the sparse
LU, ...) may call them; it is loaded back only where they load too.

A key found in memory, or in the folder :func:`keep_compiled_programs` names, gives back
the compiled executable (``jax.experimental.serialize_executable``): no trace and no
compile. Anything the fingerprint cannot account for (a tracer, an object of a kind it
does not know, a native function outside those libraries) gives no key, and the call
takes ``jax.jit`` as before. Programs holding a host callback are kept in memory only: a
callback does not survive its process.

What a key cannot see: a function that reads a file, the clock or a random generator
*while it is traced* bakes that value in, and a stored program keeps the first one; and
an attribute read by a computed name (``getattr(module, name)``).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import logging
import os
import pickle
import sys
import sysconfig
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ._native import load_by_name, loaded_libraries

__all__ = ["build", "call", "compiled", "fingerprint", "keep", "keep_compiled_programs", "key",
           "load", "program_folder"]

log = logging.getLogger("simlib")

#: Libraries whose functions are known by their name and version.
LIBRARIES = ("jax", "jaxlib", "numpy", "scipy", "optax", "equinox", "ml_dtypes",
             "opt_einsum", "simlib")
_FORMAT = 1              # of a stored program's file
_IN_MEMORY = 64          # programs kept in memory, least recently used dropped
_BUDGET = 200_000        # objects one fingerprint may visit


class Unkeyable(Exception):
    """The fingerprint cannot account for an object; the call takes ``jax.jit``."""


_trusted_tops: dict[str, bool] = {}


def _trusted(module: str | None) -> bool:
    """Whether ``module``'s functions are known by name and version: simlib, the
    libraries above, and the standard library (a module of the user's that shadows a
    standard one's name is not: it is checked where it was loaded from)."""
    if module is None:
        return False
    top = module.partition(".")[0]
    if top in _trusted_tops:
        return _trusted_tops[top]
    if top in LIBRARIES or top == "builtins":
        return True
    if top not in sys.stdlib_module_names or top not in sys.modules:
        return False
    path = getattr(sys.modules[top], "__file__", None)
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    trusted = path is None or any(os.path.realpath(path).startswith(d + os.sep)
                                  for d in stdlib)
    _trusted_tops[top] = trusted
    return trusted


@functools.lru_cache(maxsize=4096)
def _names(code: types.CodeType) -> frozenset[str]:
    """Every global or attribute name ``code`` and the code nested in it use."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return frozenset(out)


class _Walk:
    """One fingerprint: objects fed in order into one hash."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.seen: dict[Any, int] = {}
        self.alive: list[Any] = []  # so that no id seen is reused by a later object
        self.budget = _BUDGET

    def put(self, *tokens: Any) -> None:
        for token in tokens:
            data = token if isinstance(token, bytes) else str(token).encode()
            self.hash.update(len(data).to_bytes(8, "little"))
            self.hash.update(data)

    def _first_visit(self, memo: Any, obj: Any) -> bool:
        if memo in self.seen:
            self.put("ref", self.seen[memo])
            return False
        self.seen[memo] = len(self.seen)
        self.alive.append(obj)
        return True

    def add(self, obj: Any) -> None:
        """Feed ``obj``."""
        self.budget -= 1
        if self.budget < 0:
            raise Unkeyable("too many objects")
        if obj is None or obj is Ellipsis or isinstance(obj, bool):
            self.put("c", repr(obj))
            return
        kind = type(obj)
        if kind is int or kind is str:
            self.put(kind.__name__, obj)
            return
        if kind is float:
            self.put("float", obj.hex())
            return
        if kind is complex:
            self.put("complex", obj.real.hex(), obj.imag.hex())
            return
        if kind is bytes:
            self.put("bytes", obj)
            return
        if isinstance(obj, types.ModuleType):
            self._module(obj)
            return
        if not self._first_visit(id(obj), obj):
            return
        if isinstance(obj, jax.core.Tracer):
            raise Unkeyable("a traced value")
        if isinstance(obj, np.ndarray | np.generic | jax.Array):
            self._array(obj)
        elif isinstance(obj, np.dtype):
            self.put("dtype", obj.str)
        elif isinstance(obj, types.CodeType):
            self._code(obj)
        elif isinstance(obj, types.FunctionType):
            self._function(obj)
        elif isinstance(obj, types.MethodType):
            self.put("method")
            self.add(obj.__func__)
            self.add(obj.__self__)
        elif isinstance(obj, functools.partial):
            self.put("partial")
            self.add(kind)
            self.add(obj.func)
            self.add(obj.args)
            self.add(obj.keywords)
        elif isinstance(obj, type):
            self._class(obj)
        elif isinstance(obj, enum.Enum):
            self.add(kind)
            self.put("enum", obj.name)
        elif isinstance(obj, jax.tree_util.PyTreeDef):
            self._treedef(obj)
        elif kind in (tuple, list, set, frozenset, dict) or isinstance(obj, tuple | list | dict):
            self._container(obj)
        elif isinstance(obj, staticmethod | classmethod):
            self.put(kind.__name__)
            self.add(obj.__func__)
        elif isinstance(obj, property):
            self.put("property")
            for part in (obj.fget, obj.fset, obj.fdel):
                self.add(part)
        elif isinstance(obj, types.BuiltinFunctionType | np.ufunc) or (
                hasattr(obj, "__wrapped__") and type(obj).__module__.startswith("jaxlib")):
            self._native_function(obj)
        else:
            self._object(obj)

    # ---- kinds

    def _module(self, module: types.ModuleType) -> None:
        """A library's module by name; one of the user's by everything in it (a function
        reading ``module.k`` may be any function the module is passed to)."""
        name = module.__name__
        self.put("module", name)
        if _trusted(name) or not self._first_visit(id(module), module):
            return
        for attr, value in vars(module).items():
            if not (attr.startswith("__") and attr.endswith("__")):
                self.put("attr", attr)
                self.add(value)

    def _array(self, x: Any) -> None:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            raise Unkeyable("an array spread over processes")
        weak = bool(getattr(x, "weak_type", False))
        a = np.asarray(x)
        if a.dtype.hasobject:
            raise Unkeyable("an object array")
        self.put("array", type(x).__name__, a.dtype.str, a.shape, weak)
        self.hash.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # ~1 GB/s

    def _code(self, code: types.CodeType) -> None:
        self.put("code", code.co_code, code.co_argcount, code.co_posonlyargcount,
                 code.co_kwonlyargcount, code.co_flags, code.co_names, code.co_varnames,
                 code.co_freevars, code.co_cellvars)
        for const in code.co_consts:
            self.add(const)

    def _function(self, fn: types.FunctionType) -> None:
        code = fn.__code__
        self.put("function", fn.__module__, fn.__qualname__)
        if not _trusted(fn.__module__):
            self._code(code)
            scope = fn.__globals__
            for name in sorted(_names(code)):
                if name in scope:
                    self.put("global", name)
                    self.add(scope[name])
        self.add(fn.__defaults__)
        self.add(fn.__kwdefaults__)
        for cell in fn.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:
                self.put("empty cell")
                continue
            self.add(content)

    def _native_function(self, fn: Any) -> None:
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:                   # jax.jit(f): what f is
            self.put("jit")
            self.add(wrapped)
            return
        owner = getattr(fn, "__self__", None)
        module = getattr(fn, "__module__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            self.put("bound", getattr(fn, "__name__", "?"))
            self.add(owner)
            return
        module = module or (owner.__name__ if owner is not None else None)
        if not _trusted(module):
            raise Unkeyable(f"a native function of {module}")
        self.put("native", module, getattr(fn, "__qualname__", getattr(fn, "__name__", "?")))

    def _class(self, cls: type) -> None:
        self.put("class", cls.__module__, cls.__qualname__)
        if _trusted(cls.__module__):
            return
        for name, value in vars(cls).items():
            dunder = name.startswith("__") and name.endswith("__")
            if name == "_abc_impl" or (dunder and not callable(value)
                                       and not isinstance(value, staticmethod | classmethod
                                                          | property)):
                self.put("skip", name)
                continue
            if type(value).__name__ in ("member_descriptor", "getset_descriptor",
                                        "wrapper_descriptor", "method_descriptor"):
                self.put("slot", name)
                continue
            self.put("member", name)
            self.add(value)
        for base in cls.__mro__[1:]:
            if base is not object:
                self.add(base)

    def _treedef(self, treedef: Any) -> None:
        data = treedef.node_data()
        if data is None:
            self.put("leaf")
            return
        node, aux = data
        self.put("node", len(treedef.children()))
        self.add(node)
        self.add(aux)
        for child in treedef.children():
            self._treedef(child)

    def _container(self, obj: Any) -> None:
        kind = type(obj)
        self.put("container", len(obj))
        if kind not in (tuple, list, dict, set, frozenset):
            self.add(kind)                        # a NamedTuple, a dict subclass
        if isinstance(obj, dict):
            for k, v in obj.items():
                self.add(k)
                self.add(v)
        elif isinstance(obj, set | frozenset):
            parts = []
            for item in obj:
                sub = _Walk()
                sub.add(item)
                parts.append(sub.hash.digest())
            for part in sorted(parts):
                self.put(part)
        else:
            for item in obj:
                self.add(item)

    def _object(self, obj: Any) -> None:
        kind = type(obj)
        self.add(kind)
        found = False
        if dataclasses.is_dataclass(obj):
            found = True
            for field in dataclasses.fields(obj):
                self.put("field", field.name)
                self.add(getattr(obj, field.name, None))
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            found = True
            for name, value in state.items():
                self.put("attr", name)
                self.add(value)
        for cls in kind.__mro__:
            for slot in getattr(cls, "__dict__", {}).get("__slots__", ()):
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                    found = True
                    self.put("slot", slot)
                    self.add(getattr(obj, slot, None))
        if not found:
            raise Unkeyable(f"an object of type {kind.__module__}.{kind.__qualname__}")


def fingerprint(*parts: Any) -> str | None:
    """The hex SHA-256 of ``parts`` (module docstring), or ``None`` when some part cannot
    be accounted for."""
    walk = _Walk()
    try:
        for part in parts:
            walk.add(part)
    except Unkeyable as why:
        log.debug("simlib: no program key: %s", why)
        return None
    except Exception as err:  # noqa: BLE001 - an object that would not be read
        log.debug("simlib: no program key: %s: %s", type(err).__name__, err)
        return None
    return walk.hash.hexdigest()


# ---- the setting a program is built in

def _package_version(name: str) -> str:
    try:
        import importlib.metadata
        return importlib.metadata.version(name)
    except Exception:  # noqa: BLE001 - not installed, or no metadata: the module's own
        module = sys.modules.get(name)
        return str(getattr(module, "__version__", "absent"))


@functools.cache
def _fixed_setting() -> str:
    """What cannot change within a process: versions and simlib's source."""
    source = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cc", ".h") and path.is_file():
            source.update(str(path.relative_to(root)).encode())
            source.update(path.read_bytes())
    versions = [(name, _package_version(name)) for name in LIBRARIES if name != "simlib"]
    return repr((_FORMAT, sys.version, sys.platform, versions, source.hexdigest()))


def _setting() -> str:
    """What a program depends on besides its arguments (module docstring)."""
    from jax._src import config as jax_config  # jit keys its own cache on this

    context = [x for x in jax_config.trace_context()
               if x is None or isinstance(x, bool | int | float | str | tuple | enum.Enum)]
    devices = [(d.platform, d.device_kind, d.id) for d in jax.devices()]
    return repr((_fixed_setting(), jax.default_backend(), devices, repr(context),
                 os.environ.get("XLA_FLAGS", ""), os.environ.get("SIMLIB_NATIVE", "")))


def key(*static: Any, dynamic: Any = ()) -> str | None:
    """The key of the program built from ``static`` (functions, settings) for arguments
    shaped like ``dynamic``; ``None`` when it cannot be built."""
    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    avals = []
    for leaf in leaves:
        if isinstance(leaf, jax.core.Tracer):
            return None
        try:
            aval = jax.api_util.shaped_abstractify(leaf)
        except TypeError:
            return None
        avals.append((aval.shape, str(aval.dtype), aval.weak_type))
    return fingerprint(_setting(), static, treedef, avals)


# ---- the store

class _Memory:
    """The programs kept in this process, least recently used dropped first; emptied by
    ``jax.clear_caches()`` like JAX's own (the interface of a ``functools`` cache)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.programs: collections.OrderedDict[str, tuple[Any, dict]] = \
            collections.OrderedDict()
        self.lock = threading.Lock()  # solves may run in several threads

    def get(self, k: str) -> tuple[Any, dict] | None:
        with self.lock:
            entry = self.programs.get(k)
            if entry is not None:
                self.programs.move_to_end(k)
            return entry

    def put(self, k: str, entry: tuple[Any, dict]) -> None:
        with self.lock:
            self.programs[k] = entry
            self.programs.move_to_end(k)
            while len(self.programs) > self.size:
                self.programs.popitem(last=False)

    def cache_clear(self) -> None:
        with self.lock:
            self.programs.clear()

    def cache_info(self) -> str:
        return f"{len(self.programs)} programs"

    def cache_keys(self) -> list[str]:
        return list(self.programs)


_memory = _Memory(_IN_MEMORY)
try:
    from jax._src.util import register_cache  # private: jax.clear_caches() calls it

    register_cache(_memory, "simlib's kept programs")
except Exception:  # noqa: BLE001 - then only the LRU bound holds memory down
    pass
_folder: list[Path | None] = [None]


def program_folder() -> Path | None:
    """The folder programs are stored in (:func:`keep_compiled_programs`), or ``None``:
    on the CPU only (on a GPU, JAX's own cache serves; its runtime needs more set up
    than :func:`_prepare_runtime` does)."""
    if jax.default_backend() != "cpu":
        return None
    return _folder[0]


def load(k: str | None) -> tuple[Any, dict] | None:
    """``(compiled, meta)`` kept under key ``k`` (in memory, else in the folder), or
    ``None``."""
    if k is None:
        return None
    entry = _memory.get(k)
    if entry is not None:
        return entry
    folder = program_folder()
    if folder is None:
        return None
    path = folder / f"{k}.bin"
    if not path.is_file():
        return None
    try:
        from jax.experimental import serialize_executable

        _prepare_runtime()
        stored = pickle.loads(path.read_bytes())
        if stored.get("format") != _FORMAT:
            return None
        meta = stored["meta"]
        if not all(load_by_name(name) for name in meta.get("native", ())):
            return None     # it may call a native kernel that does not load here
        if meta.get("sparse_patterns"):
            from ._linalg._kernels import register_pattern

            for arrays in meta["sparse_patterns"]:
                register_pattern(*arrays)  # looked up by key, from the process's registry
        compiled = serialize_executable.deserialize_and_load(
            stored["payload"], stored["in_tree"], stored["out_tree"])
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file is a miss
        log.debug("simlib: stored program %s not loaded: %s", path.name, err)
        return None
    entry = (compiled, meta)
    _memory.put(k, entry)
    return entry


def _prepare_runtime() -> None:
    """What lowering would have set up before a program runs: JAX binds LAPACK (the CPU's
    LU, QR, ...) on the first lowering that needs it, and a loaded program that calls it
    before then crashes the process."""
    from jax._src.lax.linalg import initialize_lapack  # private: no public way

    initialize_lapack()


def _has_host_callbacks(lowered: Any) -> bool:
    try:
        return bool(lowered._lowering.compile_args["host_callbacks"])  # noqa: SLF001
    except Exception:  # noqa: BLE001 - cannot tell: treat as holding one
        return True


def _host_state() -> dict:
    """What a program traced now may look up in this process rather than hold: the native
    libraries loaded (its custom calls' kernels; whether it calls them depends on the
    machine, not on the key) and the sparse patterns registered with them (by key)."""
    state: dict[str, Any] = {"native": loaded_libraries()}
    kernels = sys.modules.get("simlib._linalg._kernels")
    if kernels is not None:
        state["sparse_patterns"] = kernels.registered_patterns_arrays()
    return state


def keep(k: str | None, compiled: Any, lowered: Any, meta: dict | None = None, *,
         from_jax_cache: bool = False) -> None:
    """Keep ``compiled`` (built from ``lowered``) under key ``k``: in memory, and in the
    folder when one is set, the program holds no host callback, and it was compiled
    rather than loaded from JAX's persistent cache (``from_jax_cache``: an executable
    JAX loaded from its cache and serialised again fails to run, "Function
    broadcast_add_fusion not found", jax 0.10.2)."""
    if k is None:
        return
    meta = dict(meta or {}, **_host_state())
    _memory.put(k, (compiled, meta))
    folder = program_folder()
    if folder is None or from_jax_cache or _has_host_callbacks(lowered):
        return
    try:
        from jax.experimental import serialize_executable

        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        blob = pickle.dumps(dict(format=_FORMAT, payload=payload, in_tree=in_tree,
                                 out_tree=out_tree, meta=meta))
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
        os.replace(tmp, folder / f"{k}.bin")
    except Exception as err:  # noqa: BLE001 - not storable (e.g. an unpicklable pytree)
        log.debug("simlib: program not stored: %s", err)


_jax_cache_hits = [0]


def _count_jax_cache_hits(event: str, **kw: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _jax_cache_hits[0] += 1


jax.monitoring.register_event_listener(_count_jax_cache_hits)


def build(k: str | None, lowered: Any, meta: dict | None = None) -> Any:
    """``lowered.compile()``, kept under key ``k`` with ``meta`` (:func:`keep`)."""
    before = _jax_cache_hits[0]
    program = lowered.compile()
    keep(k, program, lowered, meta, from_jax_cache=_jax_cache_hits[0] != before)
    return program


def _lookup(jitted: Callable, args: tuple, n_static: int, static_kwargs: dict
            ) -> tuple[str | None, Any]:
    """``(key, kept program or None)`` of ``jitted(*args, **static_kwargs)``."""
    k = key(jitted, args[:n_static], sorted(static_kwargs.items()), dynamic=args[n_static:])
    found = load(k)
    return k, None if found is None else found[0]


def compiled(jitted: Callable, *args: Any, n_static: int = 0, **static_kwargs: Any) -> Any:
    """The compiled program of ``jitted(*args, **static_kwargs)``, a ``jax.jit`` function
    whose first ``n_static`` positional arguments and keyword arguments are static, through
    the kept programs: looked up by key, else lowered, compiled and kept. Call it with the
    other arguments, ``args[n_static:]``. For eager calls only: a function closing over a
    tracer has no key, and its program takes the tracer as one more input."""
    k, program = _lookup(jitted, args, n_static, static_kwargs)
    if program is None:
        program = build(k, jitted.lower(*args, **static_kwargs))
    return program


def call(jitted: Callable, n_static: int, *args: Any, **static_kwargs: Any) -> Any:
    """``jitted(*args, **static_kwargs)`` through the kept programs (:func:`compiled`);
    through ``jitted`` itself when there is no key (e.g. a tracer closed over: the call is
    then part of a trace after all)."""
    k, program = _lookup(jitted, args, n_static, static_kwargs)
    if k is None:
        return jitted(*args, **static_kwargs)
    if program is None:
        program = build(k, jitted.lower(*args, **static_kwargs))
    return program(*args[n_static:])


def keep_compiled_programs(folder: str | os.PathLike | None = None) -> str | None:
    """Keep compiled programs between processes, from this call on: a second run of the
    same script loads them instead of tracing and compiling.

    Two stores are turned on. The programs simlib builds for an eager
    :func:`~simlib.solve`, :func:`~simlib.fit.fit` and :func:`~simlib.fit.least_squares`
    are stored whole in ``folder/programs`` (keyed as this module says), so the next
    process neither traces nor compiles them. For everything else, your own ``jax.jit``
    included, JAX's persistent compilation cache goes to ``folder/jax`` (kept if the
    process already chose one), which skips the compile but not the trace.

    Args:
        folder: Where to store; default ``$SIMLIB_CACHE`` or ``~/.cache/simlib``.
            ``SIMLIB_COMPILATION_CACHE=0`` in the environment turns both stores off.

    Returns:
        The folder in use, or ``None`` when turned off.
    """
    if os.environ.get("SIMLIB_COMPILATION_CACHE", "1").strip().lower() in (
            "0", "false", "no", "off"):
        return None
    from ._native import cache_root

    root = Path(folder).expanduser() if folder is not None else cache_root()
    _folder[0] = root / "programs"
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(root / "jax"))
        # simlib's programs take 0.1 s to a minute to compile; reading one back is ~ms
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    return str(root)
