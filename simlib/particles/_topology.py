r"""Molecular topologies from LAMMPS data files, and the excluded pairs they imply.

Why LAMMPS data files: one plain-text file holds everything a run starts from (box,
coordinates, charges, masses, bonds, angles, dihedrals, impropers and their force-field
coefficients), every common builder writes it (moltemplate, VMD's TopoTools, Packmol with
moltemplate, ``write_data`` in LAMMPS itself, ParmEd and OpenMM through converters), and
LAMMPS is simlib's peer in the particle benchmarks, so a system read here runs in both. A
GROMACS topology needs its include files and force-field directory, and an OpenMM system
needs OpenMM installed. Format: https://docs.lammps.org/read_data.html.

:func:`read_lammps_data` returns a :class:`Topology` of numpy arrays with 0-based atom
indices in the order of the atom ids; :func:`excluded_pairs` lists the pairs 1-2, 1-3 and
1-4 bonds apart, which nonbonded terms leave out or scale (1-4).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple, NoReturn

import numpy as np
from numpy.typing import ArrayLike

# columns of the Atoms section for each atom style (before optional image flags)
_ATOM_STYLES = {
    "full": ("id", "mol", "type", "q", "x", "y", "z"),
    "molecular": ("id", "mol", "type", "x", "y", "z"),
    "charge": ("id", "type", "q", "x", "y", "z"),
    "atomic": ("id", "type", "x", "y", "z"),
    "angle": ("id", "mol", "type", "x", "y", "z"),
    "bond": ("id", "mol", "type", "x", "y", "z"),
}
_TERMS = {"Bonds": 2, "Angles": 3, "Dihedrals": 4, "Impropers": 4}
_COEFFS = ("Pair Coeffs", "Bond Coeffs", "Angle Coeffs", "Dihedral Coeffs", "Improper Coeffs")
_SECTIONS = ("Masses", "Atoms", "Velocities", *_TERMS, *_COEFFS)
_HEADER_COUNTS = ("atoms", "bonds", "angles", "dihedrals", "impropers", "atom types",
                  "bond types", "angle types", "dihedral types", "improper types")


class Topology(NamedTuple):
    """A molecular system read from a file (numpy arrays; atom indices 0-based, in the
    order of the atom ids; type numbers as in the file, 1-based).

    Attributes:
        positions: ``(n, 3)`` as in the file (inside the box or not).
        images: ``(n, 3)`` int image flags (zeros where the file has none); the unwrapped
            positions are ``positions + images * box``.
        box: ``(3,)`` side lengths; ``origin``: ``(3,)`` lower corner.
        types, molecules: ``(n,)`` atom types and molecule ids (0 without molecules).
        charges: ``(n,)`` (zeros for styles without charges).
        masses: ``(n,)`` per atom, from the ``Masses`` section or ``masses=``.
        velocities: ``(n, 3)`` or ``None``.
        bonds, angles, dihedrals, impropers: ``(m, 2)``, ``(m, 3)``, ``(m, 4)``, ``(m, 4)``
            atom indices; ``bond_types`` etc.: ``(m,)``.
        coeffs: ``{"Pair Coeffs": {type: [numbers]}, ...}`` as written (a style comment,
            e.g. ``# lj/cut/coul/long``, under the key ``"<section> style"``).
    """

    positions: np.ndarray
    images: np.ndarray
    box: np.ndarray
    origin: np.ndarray
    types: np.ndarray
    molecules: np.ndarray
    charges: np.ndarray
    masses: np.ndarray
    velocities: np.ndarray | None
    bonds: np.ndarray
    bond_types: np.ndarray
    angles: np.ndarray
    angle_types: np.ndarray
    dihedrals: np.ndarray
    dihedral_types: np.ndarray
    impropers: np.ndarray
    improper_types: np.ndarray
    coeffs: dict

    @property
    def n_atoms(self) -> int:
        return self.positions.shape[0]

    def unwrapped(self) -> np.ndarray:
        """Positions with the image flags applied: molecules whole across the boundary."""
        return self.positions + self.images * self.box


class TopologyError(ValueError):
    """A data file that cannot be read: the message names the file and line."""


def _numeric(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _strip(line: str) -> tuple[str, str]:
    body, _, comment = line.partition("#")
    return body.strip(), comment.strip()


def read_lammps_data(path: str | os.PathLike, atom_style: str = "full", *,
                     masses: Mapping[int, float] | None = None) -> Topology:
    """Read a LAMMPS data file (orthorhombic box) into a :class:`Topology`.

    Args:
        path: The file (as written by ``write_data`` or a builder).
        atom_style: The ``Atoms`` section's columns: ``"full"`` (``id mol type q x y z``,
            the usual one for molecules), ``"molecular"``, ``"charge"``, ``"atomic"``,
            ``"bond"`` or ``"angle"``. A style comment after ``Atoms`` (``Atoms # full``,
            as ``write_data`` writes) overrides it.
        masses: Mass by atom type, ``{type: mass}``, for a file without a ``Masses``
            section (an input script's ``mass`` commands); they take precedence over the
            file's.

    Raises:
        TopologyError: naming the file and line, for a missing or malformed section, a
            count that does not match the header, a triclinic box, an unknown atom id, an
            atom type without a mass (in the file or ``masses``).
    """
    if atom_style not in _ATOM_STYLES:
        raise ValueError(f"read_lammps_data: atom_style must be one of "
                         f"{sorted(_ATOM_STYLES)}, got {atom_style!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_lammps_data: no file {str(path)!r}")
    lines = path.read_text().splitlines()

    def fail(lineno: int, why: str) -> NoReturn:
        raise TopologyError(f"{path}: line {lineno}: {why}")

    counts, bounds, k = _read_header(lines, fail)
    for axis in "xyz":
        if axis not in bounds:
            raise TopologyError(f"{path}: the header has no '{axis}lo {axis}hi' line")
    if "atoms" not in counts:
        raise TopologyError(f"{path}: the header has no 'atoms' count")
    sections = _read_sections(lines, k, fail)
    n = counts["atoms"]
    if "Atoms" not in sections:
        raise TopologyError(f"{path}: no Atoms section")
    table, images, order = _read_atoms(sections["Atoms"], n, atom_style, fail)
    index = {int(i): j for j, i in enumerate(np.asarray(table["id"], np.int64)[order])}

    def column(c, default=0.0):
        return np.asarray(table[c], float)[order] if c in table else np.full(n, default)

    positions = np.stack([column("x"), column("y"), column("z")], axis=1)
    types = column("type").astype(np.int64)
    lo = np.array([bounds[a][0] for a in "xyz"])
    hi = np.array([bounds[a][1] for a in "xyz"])
    if np.any(hi <= lo):
        raise TopologyError(f"{path}: the box has a side of zero or negative length "
                            f"({lo.tolist()} to {hi.tolist()})")

    def atom(lineno: int, word: str) -> int:
        try:
            return index[int(word)]
        except (KeyError, ValueError):
            fail(lineno, f"no atom with id {word!r}")

    masses = _read_masses(sections, types, masses, path, fail)
    velocities = _read_velocities(sections, n, atom, fail)
    terms = _read_terms(sections, counts, atom, fail)
    return Topology(
        positions=positions, images=np.asarray(images, np.int64)[order], box=hi - lo,
        origin=lo, types=types, molecules=column("mol").astype(np.int64),
        charges=column("q"), masses=masses, velocities=velocities,
        bonds=terms["bonds"][0], bond_types=terms["bonds"][1],
        angles=terms["angles"][0], angle_types=terms["angles"][1],
        dihedrals=terms["dihedrals"][0], dihedral_types=terms["dihedrals"][1],
        impropers=terms["impropers"][0], improper_types=terms["impropers"][1],
        coeffs=_read_coeffs(sections))


# The parts of read_lammps_data. ``fail(lineno, why)`` raises a TopologyError naming the
# file and line; a section is ``(first line number, comment after its title, rows)`` with
# rows ``(line number, words)``.
_Fail = Callable[[int, str], NoReturn]
_Section = tuple[int, str, list[tuple[int, list[str]]]]


def _read_header(lines: list[str], fail: _Fail
                 ) -> tuple[dict[str, int], dict[str, tuple[float, float]], int]:
    """The header's counts (``{"atoms": 3, ...}``), box bounds by axis and the index of
    the first section title."""
    counts: dict[str, int] = {}
    bounds: dict[str, tuple[float, float]] = {}
    k = 1                                     # the first line is a title
    while k < len(lines):
        body, _ = _strip(lines[k])
        if body in _SECTIONS:
            break
        if body:
            words = body.split()
            if body.endswith(("xlo xhi", "ylo yhi", "zlo zhi")):
                try:
                    bounds[words[2][0]] = (float(words[0]), float(words[1]))
                except ValueError:
                    fail(k + 1, f"bad box bounds {body!r}")
            elif body.endswith("xy xz yz"):
                fail(k + 1, "a triclinic box (xy xz yz) is not supported; simlib's periodic "
                            "boxes are orthorhombic")
            else:
                key = " ".join(words[1:])
                if key in _HEADER_COUNTS:
                    try:
                        counts[key] = int(words[0])
                    except ValueError:
                        fail(k + 1, f"bad count {body!r}")
                elif key.split()[-1] in ("types", "bonds", "angles", "dihedrals", "impropers",
                                         "atoms") or key.startswith("extra"):
                    pass                      # e.g. "extra bond per atom": storage hints
                else:
                    fail(k + 1, f"unknown header line {body!r}")
        k += 1
    return counts, bounds, k


def _read_sections(lines: list[str], k: int, fail: _Fail) -> dict[str, _Section]:
    """The sections from line index ``k`` on, by title."""
    sections: dict[str, _Section] = {}
    while k < len(lines):
        body, comment = _strip(lines[k])
        if not body:
            k += 1
            continue
        if body not in _SECTIONS:
            fail(k + 1, f"unknown section {body!r} (known: {', '.join(_SECTIONS)})")
        name, start = body, k + 1
        k += 1
        rows = []
        while k < len(lines):
            b, _ = _strip(lines[k])
            if b in _SECTIONS or (b and not _numeric(b.split()[0])):
                break                  # every row starts with a number; this is a title
            if b:
                rows.append((k + 1, b.split()))
            k += 1
        sections[name] = (start, comment, rows)
    return sections


def _read_atoms(section: _Section, n: int, atom_style: str, fail: _Fail
                ) -> tuple[dict[str, list[float]], list[list[int]], np.ndarray]:
    """The Atoms section: its columns by name (in file order), the image flags and the
    order that sorts the atoms by id."""
    start, comment, rows = section
    style = comment.split()[0] if comment and comment.split()[0] in _ATOM_STYLES else atom_style
    columns = _ATOM_STYLES[style]
    if len(rows) != n:
        fail(start, f"the Atoms section has {len(rows)} lines, the header says {n} atoms")
    table: dict[str, list[float]] = {c: [] for c in columns}
    images = []
    for lineno, words in rows:
        if len(words) not in (len(columns), len(columns) + 3):
            fail(lineno, f"atom_style {style} has {len(columns)} columns (+3 image flags), "
                         f"got {len(words)}: {' '.join(words)!r}")
        try:
            for c, w in zip(columns, words, strict=False):
                table[c].append(float(w))
            images.append([int(w) for w in words[len(columns):]] or [0, 0, 0])
        except ValueError:
            fail(lineno, f"not a number in {' '.join(words)!r}")
    ids = np.asarray(table["id"], np.int64)
    if len(set(ids.tolist())) != n:
        fail(start, "duplicate atom ids")
    return table, images, np.argsort(ids)


def _read_masses(sections: dict[str, _Section], types: np.ndarray,
                 given: Mapping[int, float] | None, path: Path, fail: _Fail) -> np.ndarray:
    """Per-atom masses from the Masses section, overridden by ``given`` (by type)."""
    per_type = {}
    for lineno, words in sections.get("Masses", (0, "", []))[2]:
        try:
            per_type[int(words[0])] = float(words[1])
        except (ValueError, IndexError):
            fail(lineno, f"a Masses line is 'type mass', got {' '.join(words)!r}")
    per_type.update({int(t): float(m) for t, m in (given or {}).items()})
    missing = sorted(set(types.tolist()) - set(per_type))
    if missing and "Masses" in sections:
        fail(sections["Masses"][0], f"no mass for atom types {missing}")
    if missing and given:
        raise TopologyError(f"{path}: no mass for atom types {missing} (no Masses section, "
                            f"and masses= gives types {sorted(given)})")
    if missing:
        raise TopologyError(f"{path}: no Masses section, so no mass for atom types "
                            f"{missing}; add one to the file or pass masses={{type: mass}} "
                            f"to read_lammps_data")
    return np.asarray([per_type[t] for t in types.tolist()])


def _read_velocities(sections: dict[str, _Section], n: int,
                     atom: Callable[[int, str], int], fail: _Fail) -> np.ndarray | None:
    """``(n, 3)`` velocities from the Velocities section (None without one)."""
    if "Velocities" not in sections:
        return None
    velocities = np.zeros((n, 3))
    for lineno, words in sections["Velocities"][2]:
        if len(words) < 4:
            fail(lineno, "a Velocities line is 'id vx vy vz'")
        velocities[atom(lineno, words[0])] = [float(w) for w in words[1:4]]
    return velocities


def _read_terms(sections: dict[str, _Section], counts: dict[str, int],
                atom: Callable[[int, str], int], fail: _Fail
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"bonds": (atom indices, types), "angles": ...}`` from the bonded sections."""
    terms = {}
    for name, width in _TERMS.items():
        key = name.lower()
        expected = counts.get(key, 0)
        start, _, rows = sections.get(name, (0, "", []))
        if len(rows) != expected:
            fail(start or 1, f"the {name} section has {len(rows)} lines, the header says "
                             f"{expected} {key}")
        idx = np.zeros((len(rows), width), np.int64)
        kinds = np.zeros(len(rows), np.int64)
        for r, (lineno, words) in enumerate(rows):
            if len(words) != width + 2:
                fail(lineno, f"a {name} line is 'id type' and {width} atom ids, got "
                             f"{' '.join(words)!r}")
            kinds[r] = int(words[1])
            idx[r] = [atom(lineno, w) for w in words[2:]]
        terms[key] = (idx, kinds)
    return terms


def _read_coeffs(sections: dict[str, _Section]) -> dict:
    """The coefficient sections by title (``{type: [values]}``), and each one's style
    comment under ``"<title> style"``."""
    coeffs: dict = {}
    for name in _COEFFS:
        if name in sections:
            start, comment, rows = sections[name]
            coeffs[name] = {int(w[0]): [float(x) for x in w[1:]] for _, w in rows}
            if comment:
                coeffs[f"{name} style"] = comment
    return coeffs


def excluded_pairs(bonds: ArrayLike, n_atoms: int, depth: int = 3) -> dict[int, np.ndarray]:
    """The pairs ``(i, j)``, ``i < j``, whose shortest bond path has 1, 2, ..., ``depth``
    bonds: ``{1: 1-2 pairs, 2: 1-3 pairs, 3: 1-4 pairs}``, each ``(m, 2)``.

    Force fields leave 1-2 and 1-3 pairs out of the nonbonded terms and scale 1-4 pairs
    (AMBER: Lennard-Jones by 1/2, Coulomb by 1/1.2). A pair in a ring that is both 1-3 and
    1-4 counts once, at its shortest path. Breadth-first search from each atom, on the host.
    """
    bonds = np.asarray(bonds)
    if bonds.ndim != 2 or bonds.shape[1] != 2:
        raise ValueError(f"excluded_pairs: bonds must be (m, 2), got shape {bonds.shape}")
    if bonds.size and (bonds.min() < 0 or bonds.max() >= n_atoms):
        raise ValueError(f"excluded_pairs: bond atom indices must lie in [0, {n_atoms})")
    neighbours = [[] for _ in range(n_atoms)]
    for a, b in bonds.tolist():
        neighbours[a].append(b)
        neighbours[b].append(a)
    found: dict[int, list] = {d: [] for d in range(1, depth + 1)}
    for source in range(n_atoms):
        distance = {source: 0}
        queue = deque([source])
        while queue:
            a = queue.popleft()
            if distance[a] == depth:
                continue
            for b in neighbours[a]:
                if b not in distance:
                    distance[b] = distance[a] + 1
                    queue.append(b)
                    if b > source:
                        found[distance[b]].append((source, b))
    return {d: np.asarray(sorted(p), np.int64).reshape(-1, 2) for d, p in found.items()}
