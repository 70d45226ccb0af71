"""Run by horovodrun in tests: each rank allreduces known tensors and writes what it got."""

import json
import sys
from pathlib import Path

import horovod.torch as hvd
import torch

hvd.init()
r, n = hvd.rank(), hvd.size()
s = hvd.allreduce(torch.tensor([float(r + 1), 10.0 * r]), op=hvd.Sum, name="sum")
avg = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Average, name="avg")
b = hvd.broadcast(torch.tensor([42.0 + r]), root_rank=1, name="bcast")
g = hvd.allgather(torch.tensor([[float(r)]]), name="gather")
out = {"rank": r, "size": n, "local_rank": hvd.local_rank(), "sum": s.tolist(), "avg": avg.tolist(),
       "bcast": b.tolist(), "gather": g.flatten().tolist(), "gloo": hvd.gloo_enabled()}
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps(out))
