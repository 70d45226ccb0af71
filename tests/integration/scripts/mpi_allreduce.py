"""Run by mpirun in tests: each rank allreduces through mpi4py and writes what it got."""

import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
buf = np.array([r + 1.0, r * r], dtype=np.float64)
out = np.empty_like(buf)
comm.Allreduce(buf, out, op=MPI.SUM)
mx = comm.allreduce(r, op=MPI.MAX)
Path(sys.argv[1], f"rank{r}.json").write_text(json.dumps({"rank": r, "size": n, "sum": out.tolist(), "max": mx}))
