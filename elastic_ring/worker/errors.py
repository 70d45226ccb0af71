"""The worker library's errors: a script not started by elastic-ring, and a misuse of the
library that would lose state silently (the controller does not retry it)."""


class NotLaunchedError(RuntimeError):
    """The script was not started by elastic-ring (``elastic-ring train --script``)."""


class ContractError(RuntimeError):
    """The script uses the library in a way that would silently lose state or the schedule (an
    unregistered optimizer, an unpicklable extra, ``hvd.init()`` before ``init()``...). The worker
    fails at once with this one-line message and the controller does not retry it."""
