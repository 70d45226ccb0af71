"""The experiments of the papers, one module each; every command that runs one parses its flags,
calls the module's one entry function and prints what it returns.

* :mod:`.throughput` — Table 1 of arXiv 1908.08082: throughput per worker count and the Eq. 5 fit
  (``elastic-ring profile``; the runs themselves: :mod:`elastic_ring.profile.profiler`).
* :mod:`.resize` — Table 2: the resize design file and the table's arithmetic from events;
  :mod:`.resize_runs` runs every row and repeat (``elastic-ring experiment resize``).
* :mod:`.cluster_sim` — Table 3: the simulated cluster under the scheduling policies, with tuning
  and held-out seeds (``elastic-ring simulate``).
* :mod:`.ps_sync` — Table I of arXiv 1908.11848: BSP, ASP, SSP and DSSP on a heterogeneous
  cluster, paired seeds and bootstrap ratios (``elastic-ring ps experiment``); its design file is
  :mod:`.ps_design`, its numbers (times to target, ratios, verdicts) :mod:`.ps_stats`, its table
  and plot :mod:`.ps_report`.
* :mod:`.replay` — a measured job trace replayed in the simulator with the live scheduler's
  hand-over (:class:`~elastic_ring.experiment.replay.LiveHandover`, a launch model of the engine);
  :mod:`.live_check` — the simulator checked against the live scheduler on this machine
  (calibration, live run, replay; ``scripts/cluster_check_sim.py``), with :mod:`.live_records`
  (a run's events and database read back), :mod:`.live_launches` (launch costs) and
  :mod:`.live_results` (the replay and the results files).

Nothing is imported here: each module brings only what its experiment needs.
"""
