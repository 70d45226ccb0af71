"""Shared test set-up: the `gpu` marker is skipped where CUDA is absent; helpers to run the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Inside a Slurm job, `train` takes the allocation's nodes as its hosts (docs/hosts.md): the tests
# start their runs as if outside one (tests/integration/test_slurm_hosts.py sets the variables)
for _k in [k for k in os.environ if k.startswith("SLURM_")]:
    del os.environ[_k]

# One intra-op thread per worker process, so that the workers share the cores instead of
# oversubscribing them (spinning OpenMP threads): two tests at a time (make test) and a test run
# alone alike (a test's two workers fill the two cores already; an in-place hosts test alone took
# 47-59 s with the cores' share of 2 threads each, 15 s with 1)
os.environ.setdefault("ELASTIC_RING_CPU_THREADS", "1")


# One fork server per test process, shared by every run its integration tests start
# (ELASTIC_RING_ZYGOTE_SHARED, inherited by the controllers they start): a run's controller would
# otherwise start its own zygote and wait for its imports (torch, Horovod, torch._dynamo: about 3 s
# of CPU at each of the suite's few hundred runs). The workers' side is unchanged: each worker
# command hands itself to a zygote and its child runs the worker. Started with torch._dynamo (the
# runs whose workers would not import it fork from it all the same); a test of the controller's own
# zygote drops the variable (tests/integration/test_zygote.py). ELASTIC_RING_TEST_SHARED_ZYGOTE=0:
# each run starts its own, as outside the tests.
_SHARED_ZYGOTE: list = []


@pytest.fixture(scope="session", autouse=True)
def _shared_zygote(request):
    if (any("integration" in it.keywords for it in request.session.items) and not _SHARED_ZYGOTE
            and os.environ.get("ELASTIC_RING_TEST_SHARED_ZYGOTE", "1") != "0"
            and not os.environ.get("ELASTIC_RING_NO_ZYGOTE")):
        from elastic_ring import env as envvars
        from elastic_ring.worker import zygote

        p, name = zygote.start(compile_=True)
        _SHARED_ZYGOTE.append(p)
        if p is not None:
            import atexit

            os.environ[envvars.ZYGOTE_SHARED] = name
            atexit.register(lambda: (p.kill(), p.wait()))
    yield


# The integration tests in this order first, longest first (seconds: the fresh-clone CI run,
# results/ci/fresh_clone_ci.txt). Under `make test` (-n 2 --dist worksteal) the first worker runs the
# list from the front while the second runs unit tests, then takes work from the end of the first's
# queue. The tests that share a session-wide run (shared_dir) lead the list, each group in a row:
# the first worker runs them one after the other before the second worker ever reaches them, so
# none waits on the other worker's lock while it makes the run (in the last CI run
# test_resize...[auto] took 26 s that way, waiting for test_ray's run). The groups: test_ray's
# reference is the 1 -> 2 -> 1 overlap run of test_resize...[auto] and test_inplace's reference;
# the live resize run is test_tensorboard's; the straight 2-worker run is the reference of three
# test_recovery tests.
_LONGEST_FIRST = (  # times: one whole-suite run (-n 3 on 2 cores, so longer than alone)
    "test_ray_on_a_real_two_node_cluster",  # 301 s
    "test_kill_9_of_rank_1_the_survivor_goes_on_from_memory_and_a_new_actor_grows_it_back",  # 67 s
    "test_kill_9_of_rank_1_a_warm_spare_takes_its_place_as_if_nothing_happened",  # 46 s
    "test_a_horovod_elastic_script_on_ray_rolls_back_to_its_last_commit_in_memory",  # 39 s (alone, under load)
    "test_an_epoch_loop_killed_inside_an_epoch_goes_on_from_memory_and_grows_back",  # 22 s (test_ray_survive's cluster)
    "test_survive_on_a_sharded_epoch_loop_on_ray_goes_on_from_the_neighbours_replica",  # 70 s (alone, load ~11)
    "test_torch_on_two_hosts_launched_by_horovodrun_is_exact_and_equals_the_horovod_run",  # 29 s (alone, under load)
    "test_hvd_elastic_script_resized_1_2_1_unchanged",  # 40 s
    "test_epoch_loop_script_resized_1_2_1_exact_samples_lr_and_tests",  # 37 s
    "test_resize_1_to_2_to_1_exact_resume_eq7_and_overheads",  # 19 s
    "test_inplace_grow_and_shrink_equals_checkpoint_relaunch",  # 10 s
    "test_torch_resize_1_2_1_overlap_is_exact_and_equals_the_horovod_run",  # 47 s
    "test_torch_resize_1_2_1_inplace_keeps_rank_0_and_equals_the_horovod_run",  # 17 s
    "test_live_resize_from_another_shell_then_interrupt_and_resume",  # 0 s
    "test_curves_equal_events_across_a_resize_and_a_resume",  # 47 s
    "test_kill_9_of_one_rank_restarts_by_itself_exactly",  # 24 s
    "test_a_stopped_rank_is_found_by_the_stall_watchdog_and_the_run_ends_exactly",  # 24 s
    "test_kill_9_of_the_controller_leaves_no_orphan_and_resume_is_exact",  # 24 s
    # the constant-batch tests share their unresized reference run (shared_dir): in a row
    "test_resized_constant_batch_trains_as_the_unresized_run",  # 4 x 12-20 s (one run, this session's)
    "test_the_same_resizes_under_linear_change_the_training",  # 11 s
    "test_a_ddp_epoch_loop_over_job_parallel_trains_as_unresized",  # 2 x ~20 s (its helper's runs, loaded)
    # this session's new long tests (times alone on a loaded machine: the order, not a figure)
    "test_a_sigterm_to_one_worker_is_a_preempted_shrink",  # ~50 s
    "test_drain_shrinks_off_the_host_with_nothing_redone_and_its_one_line_errors",  # ~40 s
    "test_slurm_sigusr1_checkpoints_or_kills_past_the_grace_and_exits_with_the_requeue_status",  # ~30 s
    "test_sigterm_to_the_controller_with_grace_checkpoints_and_resume_continues",  # ~25 s
    "test_the_default_keeps_survivors_where_the_copy_is_cheap_and_not_where_it_is_dear",  # ~30 s
    "test_survive_on_a_sharded_epoch_loop_goes_on_from_the_neighbours_replica_inside_an_epoch",  # 25-33 s alone
    "test_survive_on_a_sharded_job_falls_back_to_the_sharded_checkpoint",  # 16 s
    "test_fsdp_resized_2_1_2_with_sharded_checkpoints_equals_ddp",  # 16 s
    "test_a_torchrun_script_submitted_unchanged_is_shrunk_for_a_newcomer_and_grown_back",  # 16-21 s
    "test_the_built_in_model_sharded_equals_its_ddp_run",  # 11 s
    "test_fsdp_resized_in_place_runs_the_script_again_and_equals_ddp",
    "test_an_epoch_loop_of_a_sharded_model_resized_2_1_2",
    "test_a_sigterm_to_one_worker_shrinks_the_ring_in_place_without_it",
    "test_one_host_slots_discovered_grow_and_shrink_the_ring_in_place",
    "test_a_sigterm_to_one_worker_under_one_host_discovery_leaves_in_place_and_stays_out",
    "test_the_hosts_table_shows_each_host_of_a_running_job",
    "test_the_checkpoint_copy_from_its_plan_is_dcps_state_dict",
    # the others by their time in that run (the session's new tests by their time in its full run;
    # those of the fresh-clone CI of 8688aaa by theirs there)
    "test_a_failed_host_is_left_out_for_its_cooldown_then_grown_back_onto",  # 41 s
    "test_kill_9_of_rank_1_then_a_stall_of_its_joiner_the_survivor_goes_on_from_memory_each_time",  # 29 s
    "test_torchrun_script_unchanged_kill_9_and_live_resizes_2_1_2_resume_from_its_snapshot",  # 28 s
    "test_the_job_grows_onto_a_discovered_host_and_shrinks_off_it",  # 24 s
    "test_a_job_steps_script_with_micro_batches_trains_as_unresized",  # 19 s
    "test_an_unchanged_epoch_loop_trains_as_unresized",  # 19 s
    "test_experiment_resize_compares_the_rules",  # 17 s
    "test_warmup_over_the_full_epoch_goes_on_across_resizes_and_the_lr_reported_is_the_one_trained",  # 15 s
    "test_a_ddp_script_that_does_not_scale_its_lr_keeps_it_and_the_start_says_so",  # 15 s
    "test_a_script_s_relative_paths_are_the_user_s_across_a_resize_and_a_resume",  # 13 s
    "test_weights_loaded_after_restore_stop_the_run_in_one_line",  # 12 s
    "test_outside_the_tool_the_library_sets_the_threads_as_the_tool_does",  # 12 s
    "test_own_resume_ahead_of_the_checkpoint_trains_every_sample_once",  # 11 s
    "test_three_jobs_shrink_cancel_and_scheduler_kill9",  # 81 s
    "test_gpu_check_dry_run_on_the_cpu",  # 61 s
    "test_profile_refused_then_accepted_fit_and_report",  # 53 s
    "test_tiny_design_end_to_end",  # 48 s
    "test_interrupt_and_resume_equals_uninterrupted_run",  # 47 s
    "test_status_through_a_run_then_runs_logs_and_an_extension",  # 45 s
    "test_recipes_example_resized_twice_exact_data_lr_and_early_stop",  # 44 s
    "test_char_transformer_resized_1_2_1_learns",  # 39 s
    "test_rank_0_killed_then_a_warm_joiner_then_its_stall_as_scheduled_resizes",  # 38 s
    "test_paced_example_keeps_its_pace_and_speeds_up_with_workers",  # 37 s
    "test_experiment_resize_tiny_one_repeat_and_report",  # 37 s
    "test_a_late_failure_keeps_the_earlier_sections_that_run_s_events_and_its_output",  # 36 s
    "test_a_stopped_rank_of_a_cluster_job_is_restarted_and_the_job_finishes",  # 34 s
    "test_bsp_on_the_wall_clock_through_the_ps_command",  # 34 s
    "test_death_between_two_resizes_resumes_at_the_right_size_with_the_rest_of_the_schedule",  # 32 s
    "test_a_rank_hung_while_running_is_named_by_its_heartbeat",  # 30 s
    "test_ddp_epoch_script_resized_1_2_1_resumes_inside_the_epoch_and_learns",  # 30 s
    "test_same_script_runs_under_plain_horovodrun",  # 29 s
    "test_epoch_loop_script_runs_as_plain_horovod_and_as_one_process",  # 29 s
    "test_resized_run_learns_as_well_as_unresized_on_real_digits",  # 27 s
    "test_mlp_on_digits_resized_1_2_1_learns",  # 26 s
    "test_ddp_epoch_script_runs_under_plain_torchrun",  # 26 s
    "test_live_page_rows_bars_escaping_and_update_without_reload",  # 25 s
    "test_a_horovod_elastic_script_rolls_back_to_its_last_commit_in_memory",  # 24 s
    "test_paradigms_on_the_virtual_clock_in_one_mpirun_and_bounds_hold",  # 24 s
    "test_the_same_script_under_plain_torchrun_saves_and_resumes_its_own_snapshot",  # 18 s
    "test_train_with_torch_resizes_and_without_collective_says_torch",  # 18 s
    "test_inplace_live_shrink_then_interrupt",  # 18 s
    "test_the_base_install_has_no_extra_and_its_cli_starts",  # 15 s
    "test_rank_failure_is_reported_in_one_line",  # 15 s
    "test_restarts_exhausted_exit_1_with_one_line",  # 15 s
    "test_horovodrun_two_gloo_ranks_allreduce",  # 15 s
    "test_corrupt_latest_checkpoint_resumes_from_the_previous_one",  # 14 s
    "test_hostfile_two_local_hosts",  # 12 s
    "test_below_the_minimum_it_waits_gives_up_then_resumes_on_the_hosts_discovered",  # 12 s
    "test_an_epoch_loop_survives_a_kill_inside_an_epoch_as_scheduled_resizes",  # 11 s
    "test_script_that_raises_before_its_first_step",  # 10 s
    "test_script_that_never_calls_the_library_fails_fast",  # 8 s
    "test_two_hosts_localhost_and_127_0_0_1",  # 7 s
    "test_a_process_group_formed_by_the_script_first_is_one_line_not_retried",  # 7 s
    "test_page_and_metrics_survive_a_scheduler_kill9_and_show_the_gap",  # 3 s
    "test_markers_and_hover_texts_drawn",  # 3 s
    "test_inplace_refuses_several_hosts",  # 2 s
    "test_mpirun_three_ranks_mpi4py",  # 2 s
    "test_missing_script_is_a_one_line_error",  # 0 s
)


def pytest_collection_modifyitems(config, items):
    # integration tests first: under `pytest -n 2` (make test) the long ones start early and the
    # short unit tests fill the gaps at the end instead of a long test running alone last; the
    # integration tests in the order of _LONGEST_FIRST, then the others (shorter) in file order
    def order(it):
        if "integration" not in it.keywords:
            return (1, 0)
        name = it.name.split("[")[0]
        return (0, _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST))
    items.sort(key=order)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def load_module(path: Path):
    """The Python file ``path`` (a script under scripts/ or examples/, not a package module) loaded
    as the module named by its stem, registered in ``sys.modules`` (dataclasses look their module
    up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def tool(name: str) -> str:
    """Path of a console tool of this venv (horovodrun, mpirun, elastic-ring)."""
    p = BIN / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (run scripts/setup.sh)")
    return found


def run_cli(*args: str, timeout: float = 600, cwd: str | Path | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``elastic-ring ARGS`` as a real subprocess and capture its output."""
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "elastic_ring.cli.main", *args], cwd=cwd or ROOT,
                          env=e, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    """A user mistake's answer: exit status 2, one line on stderr (no traceback) holding each needle."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def run_inproc(capsys, *args: str) -> subprocess.CompletedProcess:
    """``elastic-ring ARGS`` in this process, through the console script's entry point
    (``elastic_ring.cli.main.main``: the same one-line error path and exit status): returns what
    :func:`run_cli` would, without starting a process. For bad input and other work that starts
    no worker."""
    from elastic_ring.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, exit_.value.code, out, err)


@pytest.fixture
def cli_inproc(capsys):
    return lambda *args: run_inproc(capsys, *args)


def shared_dir(tmp_path_factory, name: str, produce) -> Path:
    """A folder made once per test session by ``produce(folder)`` (which raises on failure), shared
    by the tests that need the same expensive reference run, also across pytest-xdist's worker
    processes (each has a session of its own: a module-scoped fixture would run once in each).

    The first caller makes it under a file lock; the others wait for it, then read it (read only).
    A failed ``produce`` leaves nothing marked done: the next caller tries again (and fails with
    its own error)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above gw0/, gw1/ ...
    folder, done = base / f"shared-{name}", base / f"shared-{name}.done"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            produce(folder)
            done.touch()
    return folder


def ended(pid: int) -> bool:
    """Process ``pid`` has ended: gone, or a zombie (ended, not yet reaped by its parent or init).
    From ``/proc`` (Linux, as the tests' launches are)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_for(pred, timeout: float, what: str, poll: float = 0.3):
    """Poll ``pred`` until it returns something true (returned) or ``timeout`` seconds pass."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


# ELASTIC_RING_TEST_CPU=FILE: one JSON line per test (wall seconds, the CPU seconds of the pytest
# worker and of the child processes it waited for, the Python processes it started and those that
# imported torch), to find where the suite's time goes (tests/cpu_accounting.py)
if os.environ.get("ELASTIC_RING_TEST_CPU"):
    from tests.cpu_accounting import install as _install_cpu_accounting

    pytest_runtest_protocol = _install_cpu_accounting(os.environ["ELASTIC_RING_TEST_CPU"])
