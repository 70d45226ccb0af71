"""The LR rules moved to the worker library (:mod:`elastic_ring.worker.lr`); this name stays for
the built-in worker and old imports."""

from elastic_ring.worker.lr import (RULES, LinearScale, LRState, NoScale, ScalingRule,  # noqa: F401
                                    SqrtScale, decay_multiplier, initial_base_lr)
