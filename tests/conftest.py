"""Test configuration: float64 on for the tests only (simlib itself never flips it), and
JAX's persistent compilation cache, so that a program compiled once is loaded from disk by
every later module, job and run.

The cache lives in ``$SIMLIB_TEST_COMPILATION_CACHE`` (CI points the default and slow jobs
at one folder), else ``.pytest_cache/jax`` in the clone; ``off`` turns it off. JAX keys each
entry on the program's HLO, the compile options and the versions, so an edited solver
compiles anew and never reuses a stale entry.
"""

import gc
import os
from pathlib import Path

import jax
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)

_CACHE = os.environ.get("SIMLIB_TEST_COMPILATION_CACHE",
                        str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
if _CACHE.strip().lower() not in ("", "0", "off", "no", "false"):
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    # every program, however quick to compile: a test suite compiles thousands of small ones
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

settings.register_profile(
    "simlib",
    deadline=None,
    derandomize=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("simlib")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    XLA:CPU maps a few memory regions per compiled executable; one process that runs the
    whole slow job (thousands of executables) reached Linux's `vm.max_map_count` (65530)
    and segfaulted inside `backend_compile` (CI, 2026-12-05). Fixtures that share
    compilation are module- or function-scoped, so nothing shared is lost.
    """
    yield
    jax.clear_caches()
    gc.collect()


def _memory_maps() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs_when_maps_run_high():
    """The same within a module whose tests compile many programs (the adjoint table
    reached 31,000 maps in one module): clear once the process holds over 30,000 maps."""
    yield
    if _memory_maps() > 30_000:
        jax.clear_caches()
        gc.collect()

# Checks moved to the slow job (`python -m pytest tests -m slow`, CI's second step) to keep
# the default suite under 10 minutes on CI's 2 cores. Most have a cheaper sibling left in
# the default suite (another parameter, mode or strategy of the same check); the others
# (SDE path reproducibility and dt-independence, the Langevin cross-check, the 8-device
# sharding comparison) are whole checks that run in the slow job only; seconds are
# as measured on the 2-core machine (`--durations=0`, 2026-12-03).
SLOW_IN_DEFAULT = {
    # added 2026-12-05 (4.2-4.7 s each; siblings: [float32-0.05] and [float64-0.0], whose
    # gradient is covered by test_native's native-vs-pure gradient test; [t1])
    "test_particles.py::test_direct_gravity_kernel_matches_a_numpy_pair_sum_and_the_generic_kernel[float64-0.05]",
    "test_compact.py::test_equals_vmap_of_solve_member_by_member[ts+t0]",
    "test_particle_gradients.py::test_lj_parameter_gradients_match_finite_differences[ckpt-list]",
    "test_particle_dynamics.py::test_gradients_are_finite_at_the_cutoff_and_through_padded_slots",
    "test_sharding.py::test_outputs_carry_the_sharding_asked_for",
    "test_stiff.py::test_stiff_guide_runs_as_written",
    "test_blowup.py::test_blow_up_is_reported_under_jit_and_grad",
    "test_native_build.py::test_fallback_when_compiling_fails",
    "test_ensemble_gradients.py::test_checkpointed_saves_on_a_batched_state[sqrt-on]",
    "test_native.py::test_everything_works_without_native_kernels",
    "test_native.py::test_native_lj_and_simulate_equal_the_simlib_native_0_fallback",
    "test_native.py::test_native_lj_derivatives_equal_the_pure_jax_ones[False]",
    "test_native.py::test_native_lj_derivatives_equal_the_pure_jax_ones[True]",
    "test_native_build.py::test_fallback_when_no_compiler_is_on_path",
    "test_fit.py::test_lotka_volterra_recovers_parameters",
    "test_adjoint.py::test_runge_kutta_gradients_match_finite_differences[adaptive_tsit5-direct]",
    "test_cpu_loops.py::test_call_hoists_a_small_loop_over_1kib",
    "test_native.py::test_native_gravity_matches_numpy_and_pure_jax[float32]",
    "test_fit.py::test_projectile_hits_target_checked_by_scipy",
    "test_native.py::test_native_neighbor_build_equals_pure_build[3-True]",
    "test_fit.py::test_multiple_shooting_segments_match_scipy[14]",
    "test_native.py::test_native_neighbor_kernel_survives_extreme_positions[float32]",
    "test_sde.py::test_same_key_gives_bit_identical_paths_across_calls_jit_and_vmap",
    "test_sde.py::test_dyadic_values_do_not_depend_on_depth_or_area",
    "test_sharding.py::test_sharded_runs_equal_one_device_and_scipy",
    "test_sde_validation.py::test_both_engines_reach_the_equipartition_temperature",
    "test_sde_validation.py::test_kramers_tiny_run_writes_result_and_figure",
    "test_docs.py::test_custom_integrator_is_differentiable",
    "test_default_adjoint.py::test_simulate_checkpointed_segments_match_direct[30]",
    "test_adjoint.py::test_runge_kutta_strategies_agree[adaptive_tsit5]",
    "test_adjoint.py::test_reversible_agrees_with_direct_and_checkpointed[ts-VelocityVerlet]",
    "test_events.py::test_docs_events_page_runs",
    "test_adjoint.py::test_runge_kutta_gradients_match_finite_differences[adaptive_tsit5-checkpointed]",
    "test_default_adjoint.py::test_simulate_checkpointed_segments_match_direct[7]",
    "test_bdf.py::test_ensemble_dense_output_and_a_bad_member",
    "test_particle_gradients.py::test_box_gradient_matches_finite_differences[reversible-list]",
    "test_adjoint.py::test_reversible_agrees_with_direct_and_checkpointed[steps-VelocityVerlet]",
    "test_blowup.py::test_overlapping_atoms_raise_at_the_first_step[list-float32]",
    "test_neighbors.py::test_free_space_list_is_the_brute_force_pair_set",
    "test_bdf.py::test_jacobian_options_and_reuse",
    "test_default_adjoint.py::test_simulate_default_chooses_by_what_is_differentiated",
    "test_default_adjoint.py::test_few_parameters_take_forward_mode[adaptive]",
    "test_default_adjoint.py::test_default_keeps_forward_mode_transformations",
    "test_default_adjoint.py::test_many_components_take_reverse_mode[fixed]",
    "test_default_adjoint.py::test_simulate_energy_closing_over_a_traced_value",
    "test_default_adjoint.py::test_simulate_checkpointed_segments_match_direct[1]",
    "test_default_adjoint.py::test_simulate_checkpointed_segments_match_direct[45]",
    "test_default_adjoint.py::test_simulate_checkpointed_segments_match_direct[1000]",
    "test_neural_ode.py::test_the_examples_truth_is_scipys",
    "test_neural_ode.py::test_the_saved_trajectories_are_the_saved_weights",
    "test_neural_ode.py::test_training_beats_the_untrained_model_inside_and_outside_the_window",
    "test_neural_ode.py::test_the_plot_is_written_on_request",
    "test_ensemble_gradients.py::test_forward_mode_under_nested_vmap",
    "test_ensemble_gradients.py::test_forward_mode_under_vmap_per_member_inputs",
    "test_ensemble_gradients.py::test_checkpointed_saves_on_a_batched_state[sqrt-off]",
    "test_ensemble_gradients.py::test_checkpointed_saves_on_a_batched_state[seg7-off]",
    "test_default_adjoint.py::test_many_components_take_reverse_mode[adaptive]",  # 7.4
    "test_blowup.py::test_extreme_positions_never_crash_and_never_pass_quietly[1]",  # 11.5
    "test_fit.py::test_gauss_newton_through_an_adaptive_solve",  # 9.1
    "test_events.py::test_state_after_apply_gradient_matches_finite_differences[adaptive]",
    "test_transforms.py::test_grad_matches_finite_differences[adaptive_ts]",  # 7.6
    "test_native_build.py::test_corrupt_cached_library_is_rebuilt",  # 7.4
    "test_native_build.py::test_fallback_when_cxx_names_a_missing_program",  # 7.3
    "test_native.py::test_native_gravity_gradients_equal_the_pure_jax_ones",  # 7.2
    "test_adjoint.py::test_forward_mode_differentiates_the_times[adaptive]",  # 6.8
    "test_fit.py::test_pendulum_recovers_length_and_damping",  # 6.7
    "test_particle_dynamics.py::test_gradients_through_simulate_match_finite_differences",
    "test_rosenbrock.py::test_gradient_against_finite_differences[direct]",  # 6.3
    "test_adjoint.py::test_runge_kutta_gradients_match_finite_differences"
    "[adaptive_tsit5-checkpointed5]",  # 5.7
    "test_sdirk.py::test_convergence_order[Kvaerno5-5-ns3]",  # 5.2
    "test_stiff.py::test_gradient_against_finite_differences[checkpointed]",  # 4.8
    "test_sdirk.py::test_gradient_against_finite_differences[direct]",  # 4.5
    "test_particles.py::test_fire_relaxes_a_perturbed_fcc_crystal_to_the_lattice_energy"
    "[True]",  # 3.9
    "test_stiff.py::test_gradient_against_finite_differences[forward]",  # 3.0
    "test_systems.py::test_float32_kepler_exact_accuracy",  # 2.8
    # added 2026-12-05, second round: the default suite was 620 s here after this round's
    # new default tests (traced checks, mechanism tests, linear solvers, MD); each of these
    # has a sibling in the default suite (another tolerance, mode or problem of the check)
    # or is a distribution/reproducibility check of the Brownian path, seconds as measured
    "test_rosenbrock.py::test_within_ten_tolerances_of_the_reference"
    "[Rodas5P-van_der_pol_mu1000-0.0001]",  # 7.3
    "test_sharding.py::test_failure_check_does_not_gather_the_batch",  # 6.3
    "test_sde_validation.py::test_particle_engine_and_general_solver_agree",  # 6.3
    "test_rosenbrock.py::test_dense_output_against_radau_under_jit_and_vmap",  # 6.2
    "test_native.py::test_blown_up_lennard_jones_run_does_not_crash_the_process",  # 5.4
    "test_bdf.py::test_error_like_scipy_bdf[van_der_pol_mu1000-0.0001]",  # 5.0
    "test_particle_dynamics.py::test_overflow_under_jit_raises_or_is_reported",  # 4.6
    "test_sde.py::test_normals_pass_distribution_and_independence_checks",  # 4.4
    "test_sde.py::test_virtual_path_equals_the_tree_at_any_time",  # 4.4
    "test_io.py::test_docs_page_runs",  # 3.6
    "test_sde.py::test_path_has_brownian_covariances",  # 3.6
    "test_sde.py::test_adaptive_heun_converges_to_the_exact_solution_on_the_same_path",  # 3.4
    "test_sdirk.py::test_adaptive_ensemble_under_jit_vmap",  # 3.4
    "test_particle_dynamics.py::test_debug_list_reports_no_missed_pairs",  # 3.3
    "test_stiff.py::test_jit_vmap_and_dense_output",  # 3.2
    "test_transforms.py::test_pytree_state_matches_flat_state[adaptive_ts]",  # 3.2
    "test_sde.py::test_no_two_counters_of_a_tree_draw_the_same_normals",  # 2.9
    "test_sde.py::test_different_keys_give_uncorrelated_increments",  # 2.6
    "test_adjoint.py::test_forward_mode_differentiates_the_times[fixed]",  # 3.6
    "test_particle_gradients.py::test_langevin_kT_and_gamma_gradients_match_finite_differences"
    "[ckpt]",  # 3.1
    "test_compact.py::test_a_member_out_of_steps_fails_alone",  # 2.9
    "test_native.py::test_native_neighbor_build_equals_pure_build[3-False]",  # 2.8
    "test_native.py::test_native_lj_kernel_survives_extreme_inputs[float32]",  # 2.7
} | {  # Reversible vs Direct/Checkpointed: VelocityVerlet keeps every mode, 24 s in all
    f"test_adjoint.py::test_reversible_agrees_with_direct_and_checkpointed[{mode}-{solver}]"
    for mode in ("t1", "ts", "steps") for solver in ("Yoshida4", "PEFRL")
}


def _listed_slow_tests() -> set[str]:
    """The node ids in tests/slow_in_default.txt (third round of moves)."""
    from pathlib import Path

    lines = (Path(__file__).with_name("slow_in_default.txt").read_text().splitlines())
    return {line.split("#", 1)[0].strip() for line in lines} - {""}


SLOW_IN_DEFAULT |= _listed_slow_tests()


def pytest_collection_modifyitems(config, items):
    import pytest

    names = {item.nodeid.split("tests/", 1)[-1]: item for item in items}
    # a renamed test must not silently fall back into the default suite
    full_run = all(arg.rstrip("/").endswith("tests") for arg in config.args)
    missing = SLOW_IN_DEFAULT - set(names)
    if full_run and missing and not config.getoption("keyword"):
        raise pytest.UsageError(f"SLOW_IN_DEFAULT names unknown tests: {sorted(missing)}")
    for name in SLOW_IN_DEFAULT & set(names):
        names[name].add_marker(pytest.mark.slow)
