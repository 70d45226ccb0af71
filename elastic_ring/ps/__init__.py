"""Parameter-server training with BSP, ASP, SSP and DSSP over MPI (arXiv 1908.11848).

- ``api``          blueprint (``PSConfig``), ``SyncPolicy``, controller interface, decision types
- ``controllers``  the pure gate (Algorithm 1, server side), Algorithm 2 (``paper``) and the
                   controller minimising the wait at the next check (no refill assumed) with the
                   hard cap (``exact``)
- ``simulate``     discrete-event simulation of the gate with given step times (tests, docs)
- ``model``        the model as flat arrays; evaluation
- ``server``       rank 0's loop; ``worker`` ranks 1..K; ``runner`` launches mpirun
- ``events``       the ``ps_*`` event kinds; ``experiment`` the Table I design (paired seeds,
                   bootstrap ratios, a verdict per paper comparison)

Nothing happens at import time.
"""
