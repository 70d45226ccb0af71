"""Performance models shared by the profiler, the scheduler, the simulator and the reports.

* :mod:`.speed` — Eq. 5, training speed (steps/s) as a function of the number of workers, fitted by
  non-negative least squares (NNLS).
* :mod:`.convergence` — Eq. 1, training loss as a function of the step, used to predict the steps a
  job still needs.

Each model is a ``NamedTuple`` of parameters with a vectorised ``predict`` and a separate ``fit_*``
function (AdaptDL's pattern), so every user computes the same numbers from one module.
"""

from elastic_ring.perfmodel.convergence import ConvergenceModel, fit_convergence, losses_from_events
from elastic_ring.perfmodel.speed import FitError, SpeedFit, SpeedModel, fit_speed, load_profile

__all__ = [
    "ConvergenceModel", "fit_convergence", "losses_from_events",
    "FitError", "SpeedFit", "SpeedModel", "fit_speed", "load_profile",
]
