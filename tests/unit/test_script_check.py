"""A user's script read before anything starts (``elastic_ring.controller.script_check``): it
compiles, its collective, its loop; and `elastic-ring train --script` refusing what cannot run
with one line, exit status 2 and no run folder, or taking the collective the script makes plain."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elastic_ring.controller.requests import RunRequest, check, with_script_collective
from elastic_ring.controller.script_check import read_script
from elastic_ring.errors import UserError
from tests.conftest import ROOT

HVD_STEPS = """
import horovod.torch as hvd
import torch
import elastic_ring.worker as elastic

job = elastic.init()
for step in job.steps():
    pass
"""
DDP_EPOCHS = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from elastic_ring import worker as elastic

def main():
    job = elastic.init()
    for epoch in job.epochs(1, 3):
        pass
"""
DDP_BY_ATTRIBUTE = """
import torch
from elastic_ring.worker import init as start

job = start()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
for _ in job.steps():
    pass
"""
NEITHER = """
import torch
import elastic_ring.worker as elastic

job = elastic.init()
net, opt = job.parallel(torch.nn.Linear(2, 2), None)
sampler = torch.utils.data.distributed.DistributedSampler(range(4))  # torch's sampler: not torch.distributed
for _ in job.epochs(0, 2):
    pass
"""
BOTH = """
import horovod.torch as hvd
import torch.distributed as dist
"""
HVD_ELASTIC = """
import horovod.torch as hvd

@hvd.elastic.run
def train(state):
    pass
"""


def _write(tmp_path: Path, text: str, name: str = "s.py") -> str:
    f = tmp_path / name
    f.write_text(textwrap.dedent(text))
    return str(f)


@pytest.mark.parametrize("text,collective,steps,epochs,needs_steps", [
    (HVD_STEPS, "horovod", 7, 0, True),
    (DDP_EPOCHS, "torch", 0, 9, False),
    (DDP_BY_ATTRIBUTE, "torch", 7, 0, True),
    (NEITHER, None, 0, 8, False),
    (BOTH, None, 0, 0, False),
    (HVD_ELASTIC, "horovod", 0, 0, False),
])
def test_the_shape_read_from_the_text(tmp_path, text, collective, steps, epochs, needs_steps):
    shape = read_script(_write(tmp_path, text))
    assert shape.collective == collective
    assert (shape.steps_line, shape.epochs_line, shape.needs_steps) == (steps, epochs, needs_steps)
    assert shape.hvd_elastic == (text is HVD_ELASTIC)


def test_the_examples_read_as_what_they_are():
    ex = ROOT / "examples"
    assert read_script(ex / "ddp_epochs.py").collective == "torch"
    for name in ("mlp_digits.py", "mlp_epochs.py", "char_lm.py", "cnn_recipes.py", "paced.py", "hvd_elastic_mlp.py"):
        assert read_script(ex / name).collective == "horovod", name
    assert read_script(ex / "mlp_digits.py").needs_steps and not read_script(ex / "mlp_epochs.py").needs_steps
    assert read_script(ROOT / "tests" / "integration" / "scripts" / "paced_torch.py").collective is None  # job.parallel


def test_a_script_that_does_not_compile_names_its_file_and_line(tmp_path):
    bad = _write(tmp_path, "import torch\n\ndef f(:\n    pass\n")
    with pytest.raises(UserError, match=rf"^script {bad}:3 does not compile: "):
        read_script(bad)
    outside = _write(tmp_path, "x = 1\nreturn x\n", "r.py")  # what only the compiler refuses
    with pytest.raises(UserError, match=rf"{outside}:2 does not compile: 'return' outside function"):
        read_script(outside)


def test_request_checks_the_script_before_anything_starts(tmp_path):
    steps, ddp = _write(tmp_path, HVD_STEPS, "steps.py"), _write(tmp_path, DDP_EPOCHS, "ddp.py")
    with pytest.raises(UserError, match=rf"{steps}:7 loops over job.steps\(\).*give --steps N$"):
        check(RunRequest(script=steps))
    check(RunRequest(script=steps, steps=10))
    with pytest.raises(UserError, match=r"--collective torch, but .* imports horovod at line 2"):
        check(RunRequest(script=steps, steps=10, collective="torch"))
    with pytest.raises(UserError, match=r"--collective horovod, but .* uses torch.distributed \(line 3\) "
                                        r"and not Horovod: use --collective torch"):
        check(RunRequest(script=ddp, collective="horovod"))
    check(RunRequest(script=ddp))
    check(RunRequest(script=ddp, collective="torch"))
    check(RunRequest(script=_write(tmp_path, BOTH, "both.py"), collective="torch"))  # not plain: as before
    check(RunRequest(script=_write(tmp_path, NEITHER, "neither.py"), collective="horovod"))


def test_the_collective_a_script_makes_plain_is_taken_and_said(tmp_path):
    ddp = _write(tmp_path, DDP_EPOCHS, "ddp.py")
    req, said = with_script_collective(RunRequest(script=ddp))
    assert req.collective == "torch"
    assert said == f"elastic-ring: {ddp} uses torch.distributed (line 3) and not Horovod: --collective torch"
    for r in (RunRequest(script=_write(tmp_path, NEITHER, "n.py")), RunRequest(script=_write(tmp_path, HVD_STEPS)),
              RunRequest(script=ddp, collective="torch"), RunRequest(script=ddp, resume_dir="r")):
        assert with_script_collective(r) == (r, None)  # nothing to infer, or given, or the run's own


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _no_run(p, run: Path, *needles: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert not run.exists()  # refused before the run folder was made


def test_train_refuses_what_the_script_says_cannot_run(cli_inproc, tmp_path):
    syntax = _write(tmp_path, "import torch\nfor i in range(3)\n    pass\n", "syntax.py")
    steps, ddp = _write(tmp_path, HVD_STEPS, "steps.py"), _write(tmp_path, DDP_EPOCHS, "ddp.py")
    run = tmp_path / "run"
    _no_run(cli_inproc("train", "--script", syntax, "--steps", "4", "--run-dir", str(run)), run,
            f"{syntax}:2 does not compile")
    _no_run(cli_inproc("train", "--script", steps, "--run-dir", str(run)), run, f"{steps}:7", "give --steps N")
    _no_run(cli_inproc("train", "--script", steps, "--steps", "4", "--collective", "torch", "--run-dir", str(run)),
            run, "--collective torch, but", "imports horovod")
    _no_run(cli_inproc("train", "--script", ddp, "--collective", "horovod", "--run-dir", str(run)), run,
            "--collective horovod, but", "use --collective torch")
    # on torch by inference, what goes with --collective torch applies, and a refusal is still one line
    _no_run(cli_inproc("train", "--script", ddp, "--relaunch", "inplace", "--hosts", "a:1,b:1", "--run-dir",
                       str(run)), run, "--relaunch inplace runs on one host")
    _no_run(cli_inproc("train", "--script", ddp, "--device", "cuda", "--survive", "--relaunch", "inplace",
                       "--run-dir", str(run)), run, "--collective torch asks for NCCL" if not _has_gpu() else
            "--survive with --collective torch")


TORCHRUN = """
import os
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
"""
TORCHRUN_BY_NAME = """
from torch.distributed import init_process_group

init_process_group(backend="gloo")
"""


@pytest.mark.parametrize("text,form", [
    (TORCHRUN, "torchrun"),
    (TORCHRUN_BY_NAME, "torchrun"),
    ("import elastic_ring.worker\n" + TORCHRUN, "library"),  # the library's: it forms no group of its own
    ("from elastic_ring import worker\n" + TORCHRUN, "library"),
    ("import horovod.torch as hvd\n" + TORCHRUN, "library"),
    ("import torch.distributed as dist\n# dist.init_process_group('gloo') in a comment\n", "library"),
    (DDP_EPOCHS, "library"),
    (HVD_ELASTIC, "hvd_elastic"),
])
def test_the_torchrun_form_is_read_from_the_text(tmp_path, text, form):
    shape = read_script(_write(tmp_path, text))
    assert shape.form == form
    if form == "torchrun":
        line = text.count("\n", 0, text.index("init_process_group(")) + 1
        assert shape.collective == "torch" and shape.pg_init_line == line


def test_a_torchrun_script_is_checked_as_one(tmp_path):
    script = _write(tmp_path, TORCHRUN, "tr.py")
    check(RunRequest(script=script))
    check(RunRequest(script=script, collective="torch", relaunch="sequential", stop_grace=0.5))
    refused = [(dict(steps=10), "--steps does not apply"),
               (dict(resize_at=5, resize_to=2), "--resize-at/--schedule does not apply"),
               (dict(schedule="5:2"), "`elastic-ring resize RUN_DIR --to N`"),
               (dict(checkpoint_every_s=5.0), "--checkpoint-every/--checkpoint-every-s/--keep does not apply"),
               (dict(lr_scaling="linear"), "--lr-scaling/--global-batch does not apply"),
               (dict(relaunch="overlap"), "--relaunch overlap does not apply"),
               (dict(relaunch="inplace"), "--relaunch inplace does not apply"),
               (dict(hosts="a:1,b:1"), "--hosts/--hostfile does not apply"),
               (dict(stall_timeout=60.0), "--stall-timeout does not apply"),
               (dict(stop_grace=-1.0), "--stop-grace must be >= 0")]
    for kw, needle in refused:
        with pytest.raises(UserError, match=needle.replace("(", r"\(").replace("`", "`")):
            check(RunRequest(script=script, **kw))
    with pytest.raises(UserError, match=f"follows torchrun's contract \\(init_process_group at line 7\\)"):
        check(RunRequest(script=script, steps=10))
    with pytest.raises(UserError, match="--stop-grace goes with a script of torchrun's contract .* is not one"):
        check(RunRequest(script=_write(tmp_path, DDP_EPOCHS, "ddp.py"), stop_grace=5.0))
    with pytest.raises(UserError, match="--stop-grace goes with a --script of torchrun's contract"):
        check(RunRequest(stop_grace=5.0))
    req, said = with_script_collective(RunRequest(script=script))
    assert req.collective == "torch" and said.endswith("and not Horovod: --collective torch")


def test_train_refuses_options_that_do_not_apply_to_a_torchrun_script(cli_inproc, tmp_path):
    script, run = _write(tmp_path, TORCHRUN, "tr.py"), tmp_path / "run"
    _no_run(cli_inproc("train", "--script", script, "--resize-at", "5", "--to", "2", "--run-dir", str(run)), run,
            "--resize-at/--schedule does not apply", "elastic-ring resize RUN_DIR --to N")
    _no_run(cli_inproc("train", "--script", script, "--steps", "5", "--run-dir", str(run)), run,
            "--steps does not apply")
    _no_run(cli_inproc("train", "--script", _write(tmp_path, DDP_EPOCHS, "ddp.py"), "--stop-grace", "3",
                       "--run-dir", str(run)), run, "--stop-grace goes with a script of torchrun's contract")
