"""elastic-ring: elastic Horovod training with checkpoint-and-relaunch resizing.

Subpackages, one concept each:

- ``config``     validated, frozen training configuration (YAML + flag overrides)
- ``nn``         CIFAR ResNets (He et al. 2016)
- ``data``       CIFAR-10, synthetic and offline digits datasets; exact-resume sample stream
- ``ckpt``       atomic, checksummed checkpoints
- ``train``      the Horovod worker loop and learning-rate rules (Eq. 7)
- ``controller`` the ``elastic-ring train`` process: launches horovodrun, resizes, measures
- ``events``     typed JSON-lines events shared by train, profile, reports and the simulator
- ``perfmodel``  speed model (Eq. 5, NNLS) and convergence model (Eq. 1)
- ``sched``      allocation policies (doubling heuristic Eq. 6, Optimus-style greedy, ...)
- ``sim``        discrete-event cluster simulator
- ``ps``         parameter-server mode with BSP / ASP / SSP / DSSP over MPI
- ``cli``        the ``elastic-ring`` command

Nothing happens at import time.
"""

__version__ = "0.1.0"
