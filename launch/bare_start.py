"""The bare cost of starting workers: imports + hvd.init() + a barrier, nothing else.

Launched by horovodrun from scripts/bench_resize.py to compare against a real resize; with
``--cuda`` (scripts/gpu_check.sh) each worker also creates its CUDA context on its local GPU.
``--nccl``: also one allreduce of a CUDA tensor (through NCCL where Horovod has it), checked for
its sum, timed; rank 0 prints ``nccl_built=B allreduce_s=T`` (the first one includes NCCL's
communicator set-up).
"""

import sys
import time

import horovod.torch as hvd
import torch

hvd.init()
if "--cuda" in sys.argv[1:]:
    torch.cuda.set_device(hvd.local_rank())
    torch.zeros(1, device="cuda").sum().item()  # the CUDA context exists after this
hvd.allreduce(torch.zeros(1), name="barrier")
if "--nccl" in sys.argv[1:]:
    t0 = time.perf_counter()
    x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
    y = hvd.allreduce(x, op=hvd.Sum, name="nccl_step")
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    want = hvd.size() * (hvd.size() + 1) / 2
    if not torch.all(y == want):
        sys.exit(f"allreduce of a CUDA tensor gave {float(y[0])}, expected {want}")
    if hvd.rank() == 0:
        print(f"nccl_built={int(bool(hvd.nccl_built()))} allreduce_s={dt:.3f} ranks={hvd.size()}", flush=True)
