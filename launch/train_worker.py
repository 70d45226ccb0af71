"""Entry script that horovodrun executes for `elastic-ring train` (one process per slot)."""

import sys

from elastic_ring.train.worker import main

if __name__ == "__main__":
    sys.exit(main())
