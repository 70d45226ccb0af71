"""``--min-workers``/``--max-workers``/``--min-wait`` over a fixed host list (``--hosts``,
``--hostfile``; no discovery script): the list goes through the controller's HostManager as a
discovery that never changes (:func:`elastic_ring.controller.prepare_hosts.fixed_hosts`), so the
bounds are ``--workers MIN:MAX``'s (:func:`elastic_ring.controller.requests.with_worker_range`) and
``--min-wait`` is how long a run below MIN (a failed host in its cooldown) waits."""

from __future__ import annotations

import pytest

from elastic_ring.controller.prepare_hosts import host_manager
from elastic_ring.controller.requests import RunRequest, check, range_start, with_worker_range
from elastic_ring.errors import UserError


def _fixed(**kw) -> RunRequest:
    req = RunRequest(hosts="a:1,b:2", **kw)
    check(req)
    return with_worker_range(req)


def test_the_bounds_over_a_fixed_list_are_workers_min_max():
    req = _fixed(min_workers=2, max_workers=2)
    assert (req.worker_range, req.min_workers, req.max_workers) == ((2, 2), None, None)
    assert range_start(req.worker_range, 3) == 2  # starts at MAX
    assert _fixed(min_workers=2).worker_range == (2, 3)  # MAX: the list's slots
    assert _fixed(max_workers=2).worker_range == (1, 2)  # MIN: 1
    m = host_manager(_fixed(min_workers=2, min_wait=5.0), print)
    assert (m.bounds.min, m.bounds.max) == (2, 3)
    m.failed("b")  # below MIN while b cools down: it waits (up to --min-wait)
    view = m.update(3).view
    assert view.target is None and view.need == 2


def test_what_stays_refused_over_a_fixed_list():
    for kw, needle in ((dict(min_workers=3, max_workers=2), "--max-workers 2 is below --min-workers 3"),):
        with pytest.raises(UserError) as e:
            _fixed(**kw)
        assert str(e.value) == needle
    for kw, needle in ((dict(hosts="a:1,b:1", min_workers=2, workers=2),
                        "--min-workers/--max-workers over --hosts/--hostfile are the bounds"),
                       (dict(hosts="a:1,b:1", max_workers=2, resume_dir="r"),
                        "--resume goes on at the run's size: drop --min-workers/--max-workers"),
                       (dict(min_wait=3.0), "--min-wait goes with --host-discovery-script or --hosts/--hostfile"),
                       (dict(hosts="a:1,b:1", discovery_interval=1.0),
                        "--discovery-interval goes with --host-discovery-script")):
        with pytest.raises(UserError) as e:
            check(RunRequest(**kw))
        assert str(e.value).startswith(needle), str(e.value)
    with pytest.raises(UserError) as e:  # a list it does not watch (one host relaunched): nothing waits
        host_manager(RunRequest(hosts="a:2", min_wait=3.0), print)
    assert str(e.value).startswith("--min-wait goes with --host-discovery-script or several hosts")
