"""Two ranks (gloo, this process's children) of an FSDP2 MLP with Adam: what
``elastic_ring.worker.sharded.Copier`` copies at each checkpoint against DCP's own
``get_state_dict`` of the same moment (split and copied as before), through Adam's state
appearing, buffers reused, the optimizer's state replaced (a restore) and a new optimizer; then
a model with extra state copied through DCP's call each time (no plan); then the copy saved by
DCP and read back in full against the model's full tensors.

    python fsdp_copier.py FOLDER     # exit 0 when every check held on both ranks
"""

from __future__ import annotations

import os
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def rank_main(rank: int, folder: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    from elastic_ring.ckpt import snapshot
    from elastic_ring.ckpt.sharded import load_full
    from elastic_ring.worker.sharded import Copier, join, split, state_dicts

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    st = types.SimpleNamespace(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), syncing=False)

    def train() -> None:
        st.optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        st.optimizer.step()

    def check(local, specs) -> None:
        """``local, specs`` as the DCP path gives them now (get_state_dict, split, copied)."""
        ref_specs: dict = {}
        ref = snapshot(split(state_dicts(st.model, st.optimizer), ref_specs))
        assert same(local, ref), "the copy differs from get_state_dict's"
        assert specs.keys() == ref_specs.keys() and len(specs) > 0, (sorted(specs), sorted(ref_specs))
        for k, (mesh, placements, shape, stride) in specs.items():
            assert (mesh, placements, shape, stride) == ref_specs[k], k

    c = Copier()
    local, specs = c.copy(st)  # before any step: DCP's call (it makes Adam's state), and the plan
    assert c.calls == {"dcp": 1, "plan": 1} and "exp_avg" in local["optimizer"]["state"]["0.weight"], c.calls
    check(local, specs)
    for _ in range(2):
        train()
        c.release(local)
        old = tensors(local)
        local, specs = c.copy(st)  # from the plan, into the written copy's tensors
        assert c.calls == {"dcp": 1, "plan": 1}, c.calls
        assert all(a is b for a, b in zip(tensors(local), old)) and len(old) == len(tensors(local))
        check(local, specs)
    # a restore replaces the optimizer's state tensors: read live, still from the plan
    st.optimizer.load_state_dict(st.optimizer.state_dict())
    for g in st.optimizer.param_groups:
        g["lr"] = 0.5  # (an LR rule's change: read at every copy)
    train()
    local, specs = c.copy(st)
    assert c.calls == {"dcp": 1, "plan": 1} and local["optimizer"]["param_groups"][0]["lr"] == 0.5
    check(local, specs)
    # a new optimizer (another parameter set's): the plan made again
    st.optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train()
    local, specs = c.copy(st)
    assert c.calls == {"dcp": 2, "plan": 2}, c.calls
    check(local, specs)
    # a model whose state dict is more than its tensors (extra state): no plan, DCP's call each time
    class Noted(torch.nn.Linear):
        def get_extra_state(self):
            return {"note": 1}

        def set_extra_state(self, state) -> None:
            pass

    noted = Noted(4, 4)
    fully_shard(noted)
    other = types.SimpleNamespace(model=noted, optimizer=torch.optim.Adam(noted.parameters(), lr=1e-2), syncing=False)
    c2 = Copier()
    for _ in range(2):
        other.optimizer.zero_grad()
        noted(torch.randn(3, 4)).sum().backward()
        other.optimizer.step()
        got, got_specs = c2.copy(other)
        ref = snapshot(split(state_dicts(other.model, other.optimizer), {}))
        assert same(got, ref) and got["model"]["_extra_state"] == {"note": 1} and len(got_specs) == 6
    assert c2.calls == {"dcp": 2, "plan": 0}, c2.calls
    # the copy saved by DCP reads back in full as the model's full weights and Adam's state
    dcp.save(join(local, specs), storage_writer=dcp.FileSystemWriter(folder))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    moments = {k: st.optimizer.state[p]["exp_avg"].full_tensor() for k, p in model.named_parameters()}
    dist.barrier()
    if rank == 0:
        back = load_full(folder)
        assert back["model"].keys() == full.keys() and all(torch.equal(back["model"][k], full[k]) for k in full)
        assert all(torch.equal(back["optimizer"]["state"][k]["exp_avg"], moments[k]) for k in moments)
        print("copier: every check held", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(rank_main, args=(sys.argv[1], free), nprocs=2)
