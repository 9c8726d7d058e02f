"""A neural ODE: an MLP vector field learned from Lotka-Volterra trajectories, then extrapolated.

The truth is the predator-prey model of simlib.systems.lotka_volterra with its default
rates (alpha, beta, gamma, delta) = (1.5, 1, 3, 1): a few trajectories from different
initial populations, observed at regular times in a training window [0, t_train]. The
model is dy/dt = s * MLP((y - c) / s), a two-hidden-layer tanh perceptron (2 -> width ->
width -> 2, about 1,200 weights at the default width 32) with fixed centring c and scale s.
It is integrated with simlib's fixed-step RK4, all trajectories at once as one batched
(trajectories, 2) state, and trained with optax.adam on the mean squared error at the
observation times. The gradient with respect to every weight is reverse mode through
sl.solve with the default adjoint (nothing passed: with this many parameters simlib takes
reverse mode). The trained model is then run past the window, to t_end, and compared with
the truth there: the extrapolation error.

The weights are a plain pytree (a list of (W, b) pairs) passed to solve as ``args``, and
the MLP is four lines of jax.numpy: simlib depends on neither Flax nor Equinox, and an
Equinox module would work the same way (it is a pytree too), but the example stays free
of dependencies simlib does not have. The loss counts the observations up to a horizon
that grows over the first third of the steps (fitting the whole window at once often
stalls on a plateau). docs/neural-ode.md explains the example and its results.

    python examples/neural_ode.py                      # ~25 s on 2 cores
    python examples/neural_ode.py --plot out/neural_ode.png --steps 3000
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import simlib as sl
from simlib import cli
from simlib.systems import lotka_volterra

TRUE_ARGS = (1.5, 1.0, 3.0, 1.0)  # alpha, beta, gamma, delta: equilibrium (3, 1.5)
# the training trajectories: four nested orbits around the equilibrium, and one held out
Y0S = np.array([[3.5, 1.5], [4.0, 1.5], [4.5, 1.5], [5.0, 1.5]])
Y0_HELD_OUT = np.array([[4.25, 1.5]])
CENTRE = np.array([3.0, 1.5])  # the model's input centring (the equilibrium) ...
SCALE = np.array([2.0, 1.0])  # ... and scale, roughly the populations' spread


def init_mlp(key: jax.Array, width: int) -> list[tuple[jax.Array, jax.Array]]:
    """Weights of 2 -> width -> width -> 2: normal / sqrt(fan_in), the last layer x0.1."""
    sizes = [2, width, width, 2]
    keys = jax.random.split(key, len(sizes) - 1)
    params = []
    for i, (k, m, n) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True)):
        gain = 0.1 if i == len(sizes) - 2 else 1.0
        params.append((gain * jax.random.normal(k, (m, n)) / np.sqrt(m), jnp.zeros(n)))
    return params


def model(t, y, params):
    """dy/dt = s * MLP((y - c) / s) on the last axis of y (any leading batch axes)."""
    del t
    x = (y - CENTRE) / SCALE
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return (x @ w + b) * SCALE


def count(params) -> int:
    return sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(params))


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--steps", type=cli.positive_int, default=6000, help="adam steps")
    p.add_argument("--lr", type=cli.positive_float, default=1e-2,
                   help="adam learning rate (cosine decay to 1%% of it)")
    p.add_argument("--width", type=cli.positive_int, default=32, help="hidden layer width")
    p.add_argument("--t-train", type=cli.positive_float, default=4.0,
                   help="end of the training window")
    p.add_argument("--t-end", type=cli.positive_float, default=16.0,
                   help="end of the extrapolation test")
    p.add_argument("--dt", type=cli.positive_float, default=0.05, help="RK4 step")
    p.add_argument("--every", type=cli.positive_int, default=2,
                   help="observe every this many steps")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed of the initial weights")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if not args.t_train < args.t_end:
        p.error(f"argument --t-end: must be above --t-train ({args.t_train:g}), got "
                f"{args.t_end:g}")
    n_train = round(args.t_train / args.dt)
    n_end = round(args.t_end / args.dt)
    if (abs(n_train * args.dt - args.t_train) > 1e-9 * args.t_train
            or abs(n_end * args.dt - args.t_end) > 1e-9 * args.t_end
            or n_train % args.every or n_end % args.every):
        p.error("argument --t-train: --t-train and --t-end must be whole multiples of "
                "--dt * --every")
    args.n_train, args.n_end = n_train, n_end
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    n_train, n_end = args.n_train, args.n_end
    jax.config.update("jax_enable_x64", True)
    say = cli.printer(args.quiet)
    y0_all = np.concatenate([Y0S, Y0_HELD_OUT])  # training trajectories first
    n_fit = len(Y0S)
    # the observation times stay numpy (concrete): solve then knows its save grid statically
    ts = np.arange(0, n_end + 1, args.every) * args.dt
    k_train = n_train // args.every + 1  # the first k_train times are in the window
    # the truth: adaptive Dopri8 at tight tolerances, at every observation time
    truth = np.asarray(sl.solve(lotka_volterra, jnp.asarray(y0_all), 0.0, args.t_end,
                                solver=sl.Dopri8(), rtol=1e-12, atol=1e-12, args=TRUE_ARGS,
                                saveat=sl.SaveAt(ts=ts)).ys)
    y0, data = jnp.asarray(Y0S), jnp.asarray(truth[:k_train, :n_fit])

    def predict(params, y0, t1, save_ts):
        """The model's trajectories from the rows of y0, one batched (rows, 2) state."""
        # reverse mode through the solve: the adjoint is left to simlib's default
        return sl.solve(model, y0, 0.0, t1, solver=sl.RK4(), dt=args.dt, args=params,
                        saveat=sl.SaveAt(ts=save_ts)).ys

    def loss(params, y0, data, horizon):
        """Scaled mean squared error at the observation times up to ``horizon``."""
        pred = predict(params, y0, args.t_train, ts[:k_train])
        per_time = jnp.mean(jnp.square((pred - data) / SCALE), axis=(1, 2))
        weight = (ts[:k_train] <= horizon).astype(per_time.dtype)
        return jnp.sum(weight * per_time) / jnp.sum(weight)

    optimiser = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01))

    @jax.jit
    def update(params, state, y0, data, horizon):
        value, grad = jax.value_and_grad(loss)(params, y0, data, horizon)
        updates, state = optimiser.update(grad, state, params)
        return optax.apply_updates(params, updates), state, value

    params0 = init_mlp(jax.random.key(args.seed), args.width)
    say(f"MLP 2 -> {args.width} -> {args.width} -> 2 (tanh): {count(params0)} weights; "
        f"{n_fit} trajectories, window [0, {args.t_train:g}] ({k_train} observations each), "
        f"RK4 dt {args.dt:g} ({n_train} steps)")
    start = time.perf_counter()
    update = update.lower(params0, optimiser.init(params0), y0, data, 1.0).compile()
    compile_s = time.perf_counter() - start
    params, state = params0, optimiser.init(params0)
    history = []
    start = time.perf_counter()
    for step in range(args.steps):
        # curriculum: the fitted horizon grows from a quarter of the window to all of it
        # over the first third of the steps (a long window fitted from the start tends to
        # stall on a plateau where the model predicts a slow drift through the data)
        grow = min(1.0, step / max(1.0, args.steps / 3))
        horizon = args.t_train * (0.25 + 0.75 * grow)
        params, state, value = update(params, state, y0, data, horizon)
        history.append(value)
        if not args.quiet and (step + 1) % max(1, args.steps // 10) == 0:
            say(f"  step {step + 1:6d}  loss {float(value):.3e}")
    history = np.asarray(jax.device_get(history), dtype=float)
    train_s = time.perf_counter() - start

    final = jax.jit(lambda p, y0: predict(p, y0, args.t_end, ts))
    pred0 = np.asarray(final(params0, jnp.asarray(y0_all)))
    pred = np.asarray(final(params, jnp.asarray(y0_all)))

    def rms(a, times, rows):
        return float(np.sqrt(np.mean(np.square((a[times, rows] - truth[times, rows]) / SCALE))))

    inside, outside = slice(0, k_train), slice(k_train, None)
    regions = {f"fitted, inside [0, {args.t_train:g}]": (inside, slice(0, n_fit)),
               f"fitted, outside ({args.t_train:g}, {args.t_end:g}]": (outside, slice(0, n_fit)),
               f"held out, [0, {args.t_end:g}]": (slice(None), slice(n_fit, None))}
    say(f"trained {args.steps} adam steps in {train_s:.1f} s ({args.steps / train_s:.0f} "
        f"steps/s) + {compile_s:.1f} s compile; loss {history[0]:.3e} -> {history[-1]:.3e}")
    say("scaled RMS error against the true system (Dopri8, rtol 1e-12):")
    say(f"  {'trajectories, times':34s} {'untrained':>10s} {'trained':>10s} {'improvement':>12s}")
    summary_errors = []
    for name, (times, rows) in regions.items():
        e0, e1 = rms(pred0, times, rows), rms(pred, times, rows)
        summary_errors.append((name.split(" [")[0].split(" (")[0].rstrip(","), e1))
        say(f"  {name:34s} {e0:10.3e} {e1:10.3e} {e0 / e1:11.0f}x")

    if args.out:
        cli.save_result(args.out, dict(model="mlp", width=args.width, seed=args.seed),
                        ts=ts, t_train=args.t_train, dt=args.dt, y0=y0_all, n_fit=n_fit,
                        truth=truth, trained=pred, untrained=pred0, history=history,
                        centre=CENTRE, scale=SCALE,
                        **{f"w{i}": np.asarray(w) for i, (w, _) in enumerate(params)},
                        **{f"b{i}": np.asarray(b) for i, (_, b) in enumerate(params)},
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(15, 4.2))
        for i in range(len(y0_all)):
            c, held = f"C{i}", i >= n_fit
            ax0.plot(ts, truth[:, i, 0], "-", color=c, lw=1)
            ax0.plot(ts, pred[:, i, 0], ":" if held else "--", color=c, lw=1.2)
            ax1.plot(truth[:, i, 0], truth[:, i, 1], "-", color=c, lw=1)
            ax1.plot(pred[:, i, 0], pred[:, i, 1], ":" if held else "--", color=c, lw=1.2)
            if not held:
                ax1.plot(truth[:k_train, i, 0], truth[:k_train, i, 1], "o", color=c, ms=2)
        ax0.axvspan(0.0, args.t_train, color="0.9", zorder=0, label="training window")
        ax0.plot([], [], "k-", lw=1, label="truth")
        ax0.plot([], [], "k--", lw=1.2, label="neural ODE")
        ax0.plot([], [], "k:", lw=1.2, label="neural ODE, held-out start")
        ax0.set(xlabel="t", ylabel="prey", title="prey: truth vs model")
        ax0.legend(fontsize=8, loc="lower left")
        ax1.set(xlabel="prey", ylabel="predator",
                title="phase plane (dots: training observations)")
        ax2.semilogy(np.arange(1, len(history) + 1), history)
        ax2.set(xlabel="adam step", ylabel="loss (scaled MSE)", title="loss history")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"neural_ode: MLP width {args.width}, {args.steps} adam steps through RK4",
                compile_s=compile_s, run_s=train_s,
                result=f"loss {history[0]:.3e} -> {history[-1]:.3e}; scaled RMS error "
                + ", ".join(f"{name} {e:.3e}" for name, e in summary_errors))


if __name__ == "__main__":
    main()
