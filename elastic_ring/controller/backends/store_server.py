"""A ``torch.distributed`` ``TCPStore`` served in a process of its own, forked by a zygote for a
controller (:func:`elastic_ring.controller.backends.torch_ring.serve_store`): the controller of a
``--collective torch`` job then never imports torch itself (about 2 s of CPU at each start).

``python -m elastic_ring.controller.backends.store_server HOST TIMEOUT_S``: serves a store on a
free port of ``HOST``, prints the port, then waits; the zygote ends it when the controller's handle
(:class:`elastic_ring.worker.zygote.Served`) closes or the controller is gone.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta


def main(argv: list[str] | None = None) -> None:
    host, timeout_s = (sys.argv[1:] if argv is None else argv)[:2]
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=float(timeout_s)))
    print(int(store.port), flush=True)
    threading.Event().wait()  # until the zygote ends this process (its controller's handle closed)


if __name__ == "__main__":
    main()
