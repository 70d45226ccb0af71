"""The refuse-first table: every option (or pair of options) refused before anything starts, written
once (:data:`RULES`: a test over the parsed options and its one-line message), and the entry points
that refuse it (:func:`refuse`): `train`'s check of its request (:data:`TRAIN`,
:func:`.requests.check`, the host-discovery options among them), a script of torchrun's contract
(:data:`TORCHRUN`, :func:`.requests.check_torchrun_options`) and such a script submitted to the
cluster (:data:`SUBMIT`, :func:`elastic_ring.cluster.client.script_form`). A rule names the entry
points where it applies; at each, the first rule of the table that applies is refused. What needs
more than the options (the script's source: :func:`.requests._check_collective`) stays beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from elastic_ring.controller.requests import BACKENDS, LR_SCALINGS, PLACEMENTS, RELAUNCH_CHOICES
from elastic_ring.errors import UserError

TRAIN = "train"  # requests.check: a RunRequest
TORCHRUN = "torchrun"  # requests.check_torchrun_options: a RunRequest of a torchrun-form script
SUBMIT = "submit"  # cluster.client.script_form: the SubmitOptions of a torchrun-form script


@dataclass(frozen=True)
class SubmitOptions:
    """What `elastic-ring submit` gives a torchrun-form script: its options and the cluster's
    config (None: no cluster set up yet)."""

    steps: int | None = None
    checkpoint_every: int | None = None
    target_loss: float | None = None
    cluster: Any = None


@dataclass(frozen=True)
class Rule:
    """One refusal: ``bad`` over the parsed options says it applies, ``line`` is its message (a
    template over ``o``, the options, and ``where``, the script's line of the torchrun forms; or a
    function of the options), ``at`` the entry points that refuse it."""

    at: tuple[str, ...]
    bad: Callable[[Any], bool]
    line: str | Callable[[Any], str]

    def says(self, o: Any, where: str = "") -> str:
        return self.line(o) if callable(self.line) else self.line.format(o=o, where=where)


def refuse(at: str, o: Any, where: str = "", error: type[Exception] = UserError) -> None:
    """Raise ``error`` with the message of the first rule of :data:`RULES` at ``at`` that applies
    to the options ``o`` (nothing when none does)."""
    for rule in RULES:
        if at in rule.at and rule.bad(o):
            raise error(rule.says(o, where))


def _not_applying(option: str, why: str) -> str:
    """A torchrun-form script's refusal: ``where`` says what the script is."""
    return f"{option} does not apply: {{where}}: {why}"


def _with_discovery(option: str, why: str) -> str:
    return f"--host-discovery-script does not go with {option}: {why}"


def _resnet(o: Any) -> bool:
    return any(v is not None for v in o.resnet_options())


_DISCOVERY_OPTIONS = (("--min-workers", "min_workers"), ("--max-workers", "max_workers"),
                      ("--discovery-interval", "discovery_interval"), ("--min-wait", "min_wait"),
                      ("--blacklist-cooldown-range", "cooldown_range"))


_FIXED_TOO = ("min_workers", "max_workers", "min_wait", "cooldown_range")


def _discovery_given(o: Any) -> list[str]:
    """The discovery options given where they do not apply (the bounds, --min-wait and the cooldown
    apply to a fixed host list too: prepare_hosts.fixed_hosts, requests.with_worker_range)."""
    return [name for name, key in _DISCOVERY_OPTIONS if getattr(o, key) is not None
            and not (key in _FIXED_TOO and (o.hosts or o.hostfile))]


def _fixed_bounds(o: Any) -> bool:
    """--min-workers/--max-workers over a fixed host list (no script): --workers MIN:MAX's bounds."""
    return not o.host_discovery_script and bool(o.hosts or o.hostfile) and (
        o.min_workers is not None or o.max_workers is not None)


def _cooldown_problem(o: Any) -> str | None:
    from elastic_ring.hosts.exclusion import parse_cooldown_range

    try:
        parse_cooldown_range(o.cooldown_range)
    except UserError as e:
        return str(e)
    return None


def _range(o: Any) -> str:
    return f"{o.worker_range[0]}:{o.worker_range[1]}"


_LIVE = "resize it live with `elastic-ring resize RUN_DIR --to N`"
_OWN_SNAPSHOT = "it saves and loads its own snapshot"
_ON_SCHEDULER = "its workers run on the scheduler's host"

RULES: tuple[Rule, ...] = (
    # train: the request on its own (before the script is read)
    Rule((TRAIN,), lambda o: bool(o.resume_dir) and bool(
        o.config_path or o.overrides or o.config is not None or o.script or o.script_args or _resnet(o)
        or o.global_batch is not None),
        "--resume continues a run with its own config and script: drop the config and script options "
        "(--steps N is the one that applies: the run's new total)"),
    Rule((TRAIN,), lambda o: o.lr_scaling is not None and o.lr_scaling not in LR_SCALINGS,
         f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}, got {{o.lr_scaling}}"),
    Rule((TRAIN,), lambda o: bool(o.resume_dir) and o.lr_scaling is not None,
         "--resume continues a run with its own LR rule: drop --lr-scaling"),
    Rule((TRAIN,), lambda o: o.lr_scaling == "auto" and not o.script,
         "--lr-scaling auto follows a --script's own LR scaling: the built-in ResNet takes "
         "linear, sqrt, none or constant-batch"),
    Rule((TRAIN,), lambda o: bool(o.resume_dir) and o.steps is not None and o.steps < 1,
         "--steps must be >= 1, got {o.steps}"),
    Rule((TRAIN,), lambda o: bool(o.script_args) and not o.script,
         "unexpected argument {o.script_args[0]!r} (script arguments go after `--script PATH --`)"),
    Rule((TRAIN,), lambda o: bool(o.script) and not Path(o.script).is_file(), "script {o.script} does not exist"),
    Rule((TRAIN,), lambda o: bool(o.script) and bool(o.config_path or o.overrides or o.config is not None
                                                     or _resnet(o)),
         "--script runs your own model: the ResNet options (--config, --set, --depth, --dataset, --batch-size, "
         "--lr, ...) do not apply; pass your script's own options after --"),
    Rule((TRAIN,), lambda o: o.stop_grace is not None and not o.script and not o.resume_dir,
         "--stop-grace goes with a --script of torchrun's contract (docs/torchrun.md)"),
    # a script's --global-batch (the ResNet's is its config's, checked there): a constant global batch
    # needs its size, which only the script's own batch can be split into
    Rule((TRAIN,), lambda o: bool(o.script) and o.global_batch is not None and o.lr_scaling != "constant-batch",
         "--global-batch goes with --lr-scaling constant-batch"),
    Rule((TRAIN,), lambda o: bool(o.script) and o.lr_scaling == "constant-batch" and o.global_batch is None,
         "--script with --lr-scaling constant-batch needs --global-batch N (samples per step; a multiple of "
         "the batch your script gives job.sampler)"),
    Rule((TRAIN,), lambda o: bool(o.script) and o.global_batch is not None and o.global_batch < 1,
         "--global-batch must be >= 1, got {o.global_batch}"),
    Rule((TRAIN,), lambda o: (o.resize_at is None) != (o.resize_to is None), "--resize-at and --to go together"),
    Rule((TRAIN,), lambda o: sum(bool(x) for x in (o.schedule, o.resize_at is not None, o.resizes)) > 1,
         "use either --resize-at/--to or --schedule, not both"),
    Rule((TRAIN,), lambda o: bool(o.hosts and o.hostfile), "use either --hosts or --hostfile, not both"),
    # --workers MIN:MAX: the bounds once (not beside --min-workers/--max-workers), for a new run (a
    # resumed one goes on at its own size)
    Rule((TRAIN,), lambda o: o.worker_range is not None and (o.min_workers is not None or o.max_workers is not None),
         lambda o: f"--workers {_range(o)} already gives the bounds: drop --min-workers/--max-workers"),
    Rule((TRAIN,), lambda o: o.worker_range is not None and o.workers is not None,
         lambda o: f"--workers {_range(o)} gives the bounds, and the start size is the most the slots hold: "
                   f"drop the count"),
    Rule((TRAIN,), lambda o: o.worker_range is not None and bool(o.resume_dir),
         lambda o: f"--resume goes on at the run's size: drop --workers {_range(o)} (--workers N resizes it)"),
    # --host-discovery-script: the hosts come from the script, on horovodrun's relaunch over hosts (the
    # Horovod workers, or torch.distributed ones: backends.torch_hosts), or in place with Horovod
    # (--relaunch inplace: over the hosts it lists first, or on this host only when that is
    # all it lists, prepare_hosts.host_manager; docs/hosts.md); the options that go with it go only with it
    # (--blacklist-cooldown-range with a fixed host list too)
    Rule((TRAIN,), lambda o: not o.host_discovery_script and bool(_discovery_given(o)),
         lambda o: f"{_discovery_given(o)[0]} goes with --host-discovery-script or --hosts/--hostfile"
                   if _discovery_given(o)[0] != "--discovery-interval"
                   else "--discovery-interval goes with --host-discovery-script"),
    Rule((TRAIN,), lambda o: _fixed_bounds(o) and o.workers is not None,
         "--min-workers/--max-workers over --hosts/--hostfile are the bounds, and the start size is the most "
         "the slots hold within them: drop the count"),
    Rule((TRAIN,), lambda o: _fixed_bounds(o) and bool(o.resume_dir),
         "--resume goes on at the run's size: drop --min-workers/--max-workers (--workers N resizes it)"),
    Rule((TRAIN,), lambda o: bool(o.host_discovery_script) and bool(o.hosts or o.hostfile),
         _with_discovery("--hosts/--hostfile", "the hosts come from the script")),
    Rule((TRAIN,), lambda o: bool(o.host_discovery_script) and o.backend == "ray",
         _with_discovery("--backend ray", "its nodes are Ray's")),
    Rule((TRAIN,), lambda o: bool(o.host_discovery_script) and o.slots is not None,
         _with_discovery("--slots", "the slots come from the script")),
    Rule((TRAIN,), lambda o: bool(o.host_discovery_script) and o.discovery_interval is not None
         and o.discovery_interval <= 0, "--discovery-interval must be > 0 seconds, got {o.discovery_interval:g}"),
    Rule((TRAIN,), lambda o: bool(o.host_discovery_script) and o.min_wait is not None and o.min_wait < 0,
         "--min-wait must be >= 0 seconds, got {o.min_wait:g}"),
    Rule((TRAIN,), lambda o: o.cooldown_range is not None and _cooldown_problem(o) is not None,
         lambda o: f"--blacklist-cooldown-range: {_cooldown_problem(o)}"),
    # the launcher
    Rule((TRAIN,), lambda o: o.backend not in BACKENDS,
         f"--backend must be one of {', '.join(BACKENDS)}, got {{o.backend}}"),
    Rule((TRAIN,), lambda o: o.relaunch not in RELAUNCH_CHOICES,
         f"--relaunch must be one of {', '.join(RELAUNCH_CHOICES)}"),
    # (in place over --hosts/--hostfile: the controller's HostManager over them, prepare_hosts.host_manager;
    # torch.distributed's in-place ring is launched on this host)
    Rule((TRAIN,), lambda o: o.relaunch == "inplace" and bool(o.hosts or o.hostfile) and o.collective == "torch",
         "--relaunch inplace runs on one host with --collective torch: drop --hosts/--hostfile, or use another "
         "relaunch mode"),
    Rule((TRAIN,), lambda o: o.backend == "ray" and bool(o.hosts or o.hostfile),
         "--backend ray takes its nodes from the Ray cluster: drop --hosts/--hostfile"),
    Rule((TRAIN,), lambda o: o.backend == "ray" and o.relaunch not in ("auto", "inplace"),
         "--backend ray resizes in place (warm workers): drop --relaunch {o.relaunch}"),
    Rule((TRAIN,), lambda o: o.backend != "ray" and bool(o.ray_address or o.warm_spares is not None
                                                        or o.placement != "PACK"),
         "--ray-address, --placement and --warm-spares go with --backend ray"),
    Rule((TRAIN,), lambda o: bool(o.survive) and o.backend != "ray" and o.relaunch != "inplace",
         "--survive goes with --backend ray or --relaunch inplace"),
    Rule((TRAIN,), lambda o: o.warm_spares is not None and o.warm_spares < 0,
         "--warm-spares must be >= 0, got {o.warm_spares}"),
    Rule((TRAIN,), lambda o: o.placement not in PLACEMENTS,
         f"--placement must be one of {', '.join(PLACEMENTS)}, got {{o.placement}}"),
    # a script of torchrun's contract reports no step to the controller and keeps its own snapshot: the
    # options that count steps, checkpoint, scale the LR or keep workers across a resize do not apply
    # (docs/torchrun.md); submitted to the cluster, its workers run on the scheduler's host
    Rule((TORCHRUN, SUBMIT), lambda o: o.steps is not None,
         _not_applying("--steps", "its length is its own (the controller counts no step of it)")),
    Rule((TORCHRUN,), lambda o: o.resize_at is not None or bool(o.schedule) or bool(o.resizes),
         _not_applying("--resize-at/--schedule", f"they name steps, which it does not report: {_LIVE}")),
    Rule((TORCHRUN,), lambda o: (o.checkpoint_every is not None or o.checkpoint_every_s is not None
                                 or o.keep is not None),
         _not_applying("--checkpoint-every/--checkpoint-every-s/--keep", _OWN_SNAPSHOT)),
    Rule((SUBMIT,), lambda o: o.checkpoint_every is not None, _not_applying("--checkpoint-every", _OWN_SNAPSHOT)),
    Rule((SUBMIT,), lambda o: o.target_loss is not None,
         _not_applying("--target-loss", "it reports no loss to the scheduler")),
    Rule((SUBMIT,), lambda o: o.cluster is not None and o.cluster.ray is not None,
         _not_applying("a Ray cluster", _ON_SCHEDULER)),
    Rule((SUBMIT,), lambda o: o.cluster is not None and bool(o.cluster.multi_host),
         _not_applying("a cluster over several hosts", _ON_SCHEDULER)),
    Rule((TORCHRUN,), lambda o: o.lr_scaling is not None or o.global_batch is not None,
         _not_applying("--lr-scaling/--global-batch", "its LR and batch are its own (it reads WORLD_SIZE)")),
    Rule((TORCHRUN,), lambda o: o.relaunch not in ("auto", "sequential"),
         _not_applying("--relaunch {o.relaunch}",
                       "every worker is stopped and started again at a resize, as torchrun does (sequential)")),
    Rule((TORCHRUN,), lambda o: bool(o.survive),
         _not_applying("--survive", "a failure stops every worker and starts them again, as torchrun does")),
    Rule((TORCHRUN,), lambda o: o.backend != "horovodrun", _not_applying("--backend {o.backend}",
                                                                          "its workers run on this host")),
    Rule((TORCHRUN,), lambda o: bool(o.hosts or o.hostfile),
         _not_applying("--hosts/--hostfile", "its workers run on this host only")),
    Rule((TORCHRUN,), lambda o: bool(o.host_discovery_script),
         _not_applying("--host-discovery-script", "its workers run on this host only")),
    Rule((TORCHRUN,), lambda o: o.stall_timeout is not None,
         _not_applying("--stall-timeout", "the controller sees no step of it")),
    Rule((TORCHRUN,), lambda o: o.stop_grace is not None and o.stop_grace < 0,
         "--stop-grace must be >= 0 seconds, got {o.stop_grace}"),
)
