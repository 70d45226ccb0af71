"""Write the constraints file that scripts/setup.sh installs with: every package of a set-up venv.

Usage (what `make lock` runs): a fresh venv set up without the constraints, then
    .venv-lock/bin/python scripts/lock.py > constraints.txt

One ``name==version`` line per installed distribution, sorted, without the project itself and
without Horovod (built from source by setup.sh, its version pinned there); a local version label
(torch's ``+cu130``) is dropped, since the label names the build, not the release.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import distributions

SKIP = {"elastic-ring", "horovod"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_lines() -> list[str]:
    pins: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if not name or canonical(name) in SKIP:
            continue
        pins[canonical(name)] = dist.version.split("+")[0]
    return [f"{n}=={v}" for n, v in sorted(pins.items())]


def main() -> int:
    py = ".".join(map(str, sys.version_info[:2]))
    print("# The versions the project is tested with (Python " + py + ", x86_64 Linux), used by")
    print("# scripts/setup.sh as constraints. Refresh: `make lock` (a fresh venv resolved without")
    print("# them, then scripts/lock.py); run `make test` before committing the new file.")
    print("\n".join(lock_lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
