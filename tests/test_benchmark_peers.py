"""benchmarks/_particle_peers.py: the LAMMPS water data file it writes (read back by
``sp.read_lammps_data``: Angstrom, Angstrom/fs, types, bonds, angles) and the parsing of
LAMMPS's timing summary (breakdown and the FFT share of Kspace)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

import simlib.particles as sp

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_DIR))         # _particle_peers imports _timing from its folder
_spec = importlib.util.spec_from_file_location("benchmarks_particle_peers",
                                               _DIR / "_particle_peers.py")
peers = sys.modules["benchmarks_particle_peers"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


def test_water_data_file_reads_back_in_lammps_real_units(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((6, 3)) * 1.2                                   # nm
    v = rng.normal(size=(6, 3))                                    # nm/ps
    molecules = np.array([[0, 1, 2], [3, 4, 5]])
    path = tmp_path / "water.data"
    peers.write_lammps_water_data(str(path), x, 1.2, molecules, (15.9994, 1.008),
                                  (-0.8476, 0.4238), velocities=v)
    top = sp.read_lammps_data(path)
    np.testing.assert_allclose(top.positions, 10.0 * x, atol=1e-8)        # Angstrom
    np.testing.assert_allclose(top.velocities, 0.01 * v, rtol=1e-9)       # Angstrom/fs
    np.testing.assert_allclose(top.box, [12.0] * 3)
    np.testing.assert_array_equal(top.types, [1, 2, 2, 1, 2, 2])
    np.testing.assert_array_equal(top.molecules, [1, 1, 1, 2, 2, 2])
    np.testing.assert_allclose(top.charges, [-0.8476, 0.4238, 0.4238] * 2)
    np.testing.assert_allclose(top.masses, [15.9994, 1.008, 1.008] * 2)
    np.testing.assert_array_equal(top.bonds, [[0, 1], [0, 2], [3, 4], [3, 5]])
    np.testing.assert_array_equal(top.angles, [[1, 0, 2], [4, 3, 5]])


LOG = """Loop time of 3.69404 on 2 procs for 20 steps with 1536 atoms

MPI task timing breakdown:
Section |  min time  |  avg time  |  max time  |%varavg| %total
---------------------------------------------------------------
Pair    | 0.041222   | 0.044289   | 0.047357   |   1.5 |  1.20
Kspace  | 2.3516     | 2.3535     | 2.3555     |   0.1 | 63.71
Neigh   | 0          | 0          | 0          |   0.0 |  0.00
Comm    | 0.76338    | 0.77308    | 0.78279    |   1.1 | 20.93
Other   |            | 0.101      |            |       |  2.74

FFT time (% of Kspce) = 1.41999 (60.34)
Neighbor list builds = 3
Dangerous builds = 0
"""


def test_lammps_log_breakdown_and_fft_share_are_parsed():
    (run,) = peers._parse_runs(LOG)
    assert (run["loop_s"], run["procs"], run["steps"], run["atoms"]) == (3.69404, 2, 20, 1536)
    assert run["sections"]["Kspace"] == dict(avg_s=2.3535, percent=63.71)
    assert run["sections"]["Other"] == dict(avg_s=0.101, percent=2.74)
    assert (run["nbuild"], run["ndanger"]) == (3, 0)
    assert peers._FFT.findall(LOG) == [("1.41999", "60.34")]
