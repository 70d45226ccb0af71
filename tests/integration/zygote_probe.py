"""Run as ``python -m tests.integration.zygote_probe MODE [N]`` by test_zygote.py: hands itself to
the zygote as the worker entry does, then prints what it sees and ends as MODE says."""

import json
import os
import sys
import time

from elastic_ring.worker import zygote

zygote.hand_over("tests.integration.zygote_probe", sys.argv[1:])
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "pid": os.getpid(),
                  "torch": "torch" in sys.modules, "dynamo": "torch._dynamo" in sys.modules,
                  "zygote_env": zygote.ENV in os.environ}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "sleep":
    time.sleep(120)
