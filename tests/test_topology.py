"""LAMMPS data files against MDAnalysis's reader, excluded pairs against the file's own
angles and dihedrals, and malformed files refused with the file and line named."""

from __future__ import annotations

import numpy as np
import pytest

from simlib import particles as sp

# A united-atom butane (ids 1-4) and a water across the x boundary (ids 5-7, listed out of
# order, with image flags); atom_style full, as LAMMPS's write_data writes it.
DATA = """LAMMPS data file: butane and a water (test)

7 atoms
5 bonds
3 angles
1 dihedrals
0 impropers
3 atom types
2 bond types
2 angle types
1 dihedral types

0.0 20.0 xlo xhi
-5.0 15.0 ylo yhi
0.0 20.0 zlo zhi

Masses

1 15.035
2 14.027
3 15.9994

Pair Coeffs # lj/cut

1 0.1947 3.75
2 0.0914 3.95
3 0.1553 3.166

Atoms # full

1 1 1 0.0 1.000 1.000 1.000 0 0 0
2 1 2 0.0 2.540 1.000 1.000 0 0 0
3 1 2 0.0 3.054 2.452 1.000 0 0 0
4 1 1 0.0 4.594 2.452 1.000 0 0 0
7 2 3 0.4238 0.300 6.800 5.000 1 0 0
5 2 3 -0.8476 19.900 6.000 5.000 0 0 0
6 2 3 0.4238 19.500 5.100 5.000 0 0 0

Velocities

1 0.01 0.0 0.0
2 0.0 0.02 0.0
3 0.0 0.0 0.03
4 -0.01 0.0 0.0
5 0.0 -0.02 0.0
6 0.0 0.0 -0.03
7 0.001 0.002 0.003

Bonds

1 1 1 2
2 1 2 3
3 1 3 4
4 2 5 6
5 2 5 7

Angles

1 1 1 2 3
2 1 2 3 4
3 2 6 5 7

Dihedrals

1 1 1 2 3 4
"""


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "system.data"
    path.write_text(DATA)
    return path


def test_against_mdanalysis(data_file):
    mda = pytest.importorskip("MDAnalysis")
    top = sp.read_lammps_data(data_file)
    u = mda.Universe(str(data_file), format="DATA", atom_style="id resid type charge x y z")
    np.testing.assert_allclose(top.positions, u.atoms.positions, atol=1e-5)
    np.testing.assert_allclose(top.charges, u.atoms.charges, atol=1e-7)
    np.testing.assert_allclose(top.masses, u.atoms.masses, atol=1e-6)
    assert top.types.tolist() == [int(t) for t in u.atoms.types]
    np.testing.assert_allclose(top.box, u.dimensions[:3], atol=1e-6)
    for ours, theirs in ((top.bonds, u.bonds), (top.angles, u.angles),
                         (top.dihedrals, u.dihedrals)):
        assert {tuple(r) for r in ours.tolist()} == {tuple(r) for r in theirs.indices.tolist()}
    # velocities: MDAnalysis 2.x converts them to A/ps and, with atoms listed out of id
    # order, pairs them with atoms in the listed order; compared with the text below


def test_fields_images_and_coefficients(data_file):
    top = sp.read_lammps_data(data_file)
    assert top.n_atoms == 7 and top.box.tolist() == [20.0, 20.0, 20.0]
    assert top.origin.tolist() == [0.0, -5.0, 0.0]
    assert top.molecules.tolist() == [1, 1, 1, 1, 2, 2, 2]
    # atoms in id order: the water's oxygen (id 5) is index 4 though it is listed 6th
    assert top.charges[4] == -0.8476 and top.images[6].tolist() == [1, 0, 0]
    assert top.velocities[4].tolist() == [0.0, -0.02, 0.0]        # id 5, as written
    assert top.velocities[6].tolist() == [0.001, 0.002, 0.003]
    whole = top.unwrapped()
    assert np.linalg.norm(whole[6] - whole[4]) < 1.0           # O-H whole across the edge
    assert top.coeffs["Pair Coeffs"][3] == [0.1553, 3.166]
    assert top.coeffs["Pair Coeffs style"] == "lj/cut"
    assert top.bond_types.tolist() == [1, 1, 1, 2, 2]
    # the bond angle of the water as read, through angle_energy with minimum images
    energy = sp.angle_energy(sp.harmonic_angle, sp.periodic(top.box), top.angles[2:3])
    theta = float(energy.angles(top.positions)[0])
    h1, o, h2 = whole[5], whole[4], whole[6]
    cos = np.dot(h1 - o, h2 - o) / np.linalg.norm(h1 - o) / np.linalg.norm(h2 - o)
    assert abs(theta - np.arccos(cos)) < 1e-12


def test_excluded_pairs_match_the_files_angles_and_dihedrals(data_file):
    top = sp.read_lammps_data(data_file)
    ex = sp.excluded_pairs(top.bonds, top.n_atoms)
    assert {tuple(sorted(b)) for b in top.bonds.tolist()} == {tuple(p) for p in ex[1].tolist()}
    ends13 = {tuple(sorted((a[0], a[2]))) for a in top.angles.tolist()}
    assert ends13 == {tuple(p) for p in ex[2].tolist()}
    ends14 = {tuple(sorted((d[0], d[3]))) for d in top.dihedrals.tolist()}
    assert ends14 == {tuple(p) for p in ex[3].tolist()}
    # a ring of four: the pair across it is 1-3 (two paths of 2), never also 1-4
    ring = sp.excluded_pairs(np.array([[0, 1], [1, 2], [2, 3], [3, 0]]), 4)
    assert ring[2].tolist() == [[0, 2], [1, 3]] and ring[3].size == 0


@pytest.mark.parametrize("edit, match", [
    (("7 atoms", "8 atoms"), "line 29: the Atoms section has 7 lines, the header says 8"),
    (("3 1 3 4\n", "3 1 3 9\n"), "no atom with id '9'"),
    (("0.0 20.0 zlo zhi\n", "0.0 20.0 zlo zhi\n0.0 0.0 0.0 xy xz yz\n"), "triclinic"),
    (("Dihedrals\n", "Dihedralz\n"), "unknown section 'Dihedralz'"),
    (("2 1 2 0.0 2.540", "2 1 2 0.0 2.5x0"), "not a number"),
    (("1 15.035\n", ""), r"no mass for atom types \[1\]"),
])
def test_malformed_files_name_the_file_and_line(tmp_path, edit, match):
    path = tmp_path / "bad.data"
    path.write_text(DATA.replace(*edit, 1))
    with pytest.raises(sp.TopologyError, match=match) as info:
        sp.read_lammps_data(path)
    assert str(path) in str(info.value)


def test_missing_masses_section_is_refused_unless_masses_are_given(tmp_path):
    """Issue 41: a file without a Masses section gave NaN masses silently. It is refused,
    naming the file and the types without a mass, unless ``masses`` gives them."""
    start = DATA.index("Masses")
    path = tmp_path / "no_masses.data"
    path.write_text(DATA[:start] + DATA[DATA.index("Pair Coeffs"):])
    with pytest.raises(ValueError, match=r"no Masses section.*atom types \[1, 2, 3\].*masses=")\
            as info:
        sp.read_lammps_data(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=r"no mass for atom types \[3\]"):
        sp.read_lammps_data(path, masses={1: 15.035, 2: 14.027})
    top = sp.read_lammps_data(path, masses={1: 15.035, 2: 14.027, 3: 15.9994})
    assert top.masses.tolist() == [15.035, 14.027, 14.027, 15.035] + [15.9994] * 3
    # given masses take precedence over the file's
    full = tmp_path / "system.data"
    full.write_text(DATA)
    top = sp.read_lammps_data(full, masses={3: 16.0})
    assert top.masses.tolist() == [15.035, 14.027, 14.027, 15.035] + [16.0] * 3


def test_missing_file_and_bad_style(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file"):
        sp.read_lammps_data(tmp_path / "nope.data")
    with pytest.raises(ValueError, match="atom_style"):
        sp.read_lammps_data(tmp_path / "nope.data", atom_style="sphere")
