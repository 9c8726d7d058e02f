"""Molten NaCl at 1200 K: the Tosi-Fumi potential, smooth PME, a thermostat.

Builds a rock-salt lattice of Na+ and Cl- ions expanded to the density of the melt
(Janz 1988: 2.139 - 5.43e-4 T g/cm^3, 1.487 g/cm^3 at 1200 K), draws Maxwell-Boltzmann
velocities at twice the temperature, melts the lattice under a strongly coupled
thermostat, then runs production under a weakly coupled one (Bussi stochastic velocity
rescaling, or a Nose-Hoover chain). The energy is the Born-Mayer-Huggins short-range
pair potential with the Tosi-Fumi parameters (sp.born_mayer_huggins, sp.tosi_fumi_nacl),
shifted to zero at the cutoff, plus smooth PME for the charges +-1 e. Prints the
temperature, the energy, the first peaks of the Na-Cl, Na-Na and Cl-Cl radial
distributions and both ions' self-diffusion coefficients next to published values.
Units: nm, ps, amu, kJ/mol, e, K.

The default run is short (1 + 2 ps of 512 ions): its g(r) peaks are good, its diffusion
coefficients rough (few time origins). Give --steps 10000 or more for numbers to quote.

    python examples/molten_salt.py --plot out/molten_salt.png --out out/molten_salt.npz
    simlib run molten_salt --n-cells 5 --steps 10000 --plot out/molten_salt.png
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from simlib import cli
from simlib import particles as sp
from simlib.particles import peak_position

KB = 0.00831446261815324          # kJ/mol/K
COULOMB = 138.935457644382        # kJ mol^-1 nm e^-2 (1 / 4 pi eps0)
AVOGADRO = 6.02214076e23
MASSES = (22.98977, 35.453)       # Na, Cl (amu)
# Published values for molten NaCl near 1100-1200 K
PEAK_REFERENCE = 0.27             # nm, Na-Cl g(r) first peak: about 2.7 A (X-ray, Urakawa et
#                                   al., Am. Mineral. 84, 341 (1999); neutron, Edwards et al.,
#                                   J. Phys. C 8, 3483 (1975))
D_REFERENCE = 1.0e-4              # cm^2/s, both ions, about 1e-4 near 1200 K (Tosi-Fumi MD:
#                                   Lewis & Singer, J. Chem. Soc. Faraday Trans. 2 71, 41 (1975))


def melt_density(temperature: float) -> float:
    """The density of molten NaCl in g/cm^3 (Janz, J. Phys. Chem. Ref. Data 17, Suppl. 2
    (1988): 2.139 - 5.43e-4 T, fitted over 1080-1300 K)."""
    return 2.139 - 5.43e-4 * temperature


def rock_salt(n_cells: int, density: float):
    """Positions ``(8 m^3, 3)``, species (0 Na, 1 Cl) and the cubic box side (nm) of a
    rock-salt lattice of ``m^3`` conventional cells at ``density`` g/cm^3."""
    m = int(n_cells)
    pairs = 4 * m**3
    box = (pairs * (MASSES[0] + MASSES[1]) / AVOGADRO / density) ** (1.0 / 3.0) * 1e7
    a = box / m
    fcc = np.array([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]])
    cells = np.stack(np.meshgrid(*[np.arange(m)] * 3, indexing="ij"), -1).reshape(-1, 3)
    na = (cells[:, None, :] + fcc[None]).reshape(-1, 3)
    x = np.concatenate([na, na + [0.5, 0.0, 0.0]]) * a % box
    return x, np.repeat([0, 1], pairs), box


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n-cells", type=cli.positive_int, default=4,
                   help="rock-salt cells per side (8 ions each; 4 = 512 ions, 5 = 1000)")
    cli.add_md_options(p, temperature=1200.0, equil_steps=500,
                       equil_help="melting steps (Bussi, tau = 0.05 ps, from velocities at "
                       "2 T); 0 for none", steps=1000, r_cut=1.0,
                       r_cut_help="cutoff of the short-range pairs and of PME's real-space "
                       "sum, nm")
    cli.add_output_options(p, x64=False)
    args = p.parse_args(argv)
    cli.check_md_frames(p, args)
    if not 0 < melt_density(args.temperature):
        p.error(f"argument --temperature: no melt density at {args.temperature:g} K")
    box = rock_salt(args.n_cells, melt_density(args.temperature))[2]
    if args.r_cut + args.skin > box / 2:
        p.error(f"argument --r-cut: --r-cut + --skin = {args.r_cut + args.skin:g} exceeds half "
                f"the box ({box / 2:.3f} nm); use more --n-cells")
    return p, args


def partial_rdf(xa, xb, box: float, r_max: float, n_bins: int, same: bool):
    """The partial g_ab(r) of frames ``xa (f, na, 3)`` and ``xb (f, nb, 3)`` (minimum
    images): pair counts over the ideal-gas count ``na nb 4 pi r^2 dr / V`` per frame."""
    edges = np.linspace(0.0, r_max, n_bins + 1)
    counts = np.zeros(n_bins)
    for a, b in zip(xa, xb, strict=True):
        d = a[:, None, :] - b[None, :, :]
        d -= box * np.round(d / box)
        r = np.sqrt(np.sum(d * d, axis=-1))
        if same:
            r = r[np.triu_indices(len(a), 1)]
        counts += np.histogram(r, edges)[0]
    na, nb = xa.shape[1], xb.shape[1]
    pairs = na * (na - 1) / 2 if same else na * nb
    shells = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    g = counts / (len(xa) * pairs * shells / box**3)
    return 0.5 * (edges[1:] + edges[:-1]), g


@cli.script
def main(argv: list[str] | None = None) -> None:
    parser, args = parse(argv)
    say = cli.printer(args.quiet)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.result_type(float)
    density = melt_density(args.temperature)
    x0, species, box = rock_salt(args.n_cells, density)
    n = len(x0)
    space = sp.periodic(box)
    short = sp.pair_energy(sp.born_mayer_huggins, space, args.r_cut, shift=True)
    pme = sp.pme(space, args.r_cut, tolerance=args.tolerance, coulomb_constant=COULOMB)
    energy = short + pme
    params = {**sp.tosi_fumi_nacl(dtype), "species": jnp.asarray(species),
              "charges": jnp.asarray(np.where(species == 0, 1.0, -1.0), dtype)}
    masses = jnp.asarray(np.where(species == 0, *MASSES), dtype)
    kT = KB * args.temperature
    nf = 3 * (n - 1)
    key_v, key_eq, key_run = jax.random.split(jax.random.key(args.seed), 3)
    positions = jnp.asarray(x0, dtype)
    v = sp.maxwell_boltzmann(masses, 2 * kT, key=key_v)
    v = v - jnp.sum(masses[:, None] * v, axis=0) / jnp.sum(masses)     # zero momentum
    nbrs = sp.neighbor_list(space, positions, r_cut=args.r_cut, skin=args.skin)
    state = sp.State(positions, v, masses)
    say(f"{n} ions (NaCl, Tosi-Fumi) in a box of {box:.4f} nm ({density:.3f} g/cm^3), "
        f"{positions.dtype}; r_cut {args.r_cut} nm, PME alpha {float(pme.alpha):.3f}/nm, "
        f"grid {pme.grid}, order {pme.order}")
    chunk = math.gcd(args.equil_steps, args.steps) if args.equil_steps else args.steps
    chunk = max(args.save_every, min(chunk, 1000) // args.save_every * args.save_every)
    common = dict(space=space, dt=args.dt, save_every=args.save_every, chunk_steps=chunk)

    start = time.perf_counter()
    if args.equil_steps:
        eq = sp.simulate(energy, state, params, n_steps=args.equil_steps, neighbors=nbrs,
                         integrator=sp.Bussi(kT, 0.05), key=key_eq,
                         progress=not args.quiet, **common)
        state, nbrs = eq.final, eq.neighbors
        t_eq = 2 * np.asarray(eq.kinetic_energy) / (nf * KB)
        say(f"melting: {args.equil_steps} steps ({args.equil_steps * args.dt:g} ps) in "
            f"{time.perf_counter() - start:.1f} s with compilation; T at the end "
            f"{t_eq[-1]:.1f} K, U at the end {float(eq.potential_energy[-1]) / (n / 2):.2f} "
            f"kJ/mol per ion pair")
    thermostat = (sp.Bussi(kT, args.tau) if args.thermostat == "bussi"
                  else sp.NoseHooverChain(kT, args.tau))
    start = time.perf_counter()
    traj = sp.simulate(energy, state, params, n_steps=args.steps, neighbors=nbrs,
                       integrator=thermostat, key=key_run, progress=not args.quiet, **common)
    jax.block_until_ready(traj.positions)
    seconds = time.perf_counter() - start

    times = np.asarray(traj.times, float)
    x = np.asarray(traj.positions, float)
    temps = 2 * np.asarray(traj.kinetic_energy, float) / (nf * KB)
    u = np.asarray(traj.potential_energy, float) / (n / 2)
    conserved = np.asarray(traj.conserved, float) / (n / 2)
    n_blocks = 4
    frames = np.array_split(np.arange(len(times)), n_blocks)
    say(f"production: {args.steps} steps ({args.steps * args.dt:g} ps, {args.thermostat}, "
        f"tau {args.tau} ps) in {seconds:.1f} s ({args.steps / seconds:.0f} steps/s)")
    say(f"  T = {temps.mean():.1f} +- {sp.block_average(temps, n_blocks)[1]:.1f} K "
        f"(target {args.temperature:g}), U = {u.mean():.2f} +- "
        f"{sp.block_average(u, n_blocks)[1]:.2f} kJ/mol per ion pair; conserved quantity "
        f"drift {conserved[-1] - conserved[0]:+.2e} kJ/mol per ion pair")

    na, cl = x[:, species == 0], x[:, species == 1]
    r_max = min(0.8, box / 2)
    rdf = {}
    for name, a, b in (("Na-Cl", na, cl), ("Na-Na", na, na), ("Cl-Cl", cl, cl)):
        blocks = [partial_rdf(a[f], b[f], box, r_max, 160, name != "Na-Cl") for f in frames]
        r = blocks[0][0]
        g = np.mean([gb for _, gb in blocks], axis=0)
        peak_err = sp.block_average([peak_position(r, gb) for _, gb in blocks])[1]
        rdf[name] = (g, peak_position(r, g), peak_err)
    g, peak, peak_err = rdf["Na-Cl"]
    say(f"  Na-Cl g(r): first peak at {peak * 10:.3f} +- {peak_err * 10:.3f} A, height "
        f"{g.max():.2f} (experiment: about {PEAK_REFERENCE * 10:.1f} A)")
    for name in ("Na-Na", "Cl-Cl"):
        say(f"  {name} g(r): first peak at {rdf[name][1] * 10:.3f} +- "
            f"{rdf[name][2] * 10:.3f} A")

    to_cgs = 1e-2             # nm^2/ps = 1e-14 m^2 / 1e-12 s = 1e-2 cm^2/s
    window = (0.2, 0.6)
    tt = times - times[0]
    msd, d, d_err = {}, {}, {}
    for name, xi in (("Na", na), ("Cl", cl)):
        # every frame a time origin; the periodic frames are unwrapped inside
        msd[name] = np.asarray(sp.mean_square_displacement(xi, space, origins=1), float)
        d[name] = float(sp.diffusion_coefficient(tt, msd[name], dim=3, window=window))
        groups = np.array_split(np.arange(xi.shape[1]), n_blocks)
        d_err[name] = sp.block_average([sp.diffusion_coefficient(
            tt, sp.mean_square_displacement(xi[:, gr], space, origins=1), dim=3,
            window=window) for gr in groups])[1]
        say(f"  D({name}) = {d[name] * to_cgs:.2e} +- {d_err[name] * to_cgs:.1e} cm^2/s "
            f"(MSD fit over {window[0]:g}-{window[1]:g} of {tt[-1]:.2f} ps; Tosi-Fumi MD: "
            f"about {D_REFERENCE:.0e})")

    if args.out:
        cli.save_result(args.out, dict(model="NaCl Tosi-Fumi", n_ions=n,
                                       temperature=args.temperature,
                                       thermostat=args.thermostat, tau=args.tau, dt=args.dt,
                                       r_cut=args.r_cut, tolerance=args.tolerance,
                                       seed=args.seed, x64=args.x64, box=float(box)),
                        trajectory=traj, box=space, times=times, positions=x,
                        species=species, temperature=temps, potential_energy=u * (n / 2),
                        r=r, g_nacl=rdf["Na-Cl"][0], g_nana=rdf["Na-Na"][0],
                        g_clcl=rdf["Cl-Cl"][0], msd_na=msd["Na"], msd_cl=msd["Cl"],
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(2, 2, figsize=(12, 9))
        ax = axes.ravel()
        ax[0].plot(times, temps)
        ax[0].axhline(args.temperature, color="k", lw=0.5)
        ax[0].set(xlabel="t [ps]", ylabel="T [K]", title=f"Temperature ({nf} dof)")
        ax[1].plot(times, u, label="potential U")
        ax[1].plot(times, conserved, label="conserved quantity")
        ax[1].set(xlabel="t [ps]", ylabel="kJ/mol per ion pair", title="Energy")
        ax[1].legend()
        for name in ("Na-Cl", "Na-Na", "Cl-Cl"):
            ax[2].plot(r * 10, rdf[name][0], label=f"{name}: peak {rdf[name][1] * 10:.2f} Å")
        ax[2].axvline(PEAK_REFERENCE * 10, color="k", lw=0.5, ls="--")
        ax[2].axhline(1.0, color="k", lw=0.5)
        ax[2].set(xlabel="r [Å]", ylabel="g(r)", title="Partial radial distributions")
        ax[2].legend()
        for name in ("Na", "Cl"):
            ax[3].plot(tt, msd[name], label=f"{name}: D = {d[name] * to_cgs:.2e} cm²/s")
        ax[3].plot(tt, 6 * D_REFERENCE / to_cgs * tt, "k--", lw=0.8,
                   label="6 D t, D = 1e-4 cm²/s")
        ax[3].set(xlabel="t [ps]", ylabel="MSD [nm²]", title="Mean-square displacement")
        ax[3].legend()
        fig.suptitle(f"Molten NaCl (Tosi-Fumi), {n} ions, {args.temperature:g} K, "
                     f"{args.steps * args.dt:g} ps ({args.thermostat})")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"molten_salt: {n} ions, {args.equil_steps} + {args.steps} steps, "
                f"{traj.positions.dtype}", run_s=seconds,
                result=f"T {temps.mean():.1f} K, Na-Cl g(r) peak {peak * 10:.3f} A, "
                f"D(Na) {d['Na'] * to_cgs:.2e}, D(Cl) {d['Cl'] * to_cgs:.2e} cm^2/s")


if __name__ == "__main__":
    main()
