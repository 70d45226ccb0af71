"""Sharded checkpoints on disk (elastic_ring.ckpt.sharded) and a sharded job's checkpoint rules
(elastic_ring.worker.sharded, worker.checkpoints): DCP's folder written in this process alone (no
process group: DCP's single-process path), published, listed, pruned and read back in full."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from elastic_ring.ckpt import CheckpointStore, load
from elastic_ring.ckpt.sharded import complete, folder_name, load_full, partial_name, prune, publish
from elastic_ring.errors import CheckpointError


def _dcp_save(folder: Path, scale: float) -> dict:
    import torch.distributed.checkpoint as dcp

    sd = {"model": {"w": torch.arange(6.0).reshape(2, 3) * scale, "b": torch.ones(3) * scale},
          "optimizer": {"state": {"w": {"exp_avg": torch.full((2, 3), scale)}}, "param_groups": []}}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(folder)))
    return sd


def _checkpoint(ckpts: Path, step: int, keep: int = 2) -> dict:
    """What rank 0 does: DCP into the partial folder, published, then the checkpoint file."""
    partial = ckpts / partial_name(step, segment=0)
    sd = _dcp_save(partial, float(step))
    assert complete(partial)
    publish(ckpts, partial, step)
    CheckpointStore(ckpts, keep=keep).save({"step": step, "model": None, "optimizer": None,
                                            "sharded": folder_name(step), "cursor": step * 4})
    return sd


def test_a_sharded_checkpoint_is_listed_after_its_folder_and_loads_in_full(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for step in (3, 6, 9):
        sd = _checkpoint(ckpts, step)
    # the last two kept, their DCP folders with them; the first one's pruned with its file
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000006.pt", "ckpt-00000009.pt", "dcp-00000006",
                                                       "dcp-00000009", "latest.json"]
    state = load(tmp_path / "run")
    assert state["step"] == 9 and state["cursor"] == 36 and state["sharded"] == "dcp-00000009"
    assert torch.equal(state["model"]["w"], sd["model"]["w"]) and torch.equal(state["model"]["b"], sd["model"]["b"])
    assert torch.equal(state["optimizer"]["state"]["w"]["exp_avg"], torch.full((2, 3), 9.0))
    older = load(ckpts / "ckpt-00000006.pt")  # a given file: its own folder
    assert torch.equal(older["model"]["b"], torch.ones(3) * 6)


def test_a_half_written_checkpoint_is_never_resumed_and_is_cleared(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    _checkpoint(ckpts, 4)
    # a writer killed mid-save: shards written, no .metadata, never renamed, no checkpoint file
    partial = ckpts / partial_name(8, segment=1)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert not complete(partial)
    assert CheckpointStore(ckpts).load_latest()["step"] == 4  # the complete one
    with pytest.raises(CheckpointError, match="incomplete"):
        load_full(partial)
    # a folder whose checkpoint file is gone (or never written) is not kept either; the partial
    # folder of this segment may be another rank's next checkpoint, being written: kept
    (ckpts / "dcp-00000007").mkdir()
    (ckpts / partial_name(12, segment=2)).mkdir()
    prune(ckpts, ["ckpt-00000004.pt"], segment=2)
    assert sorted(p.name for p in ckpts.iterdir()) == [".dcp-00000012.partial-2", "ckpt-00000004.pt",
                                                       "dcp-00000004", "latest.json"]


def test_a_missing_dcp_folder_is_one_error_naming_it(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    _checkpoint(ckpts, 2)
    import shutil

    shutil.rmtree(ckpts / "dcp-00000002")
    with pytest.raises(CheckpointError, match="dcp-00000002 is missing or incomplete"):
        load(tmp_path)


def test_is_sharded_only_for_dtensor_parameters():
    from elastic_ring.worker.sharded import is_sharded

    assert not is_sharded(torch.nn.Linear(2, 2))
    assert not is_sharded(None) and not is_sharded({"w": torch.zeros(1)})


def _checkpoints(every: int = 0, every_s: float = 0.0):
    from elastic_ring.worker.checkpoints import Checkpoints

    info = types.SimpleNamespace(run_dir="/nonexistent", keep=2, checkpoint_every=every, checkpoint_every_s=every_s)
    c = Checkpoints(info, snapshot=None, progress=None, world_size=lambda: 2, current_lr=lambda: 0.1)
    return c


def test_a_sharded_job_checkpoints_at_the_same_step_on_every_rank():
    """Step-based: as for any job. Time-based: rank 0's clock says it once (until written); every
    rank writes when the vote carrying it is read, not on its own clock."""
    c = _checkpoints(every=0, every_s=0.01)
    vote = types.SimpleNamespace(checkpoint_asked=False, checkpoint_due=None)
    c.sharded, c.vote = object(), vote
    c._last_t -= 1.0  # a second since the last checkpoint: due on rank 0's clock
    assert not c.due(5, 100)  # not yet agreed: no rank writes on its own clock
    assert c.time_due() and not c.time_due()  # said once, until written
    vote.checkpoint_asked = True  # the vote carrying it was read
    assert c.due(6, 100) and not c.due(100, 100)  # (never at the segment's stop step: the end writes)
    s = _checkpoints(every=3)
    s.sharded, s.vote = object(), types.SimpleNamespace(checkpoint_asked=False)
    s.last_step = 4
    assert not s.due(6, 100) and s.due(7, 100)


def test_the_vote_carries_rank_0s_checkpoint_due():
    from elastic_ring.worker.segment import Segment, StopVote

    class Coll:
        def allreduce_async(self, t, name=""):
            self.sent = t.clone()
            return t

        def wait(self, h):
            return h

    for rank, due, asked in ((0, True, True), (0, False, False), (1, True, False)):
        ring = types.SimpleNamespace(rank=rank, coll=Coll())
        v = StopVote(Path("/nonexistent"), ring, Segment(0, 100, 100))
        v.checkpoint_due = lambda: due
        h = v.start(3)
        assert ring.coll.sent.numel() == 5  # (the flags, the period and lag, the checkpoint's slot)
        v.result(h)
        assert v.checkpoint_asked is asked  # (a real allreduce sums rank 0's flag into every rank's)
    plain = StopVote(Path("/nonexistent"), types.SimpleNamespace(rank=0, coll=Coll()), Segment(0, 100, 100))
    plain.result(plain.start(3))
    assert plain.ring.coll.sent.numel() == 4 and not plain.checkpoint_asked  # a job not sharded: no slot


def test_export_writes_the_full_model_of_a_sharded_checkpoint(capsys, tmp_path):
    from tests.conftest import one_line_error, run_inproc

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    sd = _checkpoint(ckpts, 5)
    r = run_inproc(capsys, "export", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt"))
    assert r.returncode == 0 and "the model of step 5 (2 tensors, 9 values" in r.stdout, r
    got = torch.load(tmp_path / "model.pt")
    assert got.keys() == {"w", "b"} and all(torch.equal(got[k], sd["model"][k]) for k in got)
    import shutil

    shutil.rmtree(ckpts / "dcp-00000005")  # its shards lost: one line, exit 2, nothing written
    r = run_inproc(capsys, "export", str(tmp_path / "run"), "--out", str(tmp_path / "again.pt"))
    one_line_error(r, "dcp-00000005 is missing or incomplete")
    assert not (tmp_path / "again.pt").exists()


def test_the_built_in_shard_option_says_in_one_line_what_it_needs(cli_inproc, tmp_path):
    from tests.conftest import one_line_error

    common = ["train", "--gpus", "1", "--dataset", "synthetic", "--steps", "2"]
    r = cli_inproc(*common, "--collective", "horovod", "--set", "shard=true", "--run-dir", str(tmp_path / "a"))
    one_line_error(r, "--set shard=true", "add --collective torch")
    r = cli_inproc(*common, "--collective", "torch", "--set", "shard=true", "--lr-scaling", "constant-batch",
                   "--global-batch", "32", "--run-dir", str(tmp_path / "b"))
    one_line_error(r, "shard=true does not go with lr_scaling constant-batch")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_optimizer_built_before_fully_shard_is_one_contract_error():
    from elastic_ring.worker.errors import ContractError
    from elastic_ring.worker.sharded import check_optimizer

    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    check_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
    check_optimizer(model, None)
    with pytest.raises(ContractError, match="build it after fully_shard"):
        check_optimizer(model, torch.optim.SGD(other.parameters(), lr=0.1))


def test_split_and_join_keep_the_tree_and_plain_tensors():
    from elastic_ring.worker.sharded import join, split

    sd = {"model": {"w": torch.ones(2)}, "optimizer": {"state": {"w": {"step": torch.tensor(3.0)}},
                                                        "param_groups": [{"lr": 0.1, "params": ["w"]}]}}
    specs: dict = {}
    local = split(sd, specs)
    assert specs == {} and local == sd and join(local, specs) == sd  # no DTensor: the same tree


def test_a_plain_model_is_told_apart_without_importing_dtensor():
    """Every worker asks whether its model is sharded at its start: for a plain model the answer
    must not cost DTensor's import (about 0.45 s, once paid at every relaunch's first step)."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from elastic_ring.worker.sharded import is_sharded\n"
            "assert 'torch.distributed.tensor' not in sys.modules\n"
            "assert not is_sharded(torch.nn.Linear(2, 2))\n"
            "assert 'torch.distributed.tensor' not in sys.modules, 'imported by is_sharded'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------- --survive: the replicas' bookkeeping
def test_pieces_split_as_torch_chunk_and_join_back_at_any_world():
    """A rank's piece (worker.sharded.box / piece_of) is torch.chunk's (DTensor's Shard, FSDP2's
    layout; uneven and empty parts too); the pieces of one world put together (assemble) are the
    tensor, re-split at another world as torch.chunk splits it."""
    from torch.distributed.tensor import Replicate, Shard

    from elastic_ring.worker.sharded import assemble, chunk, layout_of, piece_of

    for n in (0, 1, 5, 7, 8):
        for parts in (1, 2, 3, 4):
            got = [chunk(n, parts, i) for i in range(parts)]
            want = [c.shape[0] for c in torch.arange(n).chunk(parts)] if n else []
            assert [k for _, k in got if k] == want and sum(k for _, k in got) == n, (n, parts)
            assert all(off == sum(k for _, k in got[:i]) for i, (off, _) in enumerate(got)), (n, parts)
    assert layout_of((Shard(0),)) == (("shard", 0),) and layout_of((Replicate(),)) == (("replicate",),)
    assert layout_of((Shard(0), Replicate())) is None
    full = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    for ly in ((("shard", 0),), (("shard", 1),), (("replicate",),)):
        for old in (2, 3, 4):
            pieces = {k: piece_of(full, ly, old, k).clone() for k in range(old)}
            if ly[0][0] == "shard":
                dim = ly[0][1]
                assert [p.shape[dim] for p in pieces.values() if p.numel()] == \
                    [c.shape[dim] for c in full.chunk(old, dim)]
            back = assemble(tuple(full.shape), ly, old, pieces)
            assert torch.equal(back, full), (ly, old)
            for new in (1, 2, 3):
                for k in range(new):
                    want = full if ly[0][0] == "replicate" else \
                        (list(full.chunk(new, ly[0][1])) + [None] * new)[k]
                    got = piece_of(back, ly, new, k)
                    assert (got.numel() == 0 and want is None) or torch.equal(got, want), (ly, old, new, k)
    scalar = torch.tensor(3.0)  # (Adam's step: a scalar, replicated)
    assert torch.equal(assemble((), (("replicate",),), 2, {0: scalar, 1: scalar}), scalar)


def test_the_survivors_of_one_failure_hold_every_rank_s_shards_of_two_failures_not():
    """Rank r holds its shards and rank r-1's: after one failure every old rank has a holder
    (owners: the lowest new rank holding it; a joiner holds none); after two neighbours' deaths
    one rank's shards are nobody's (a CheckpointError, and the controller's agreement refuses
    the memory path before: a restart from the sharded checkpoint)."""
    from elastic_ring.seam import agreement
    from elastic_ring.worker.sharded import owners

    def held(world: int, r: int) -> dict:
        return {"world": world, "step": 7, "ranks": sorted({r, (r - 1) % world})}

    assert owners([held(2, 0)]) == {0: 0, 1: 0}  # rank 1 of 2 died: rank 0 holds both
    assert owners([held(3, 0), held(3, 1), None]) == {0: 0, 1: 1, 2: 0}  # rank 2 of 3 died; a joiner
    assert owners([held(4, 1), held(4, 2), held(4, 3)]) == {0: 0, 1: 0, 2: 1, 3: 2}
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\] of 3"):
        owners([held(3, 0)])  # ranks 1 and 2 of 3 died
    with pytest.raises(CheckpointError, match="do not match"):
        owners([held(3, 0), {**held(3, 1), "step": 6}])
    rec = lambda w, r: {"held": [6, 7], "shards": {"world": w, "ranks": held(w, r)["ranks"]}}  # noqa: E731
    assert agreement([rec(3, 0), rec(3, 1)], gone=1) == (7, None)
    step, why = agreement([rec(3, 0)], gone=2)
    assert step is None and "no copy of the shards of rank(s) [1] of 3" in why, why
    assert agreement([{"held": [6, 7]}], gone=1) == (7, None)  # a replicated model's: as before


def test_a_sharded_copy_reports_its_cost_and_every_rank_follows_the_word_at_the_same_copy(monkeypatch):
    """``survive.ShardedCopy`` under the default's measurement: its copy (the take: the shards and
    the neighbour's exchange) is timed and reported as any model's (``CostMeter``: one report
    after the skipped and timed copies); then the controller's word is followed only at a copy at
    which every rank has read it (the all_reduce's minimum; here the other rank's read given):
    "off" then stops the copies on all ranks alike. A take that gives None (the optimizer has no
    state yet) keeps nothing."""
    import torch.distributed as dist

    from elastic_ring.worker import survive

    others_read = {"now": 0}

    def all_reduce(t, op=None):
        t.fill_(min(int(t.item()), others_read["now"]))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    reports, word = [], {"on": None}
    meter = survive.CostMeter(reports.append, lambda: word["on"])
    takes = []

    def take(step, into):
        takes.append(step)
        return None if step == 0 else {"step": step}

    cp = survive.ShardedCopy(take, meter=meter)
    cp.keep(0)
    assert cp.held() == [] and takes == [0]
    n = survive.SKIP_COPIES + survive.TIMED_COPIES
    for step in range(1, n + 1):
        cp.keep(step)
    assert len(reports) == 1 and reports[0]["steps"] == survive.TIMED_COPIES and reports[0]["ratio"] > 0
    assert cp.held() == [n - 1, n] and cp.meter is meter
    word["on"] = False  # this rank reads "off"; the other has not read it yet: both go on copying
    cp.keep(n + 1)
    assert not cp.off and cp.meter is meter and cp.held() == [n, n + 1]
    others_read["now"] = 1  # the other rank has read it too: both stop at this copy
    cp.keep(n + 2)
    assert cp.off and cp.meter is None and cp.held() == []
    cp.keep(n + 3)
    assert takes[-1] == n + 2


_LAID_OUT = r'''
import copy, os, socket, types
import torch
import torch.distributed as dist

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.fsdp import fully_shard
from elastic_ring.ckpt import snapshot
from elastic_ring.worker.sharded import Copier, split, state_dicts

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3))
fully_shard(model)  # (the BatchNorm's buffers stay plain tensors)
st = types.SimpleNamespace(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), syncing=False)
opt = st.optimizer


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def train():
    opt.zero_grad()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()


c = Copier()
local = None


def take(laid_out):
    """One checkpoint's copy (the last one handed back first) against DCP's state dict of now;
    ``laid_out``: whether it followed the layout."""
    global local
    before, old = c.laid_out, tensors(local) if local is not None else []
    if local is not None:
        c.release(local)
    local, specs = c.copy(st)
    ref_specs = {}
    ref = snapshot(split(state_dicts(model, opt), ref_specs))
    assert same(local, ref), (local, ref)
    assert specs == ref_specs and len(specs) == 18, (sorted(specs), sorted(ref_specs))
    assert c.laid_out == before + laid_out, (c.laid_out, before, laid_out)
    return old


train()
take(False)  # DCP's call, the plan and the layout made
for _ in range(2):
    train()
    old = take(True)
    assert len(old) == 27 and all(a is b for a, b in zip(tensors(local), old))  # the written copy's tensors
p = next(iter(opt.state))
opt.state[p]["note"] = 7  # a value that is not a tensor in an optimizer's state
take(False)
train()
opt.state[p]["note"] = 8
opt.param_groups[0]["lr"] = 0.5
take(True)
assert local["optimizer"]["state"]["0.weight"]["note"] == 8 and local["optimizer"]["param_groups"][0]["lr"] == 0.5
bn = model[1]
bn.running_mean.data = torch.full((1,), 5.0)  # the same tensor resized (a copy into the old would broadcast)
take(False)
take(True)
bn.running_var.data = bn.running_var.data.double()  # the same tensor, another dtype
take(False)
take(True)
bn.running_mean.data, bn.running_var.data = torch.zeros(6), torch.ones(6)  # (as they were: to train on)
take(False)
opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # a restore: the state's tensors replaced
take(False)
train()
take(True)
opt.param_groups[0]["lr"] = torch.tensor(0.25)  # a tensor LR: the walk copies it
take(False)
opt.param_groups[0]["lr"] = 0.5
take(False)  # (no layout tried again for this plan)
opt = st.optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # a new optimizer: a new plan
train()
take(False)
train()
take(True)
dist.destroy_process_group()
print("laid out: every check held", c.laid_out)
'''


def test_a_laid_out_copy_is_dcps_state_dict_and_the_walk_takes_over_where_it_no_longer_fits():
    """The sharded checkpoint's copy along its layout (``worker.sharded.Copier`` once its plan
    holds: every tensor in one list, no walk of the state dicts) gives what DCP's
    ``get_state_dict`` does at every copy, into the written copy's tensors; and where the state
    changed under it (a non-tensor optimizer value added, a tensor LR, a buffer resized or cast in
    place by ``.data =``, the optimizer's state replaced) the walk makes that copy (and the layout
    again), never a copy into tensors of another shape or dtype. One rank (gloo, a process of its
    own): FSDP2 makes its parameters DTensors at any size."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _LAID_OUT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "laid out: every check held" in r.stdout, r.stdout + r.stderr[-3000:]
