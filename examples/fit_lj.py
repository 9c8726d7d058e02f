"""Recover Lennard-Jones sigma and epsilon from reference forces on liquid configurations.

The reference forces come from an independent numpy implementation of the truncated LJ
force (all pairs, minimum image) at the true parameters, with optional Gaussian noise.
simlib's direct pair forces, with a neighbour list, are fitted to them with sl.fit
(optax L-BFGS on log sigma and log epsilon), and Gauss-Newton standard errors are reported.

    python examples/fit_lj.py --plot out/fit_lj.png
    simlib run fit_lj --noise 0.1 --out out/fit_lj.npz
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib import particles as sp

R_CUT = 2.5
SKIN = 0.3  # of the neighbour list of the melting run
DENSITY = 0.8  # atoms per sigma^3


def numpy_lj_forces(x: np.ndarray, box: float, sigma: float, epsilon: float) -> np.ndarray:
    """Truncated LJ forces by a plain all-pairs numpy sum (independent of simlib)."""
    d = x[:, None, :] - x[None, :, :]
    d -= box * np.round(d / box)
    r2 = np.sum(d * d, axis=-1)
    np.fill_diagonal(r2, np.inf)
    inside = r2 < R_CUT**2
    s6 = (sigma**2 / np.where(inside, r2, 1.0)) ** 3
    # -du/dr / r = 24 eps (2 s^12 - s^6) / r^2
    coef = np.where(inside, 24.0 * epsilon * (2.0 * s6 * s6 - s6) / r2, 0.0)
    return np.sum(coef[:, :, None] * d, axis=1)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--cells", type=cli.positive_int, default=4,
                   help="fcc cells per side (4 n^3 atoms); the box, cells x 1.71 sigma, must "
                   f"be at least 2 (r_cut + skin) = {2 * (R_CUT + SKIN):g}")
    p.add_argument("--frames", type=cli.positive_int, default=4, help="configurations used")
    p.add_argument("--sigma", type=cli.positive_float, default=1.05, help="true sigma")
    p.add_argument("--epsilon", type=cli.positive_float, default=0.85, help="true epsilon")
    p.add_argument("--noise", type=cli.positive_float, default=0.05,
                   help="force noise, as a fraction of the force's RMS")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed")
    p.add_argument("--steps", type=cli.positive_int, default=50, help="maximum L-BFGS steps")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    box = args.cells * (4.0 / DENSITY) ** (1.0 / 3.0) * args.sigma
    if R_CUT + SKIN > box / 2:   # minimum images (simlib's and numpy_lj_forces') need this
        p.error(f"argument --cells: the box, {box:.3f} for --cells {args.cells} and --sigma "
                f"{args.sigma:g}, must be at least 2 (r_cut + skin) = {2 * (R_CUT + SKIN):g}; "
                "use more --cells")
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import optax

    jax.config.update("jax_enable_x64", True)
    key = jax.random.key(args.seed)
    positions, box = sp.lattice(args.cells, DENSITY, dtype=jnp.float64)
    box_scaled = box * args.sigma
    positions = positions * args.sigma
    space = sp.periodic(box_scaled)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    true = dict(sigma=args.sigma, epsilon=args.epsilon)

    # Liquid configurations: melt the lattice with Langevin dynamics at kT = 1.5 epsilon.
    nbrs = sp.neighbor_list(space, positions, r_cut=R_CUT, skin=SKIN)
    v = sp.maxwell_boltzmann(1.0, 1.5 * args.epsilon, key=key, n=len(positions))
    traj = sp.simulate(energy, sp.State(positions, v, 1.0), true, space=space, dt=0.004,
                       n_steps=200 * (args.frames + 1), save_every=200, neighbors=nbrs,
                       integrator=sp.Langevin(1.5 * args.epsilon, 1.0), key=key)
    frames = traj.positions[1:]
    reference = np.stack([numpy_lj_forces(np.asarray(x), box_scaled, **true) for x in frames])
    rms = np.sqrt(np.mean(reference**2))
    noise = args.noise * rms * np.asarray(jax.random.normal(jax.random.fold_in(key, 1),
                                                            reference.shape))
    observed = jnp.asarray(reference + noise)
    lists = [sp.neighbor_list(space, x, r_cut=R_CUT, skin=0.0) for x in frames]
    force_fn = sp.forces(energy)

    def residuals(p):
        predicted = jnp.stack([force_fn(x, p, neighbors=nb) for x, nb in zip(frames, lists,
                                                                               strict=True)])
        return ((predicted - observed) / (args.noise * rms)).ravel()

    def loss(p):
        return jnp.mean(residuals(p) ** 2)

    guess = dict(sigma=0.9 * args.sigma, epsilon=1.3 * args.epsilon)
    res = sl.fit(loss, guess, optimizer=optax.lbfgs(), steps=args.steps, tol=1e-12,
                 transforms=dict(sigma=sl.Positive(), epsilon=sl.Positive()),
                 residuals=residuals, stderr=True, progress=not args.quiet)
    say = (lambda *a: None) if args.quiet else print
    say(f"{len(positions)} atoms, {args.frames} frames, force noise {args.noise:.0%} of RMS")
    for name in ("sigma", "epsilon"):
        fitted, err = float(res.params[name]), float(res.stderr[name])
        say(f"{name:8s} true {true[name]:.6f}  fitted {fitted:.6f} +- {err:.1e}  "
              f"(error {abs(fitted - true[name]) / true[name]:.2e}, "
              f"{abs(fitted - true[name]) / err:.1f} standard errors)")
    say(f"L-BFGS steps {int(res.n_steps)}, converged {bool(res.converged)}, "
          f"final loss {float(res.loss):.4f} (1 is the noise level)")

    fitted_forces = np.asarray(force_fn(frames[0], res.params, neighbors=lists[0]))
    if args.out:
        cli.save_result(args.out, dict(potential="lennard_jones", r_cut=R_CUT,
                                       noise=args.noise, seed=args.seed),
                        sigma=float(res.params["sigma"]), epsilon=float(res.params["epsilon"]),
                        sigma_stderr=float(res.stderr["sigma"]),
                        epsilon_stderr=float(res.stderr["epsilon"]),
                        history=np.asarray(res.history), frames=np.asarray(frames),
                        observed_forces=np.asarray(observed), box=float(box_scaled),
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        axes[0].plot(np.asarray(observed[0]).ravel(), fitted_forces.ravel(), ".", ms=2)
        lim = np.abs(fitted_forces).max()
        axes[0].plot([-lim, lim], [-lim, lim], "k--", lw=0.8, label="y = x")
        axes[0].set(xlabel="observed force component [epsilon/sigma]",
                    ylabel="fitted model force [epsilon/sigma]", title="forces, frame 1")
        axes[0].legend()
        axes[1].semilogy(np.asarray(res.history), lw=1)
        axes[1].set(xlabel="L-BFGS step", ylabel="loss (1 = noise level)", title="fit history")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"fit_lj: {len(positions)} atoms x {args.frames} frames, L-BFGS",
                compile_s=res.compile_time, run_s=res.run_time,
                result=", ".join(f"{k} {float(res.params[k]):.5f}±{float(res.stderr[k]):.1e} "
                                 f"(true {true[k]:g})" for k in ("sigma", "epsilon"))
                + f"; loss {float(res.loss):.3f}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
