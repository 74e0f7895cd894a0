"""A sidecar environment that tries to get out before it serves (tests/tests/env.rs): it reads a
file outside its directories, connects to the host's loopback, and leaves a process behind; it
prints what happened, then serves examples/envs/arith_feedback.py (copied beside it) as usual."""

import argparse
import os
import runpy
import socket
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--secret", required=True)
parser.add_argument("--probe-port", type=int, required=True)
parser.add_argument("--marker", required=True)
ours, rest = parser.parse_known_args()

try:
    with open(ours.secret) as secret:
        print("read: got", secret.read().strip(), flush=True)
except OSError as error:
    print("read: refused:", type(error).__name__, flush=True)

try:
    with socket.create_connection(("127.0.0.1", ours.probe_port), timeout=2):
        print("connect: connected", flush=True)
except OSError as error:
    print("connect: refused:", type(error).__name__, flush=True)

child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)", ours.marker], start_new_session=True
)
print("left behind:", child.pid, flush=True)

here = os.path.dirname(os.path.abspath(__file__))
sys.argv = ["arith_feedback.py"] + rest
runpy.run_path(os.path.join(here, "arith_feedback.py"), run_name="__main__")
