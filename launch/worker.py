"""Entry script that horovodrun executes for every `elastic-ring train` worker (one per slot).

It runs the built-in ResNet worker or the user's `--script` through the worker library's entry
point (:mod:`elastic_ring.worker.run`).
"""

import sys

from elastic_ring.worker.run import main

if __name__ == "__main__":
    sys.exit(main())
