"""The integration tests' shared Ray cluster (:func:`tests.integration.ray_cluster.shared_one_node`):
the ``ray_one_node`` fixture, and its stop once the next test does not ask for it."""

from __future__ import annotations

import pytest

from tests.integration.ray_cluster import close_shared, shared_one_node


@pytest.fixture
def ray_one_node(tmp_path_factory):
    """A local Ray cluster of one node (:data:`~tests.integration.ray_cluster.SHARED_CPUS` CPUs)
    shared with the tests that ask for it right before or after this one."""
    pytest.importorskip("ray")
    return shared_one_node(tmp_path_factory)


def pytest_runtest_teardown(item, nextitem):
    # the tests run in the order of tests/conftest.py's list (the Ray ones in a row), on each
    # pytest-xdist worker in the order it is handed them: a cluster kept past its row would only
    # hold memory and a little CPU
    if nextitem is None or "ray_one_node" not in getattr(nextitem, "fixturenames", ()):
        close_shared()


def pytest_sessionfinish(session):
    close_shared()
