"""The one config layer (elastic_ring.config.base) under each of the four configs: train, ps, the
resize experiment's design and the ps experiment's design. The same one-line error shape, --set
over the file, frozen instances, the shared value types, and the CLI's exit status 2."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from elastic_ring.config.api import TrainConfig, config_to_dict, load_config
from elastic_ring.config.base import build, load
from elastic_ring.errors import ConfigError
from elastic_ring.experiment.resize import ResizeDesign, load_design as load_resize
from elastic_ring.ps.api import PSConfig
from elastic_ring.experiment.ps_design import DesignSpec, load_design as load_ps_design


def _train(path, sets):
    return load_config(path, sets)


def _ps(path, sets):
    return load(PSConfig, path, sets)


def _ps_design(path, sets):
    return load_ps_design(path, sets)


# name: (model whose keys an unknown-key error lists, loader, file, [unknown, wrong type, range],
#        (override that wins, how to read it back, value in the file, value set))
CONFIGS = {
    "train": (TrainConfig, _train, "depth: 20\nbatch_size: 16\n",
              [("bogus=1", "unknown key 'bogus'"),
               ("augment=maybe", "augment: wrong type, expected a boolean, got 'maybe'"),
               ("batch_size=0", "batch_size: must be >= 1, got 0")],
              ("batch_size=8", lambda c: c.batch_size, 16, 8)),
    "ps": (PSConfig, _ps, "workers: 2\nlr: 0.01\n",
           [("nonsense=1", "unknown key 'nonsense'"),
            ("workers=2.5", "workers: wrong type, expected an integer, got 2.5"),
            ("workers=0", "workers: must be >= 1, got 0")],
           ("lr=0.2", lambda c: c.lr, 0.01, 0.2)),
    "resize design": (ResizeDesign, load_resize,
                      "config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [5]\nrepeats: 2\nbogus: 1\n",
                      [(None, "unknown key 'bogus'"),
                       ("w_init=x", "w_init: wrong type, expected an integer, got 'x'"),
                       ("repeats=0", "repeats: must be >= 1, got 0")],
                      ("repeats=3", lambda d: d.repeats, 2, 3)),
    "ps design": (DesignSpec, _ps_design,
                  "seeds: [0, 1]\ntargets: [0.9]\nparallel: 1\nbase: {workers: 2, time_budget_s: 5}\n"
                  "paradigms:\n  - {name: A, sync: asp}\n",
                  [("bogus=1", "unknown key 'bogus'"),
                   ("parallel=x", "parallel: wrong type, expected an integer, got 'x'"),
                   ("bootstrap=10", "bootstrap: must be >= 100, got 10")],
                  ("parallel=3", lambda d: d.parallel, 1, 3)),
}


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def _clean(name, text):
    """The file without its deliberately unknown key (the resize design's case 0 is in the file)."""
    return text.replace("bogus: 1\n", "") if name == "resize design" else text


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("case", [0, 1, 2], ids=["unknown key", "wrong type", "out of range"])
def test_one_line_error_naming_the_key(tmp_path, name, case):
    model, loader, text, cases, _ = CONFIGS[name]
    p = _write(tmp_path, text if case == 0 else _clean(name, text))
    override, problem = cases[case]
    with pytest.raises(ConfigError) as ei:
        loader(p, [override] if override else [])
    msg = str(ei.value)
    source = f"{p} + overrides" if override else str(p)
    assert "\n" not in msg
    if case == 0:
        known = ", ".join(sorted(model.model_fields))
        assert msg == f"{source}: {problem} (known: {known})"
    else:
        assert msg == f"{source}: {problem}"


@pytest.mark.parametrize("name", CONFIGS)
def test_set_wins_over_the_file_and_the_result_is_frozen(tmp_path, name):
    _, loader, text, _, (override, read, in_file, wanted) = CONFIGS[name]
    p = _write(tmp_path, _clean(name, text))
    assert read(loader(p, [])) == in_file
    got = loader(p, [override])
    assert read(got) == wanted
    field = override.split("=")[0]
    with pytest.raises((ValidationError, dataclasses.FrozenInstanceError)):
        setattr(got, field, in_file)
    assert read(got) == wanted


def test_nested_configs_of_the_designs(tmp_path):
    p = _write(tmp_path, CONFIGS["ps design"][2])
    d = load_ps_design(p, ["base.time_budget_s=9", "targets=0.8,0.9"])
    cfg = d.cell("base", "A").cfg
    assert cfg.time_budget_s == 9 and cfg.workers == 2 and d.targets == (0.8, 0.9)
    with pytest.raises(ValidationError):
        cfg.workers = 3
    with pytest.raises(ConfigError) as ei:
        load_ps_design(p, ["base.nonsense=1"])
    assert str(ei.value).startswith(f"{p} + overrides heterogeneity 'base' paradigm 'A': unknown key 'nonsense' (known: ")
    with pytest.raises(ConfigError, match=r"\+ overrides: base: wrong type, expected a mapping, got 3$"):
        load_ps_design(p, ["base=3"])

    # resize: a design key changes the design, any other key joins the training overrides
    p = _write(tmp_path, "config: a.yaml\noverrides: {total_steps: 100, lr: 0.2}\nw_init: 1\nw_new: 2\n"
                         "resize_steps: [5]\n")
    d = load_resize(p, ["w_new=3", "total_steps=50", "resize_steps=5,10"])
    assert (d.w_new, d.resize_steps) == (3, (5, 10))
    assert d.overrides == {"total_steps": 50, "lr": 0.2}
    assert not set(ResizeDesign.model_fields) & set(TrainConfig.model_fields)  # the routing is unambiguous


@pytest.mark.parametrize("text,value", [("yes", True), ("no", False), ("on", True), ("off", False),
                                        ("1", True), ("0", False), ("true", True), ("FALSE", False)])
def test_bool_strings(text, value):
    assert build(TrainConfig, {"augment": text}, "t").augment is value
    assert build(PSConfig, {"augment": text}, "t").augment is value
    assert build(ResizeDesign, {"config": "a", "w_init": 1, "w_new": 2, "resize_steps": [5],
                                "vary_seed": text}, "t").vary_seed is value


@pytest.mark.parametrize("values,problem", [
    ({"depth": 2.5}, "depth: wrong type, expected an integer, got 2.5"),
    ({"depth": True}, "depth: wrong type, expected an integer, got True"),
    ({"lr": False}, "lr: wrong type, expected a number, got False"),
    ({"augment": 1}, "augment: wrong type, expected a boolean, got 1"),
    ({"depth": 21}, "depth: must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), got 21"),
    ({"dataset": "imagenet"}, "dataset: must be one of 'cifar10', 'synthetic' or 'digits', got 'imagenet'"),
    ({"decay_at": [0.8, 0.5]}, "decay_at: must be increasing fractions in (0, 1), got [0.8, 0.5]"),
    ({"decay_at": "0.5,x"}, "decay_at[1]: wrong type, expected a number, got 'x'"),
    ({"momentum": 1}, "momentum: must be < 1, got 1"),
    ({"min_step_s": -0.01}, "min_step_s: must be >= 0, got -0.01"),
    ({"synthetic_side": 4}, "synthetic_side: must be >= 8, got 4"),
    ({"a": 1, "b": 2, "width": 0}, "unknown keys 'a', 'b' (known: "),
])
def test_value_rules(values, problem):
    with pytest.raises(ConfigError) as ei:
        build(TrainConfig, values, "src")
    assert str(ei.value).startswith(f"src: {problem}")
    if "unknown keys" in problem:
        assert str(ei.value).endswith("; width: must be >= 1, got 0")


def test_value_types_read_alike():
    cfg = build(TrainConfig, {"depth": "32", "total_steps": 10.0, "decay_at": "0.5,0.75", "data_dir": 7}, "t")
    assert (cfg.depth, cfg.total_steps, cfg.decay_at, cfg.data_dir) == (32, 10, (0.5, 0.75), "7")
    assert build(TrainConfig, {"decay_at": [0.25, 0.5]}, "t").decay_at == (0.25, 0.5)
    ps = build(PSConfig, {"sync": "DSSP", "staleness": [3, 15], "workers": 2, "slowdown": "1,1.5"}, "t")
    assert (ps.sync, ps.staleness, ps.slowdown) == ("dssp", "3:15", (1.0, 1.5))
    assert build(PSConfig, {"sync": "ssp", "staleness": 3}, "t").staleness == "3"
    with pytest.raises(ConfigError, match=r"^t: staleness range for dssp needs 0 <= lo <= hi, got 15:3$"):
        build(PSConfig, {"sync": "dssp", "staleness": "15:3"}, "t")


def test_replace_revalidates_and_to_dict_round_trips():
    cfg = load_config("configs/cpu_small.yaml")
    assert cfg.replace(total_steps=7).total_steps == 7 and cfg.total_steps != 7
    with pytest.raises(ConfigError, match=r"^overrides: total_steps: must be >= 1, got 0$"):
        cfg.replace(total_steps=0)
    d = config_to_dict(cfg)
    assert d["decay_at"] == [0.5, 0.75] and json.loads(json.dumps(d)) == d
    assert build(TrainConfig, d, "config.yaml") == cfg

    ps = PSConfig(workers=2, slowdown=(1.0, 2.0))
    assert ps.replace(seed=4).seed == 4
    with pytest.raises(ConfigError, match=r"^overrides: slowdown has 2 factor\(s\) for 3 worker\(s\)$"):
        ps.replace(workers=3)
    assert PSConfig(workers=3).to_dict()["slowdown"] == [1.0, 1.0, 1.0]
    assert build(PSConfig, ps.to_dict(), "ps_config.json") == ps

    rd = ResizeDesign(config="a.yaml", w_init=1, w_new=2, resize_steps=(5,))
    assert rd.replace(repeats=3).repeats == 3
    with pytest.raises(ConfigError, match=r"^overrides: w_init and w_new are both 2: nothing to resize$"):
        rd.replace(w_init=2)


def test_ps_flags_do_not_mask_set():
    from elastic_ring.ps.api import build_config

    cfg = build_config(None, ("workers=3", "lr=0.3"), workers=None, lr=None, sync=None, staleness=None)
    assert (cfg.workers, cfg.lr) == (3, 0.3)
    cfg = build_config(None, ("workers=3",), workers=4, sync=None, staleness=None)
    assert cfg.workers == 4  # a dedicated flag wins over --set


# ------------------------------------------------------------------------------------ CLI
RESIZE = "config: {cfg}\nw_init: 1\nw_new: 2\nresize_steps: [5]\n"


@pytest.mark.parametrize("argv,needle", [
    (["train", "--set", "augment=maybe", "--run-dir", "{tmp}/run"],
     "+ overrides: augment: wrong type, expected a boolean, got 'maybe'"),
    (["profile", "--device", "cpu", "--set", "batch_size=0", "--out", "{tmp}/run"],
     "+ overrides: batch_size: must be >= 1, got 0"),
    (["ps", "--set", "workers=0", "--run-dir", "{tmp}/run"], "overrides: workers: must be >= 1, got 0"),
    (["ps", "experiment", "--config", "{tmp}/ps.yaml", "--set", "bogus=1", "--out", "{tmp}/run"],
     "ps.yaml + overrides: unknown key 'bogus' (known: base, "),
    (["ps", "experiment", "--config", "{tmp}/ps.yaml", "--set", "base.workers=0", "--out", "{tmp}/run"],
     "paradigm 'A': workers: must be >= 1, got 0"),
    (["experiment", "resize", "--config", "{tmp}/resize.yaml", "--set", "repeats=0", "--out", "{tmp}/run"],
     "resize.yaml + overrides: repeats: must be >= 1, got 0"),
    (["experiment", "resize", "--config", "{tmp}/resize.yaml", "--set", "lr=x", "--device", "cpu",
      "--out", "{tmp}/run"], "cpu_small.yaml + overrides: lr: wrong type, expected a number, got 'x'"),
])
def test_cli_bad_set_is_one_line_exit_2(cli_inproc, tmp_path, argv, needle):
    from tests.conftest import ROOT

    (tmp_path / "ps.yaml").write_text(CONFIGS["ps design"][2])
    (tmp_path / "resize.yaml").write_text(RESIZE.format(cfg=ROOT / "configs" / "cpu_small.yaml"))
    p = cli_inproc(*[a.format(tmp=tmp_path) for a in argv])
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("elastic-ring: error: ") and needle in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cmd", [["train"], ["profile"], ["ps"], ["ps", "experiment"], ["experiment", "resize"]])
def test_every_command_that_loads_a_config_takes_set(cli_inproc, cmd):
    p = cli_inproc(*cmd, "--help")
    assert p.returncode == 0 and re.search(r"--set\s+KEY=VALUE", p.stdout), p.stdout


def test_the_default_configs_are_package_data(tmp_path, monkeypatch):
    """With no path, the config comes from the package itself, not from a checkout's folder."""
    import elastic_ring
    from elastic_ring.config.api import packaged_config

    monkeypatch.chdir(tmp_path)  # no configs/ here
    pkg = Path(elastic_ring.__file__).resolve().parent
    assert packaged_config("cpu_small.yaml").resolve().parent == pkg / "configs"
    assert load_config(None).dataset == "digits"
    assert load_config(None, device="cuda").depth == 110
    # the docs' relative configs/NAME also names the packaged file outside a checkout
    assert load_config("configs/paper.yaml").depth == 110
    with pytest.raises(ConfigError, match="cannot read config configs/nope.yaml"):
        load_config("configs/nope.yaml")

