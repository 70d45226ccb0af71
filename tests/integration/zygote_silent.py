"""Run by test_zygote.py through zygote.serve_forked: prints nothing, sleeps."""

import time

time.sleep(120)
