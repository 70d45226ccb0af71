"""Parameter-server training with BSP, ASP, SSP and DSSP over MPI (arXiv 1908.11848).

- ``api``          blueprint (``PSConfig``), ``SyncPolicy``, controller interface, decision types
- ``controllers``  the pure gate (Algorithm 1, server side), Algorithm 2 (``paper``) and the
                   controller minimising the wait at the next check (no refill assumed) with the
                   hard cap (``exact``)
- ``simulate``     discrete-event simulation of the gate with given step times (tests, docs)
- ``model``        the model as flat arrays; evaluation
- ``server``       rank 0's loop, the class ``Server`` (one method per concern: a push, the gate's
                   decision, evaluation, the stop, the totals) over a ``Transport``: MPI, or
                   ``inprocess`` (the workers' gradients computed in the server's process, virtual
                   clock; the same loop, so the same events)
- ``worker``       ranks 1..K (``WorkerCompute``: the gradient step both transports use)
- ``mpi_main``     what mpirun executes in every rank (``python -m elastic_ring.ps.mpi_main``)
- ``runner``       launches mpirun (or the in-process engine) and reads a failed rank's crash
                   record: the one format of ``train`` (``elastic_ring.protocol``,
                   ``RUN_DIR/logs/error-rank<R>.json``), written by ``elastic_ring.ps.mpi_main`` and
                   ``inprocess``
- ``events``       the ``ps_*`` event kinds (keyword-only records)

The Table I design (paired seeds, bootstrap ratios, a verdict per paper comparison) is
:mod:`elastic_ring.experiment.ps_sync`, with the other experiments.

Nothing happens at import time.
"""
