"""Particle systems: spaces, pair potentials, neighbour lists, dynamics and observables.

Example:
    >>> import jax
    >>> from simlib import particles as sp
    >>> positions, box = sp.lattice(4, 0.8442)          # 256 atoms, fcc
    >>> space = sp.periodic(box)
    >>> energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    >>> nbrs = sp.neighbor_list(space, positions, r_cut=2.5, skin=0.3)
    >>> v = sp.maxwell_boltzmann(1.0, 1.44, key=jax.random.key(0), n=len(positions))
    >>> traj = sp.simulate(energy, sp.State(positions, v, 1.0), dict(sigma=1.0, epsilon=1.0),
    ...                    space=space, dt=0.005, n_steps=100, save_every=10, neighbors=nbrs)
    >>> traj.positions.shape
    (11, 256, 3)
"""

from ._barostats import StochasticCellRescaling, molecular_pressure
from ._bonded import (
    AngleEnergy,
    PairCorrection,
    angle_energy,
    bond_angle,
    dihedral_angle,
    dihedral_energy,
    harmonic_angle,
    harmonic_improper,
    pair_correction,
    periodic_torsion,
)
from ._cells import CellList, cell_list, pair_search
from ._checkpoint import CheckpointError, checkpoint_info
from ._constraints import Rattle
from ._dynamics import NVE, Carry, Integrator, Langevin, State
from ._electrostatics import PME, Ewald, EwaldParameters, ewald, ewald_parameters, pme
from ._energy import BondEnergy, Energy, PairEnergy, bond_energy, forces, pair_energy
from ._initial import lattice, maxwell_boltzmann, plummer
from ._minimize import MinimizeResult, minimize
from ._mixing import MIXING_RULES
from ._model import Model
from ._neighbors import NeighborList, missing_pairs, neighbor_list, reallocate
from ._observables import (
    angular_momentum,
    block_average,
    diffusion_coefficient,
    kinetic_energy,
    mean_square_displacement,
    peak_position,
    pressure,
    pressure_tensor,
    radial_distribution,
    temperature,
    total_momentum,
)
from ._potentials import (
    born_mayer_huggins,
    coulomb,
    gravity,
    harmonic,
    lennard_jones,
    morse,
    tosi_fumi_nacl,
    wca,
)
from ._settle import Settle
from ._sharded import ShardedEnergy, sharded
from ._simulate import simulate
from ._space import Space, free, periodic
from ._thermostats import Bussi, NoseHooverChain
from ._topology import Topology, TopologyError, excluded_pairs, read_lammps_data
from ._trajectory import Trajectory
from ._water import Water, spce_energy, spce_water

__all__ = [
    "MIXING_RULES",
    "NVE",
    "NoseHooverChain",
    "AngleEnergy",
    "BondEnergy",
    "Bussi",
    "Carry",
    "CellList",
    "CheckpointError",
    "Ewald",
    "EwaldParameters",
    "PME",
    "Energy",
    "Integrator",
    "Langevin",
    "MinimizeResult",
    "Model",
    "NeighborList",
    "PairCorrection",
    "PairEnergy",
    "Rattle",
    "Settle",
    "Space",
    "ShardedEnergy",
    "State",
    "StochasticCellRescaling",
    "molecular_pressure",
    "Topology",
    "TopologyError",
    "Trajectory",
    "Water",
    "angle_energy",
    "angular_momentum",
    "block_average",
    "bond_angle",
    "born_mayer_huggins",
    "bond_energy",
    "cell_list",
    "checkpoint_info",
    "coulomb",
    "ewald",
    "ewald_parameters",
    "diffusion_coefficient",
    "dihedral_angle",
    "dihedral_energy",
    "excluded_pairs",
    "forces",
    "free",
    "gravity",
    "harmonic",
    "harmonic_angle",
    "harmonic_improper",
    "kinetic_energy",
    "lattice",
    "lennard_jones",
    "maxwell_boltzmann",
    "mean_square_displacement",
    "minimize",
    "missing_pairs",
    "morse",
    "neighbor_list",
    "pair_search",
    "pair_correction",
    "pair_energy",
    "periodic_torsion",
    "peak_position",
    "periodic",
    "pme",
    "plummer",
    "pressure",
    "pressure_tensor",
    "radial_distribution",
    "read_lammps_data",
    "reallocate",
    "sharded",
    "simulate",
    "spce_energy",
    "spce_water",
    "temperature",
    "total_momentum",
    "tosi_fumi_nacl",
    "wca",
]
