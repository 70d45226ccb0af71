"""A plain Horovod epoch-loop script with its own per-epoch checkpoint and its own resume, in the
shape of Horovod's ``examples/pytorch/pytorch_imagenet_resnet50.py``: rank 0 saves
``CKPT/checkpoint-{epoch + 1}.pt`` after each epoch (0-based epochs), and at start the script looks
for the newest one and resumes from it (``resume_from_epoch``), then asks the library for
``job.epochs(resume_from_epoch, EPOCHS)``.

Each rank appends a JSON line per step it begins to ``OUT/trace-rank<r>.jsonl``: step, rank, world,
pid, epoch and the sample ids of its batch. Rank 1 kills itself (SIGKILL) at the start of step
``--kill-step`` (once in a run). ``--load-after-restore``: the script loads its own checkpoint after
``job.restore()`` instead of before (rank 0, then a broadcast), which would mix two positions.

    elastic-ring train --script tests/integration/scripts/own_resume.py --gpus 1 --schedule 6:2 \\
        --slots 2 -- --out OUT --ckpt CKPT --kill-step 14
"""

import argparse
import json
import os
import signal

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--kill-step", type=int, default=0)
p.add_argument("--load-after-restore", action="store_true")
a = p.parse_args()

job = elastic.init()
torch.manual_seed(0)


class Indexed(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


data = Indexed()
sampler = elastic.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())

# the script's own resume: the newest of its per-epoch checkpoints
os.makedirs(a.ckpt, exist_ok=True)
resume_from_epoch = 0
for e in range(a.epochs, 0, -1):
    if os.path.exists(os.path.join(a.ckpt, f"checkpoint-{e}.pt")):
        resume_from_epoch = e
        break


def load_own() -> None:
    if resume_from_epoch > 0 and hvd.rank() == 0:
        saved = torch.load(os.path.join(a.ckpt, f"checkpoint-{resume_from_epoch}.pt"))
        model.load_state_dict(saved["model"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)


if not a.load_after_restore:
    load_own()
job.register(model=model, optimizer=opt)
job.restore()
if a.load_after_restore:
    load_own()

for epoch in job.epochs(resume_from_epoch, a.epochs):
    sampler.set_epoch(epoch)
    for xb, yb, ids in loader:
        step = job.step + 1
        with open(os.path.join(a.out, f"trace-rank{hvd.rank()}.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "rank": hvd.rank(), "world": hvd.size(), "pid": os.getpid(),
                                "epoch": epoch, "ids": ids.tolist()}) + "\n")
        if hvd.rank() == 1 and step == a.kill_step and not os.path.exists(os.path.join(a.out, "killed")):
            open(os.path.join(a.out, "killed"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "epoch": epoch + 1},
                   os.path.join(a.ckpt, f"checkpoint-{epoch + 1}.pt"))
