#!/usr/bin/env python3
"""Runs a command with a wall-clock limit and writes how it went: the benchmarks' runner.

Usage: run_measured.py [--stdout FILE] [--kill-at-step K METRICS] RESULT LIMIT COMMAND...

The command runs in its own process group, so a timeout or Ctrl-C ends everything it started and
nothing else. Its stdout goes to our stderr, or to FILE with --stdout (the worker's outcome line);
its stderr is ours. RESULT gets {rc, wall_s, peak_rss_mb, timed_out}: rc 124 when it ran past
LIMIT seconds (SIGTERM, then SIGKILL after 30 s); peak_rss_mb is the child's ru_maxrss (the
largest process waited for).

--kill-at-step K METRICS: SIGKILL the command as soon as METRICS (a worker's metrics.jsonl) has
step K's line, polled every 10 ms; RESULT then also has killed_at_step (K, or null when the
command ended before that line appeared). Used for the exact-resume check of gpu.sh.

Stdlib only. Used by trainer.sh and gpu.sh.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time


def usage(message):
    sys.exit(f"run_measured: {message}\n{__doc__.split('Usage: ')[1].splitlines()[0]}")


def step_logged(metrics, step):
    """Whether METRICS has a complete line for training step `step`."""
    try:
        with open(metrics, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return False
    for line in text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step") == step and "time" in record:
            return True
    return False


def main(argv):
    stdout_path = kill_step = metrics = None
    while argv and argv[0].startswith("--"):
        if argv[0] == "--stdout" and len(argv) > 1:
            stdout_path, argv = argv[1], argv[2:]
        elif argv[0] == "--kill-at-step" and len(argv) > 2:
            kill_step, metrics, argv = int(argv[1]), argv[2], argv[3:]
        else:
            usage(f"unknown option {argv[0]}")
    if len(argv) < 3:
        usage("expected RESULT LIMIT COMMAND...")
    result, limit, command = argv[0], float(argv[1]), argv[2:]

    stdout = open(stdout_path, "w") if stdout_path else sys.stderr
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=stdout, start_new_session=True)

    def stop(sig):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass

    timed_out = False
    killed_at_step = None
    try:
        if kill_step is not None:
            while child.poll() is None and time.perf_counter() - start < limit:
                if step_logged(metrics, kill_step):
                    stop(signal.SIGKILL)
                    killed_at_step = kill_step
                    break
                time.sleep(0.01)
        rc = child.wait(timeout=max(limit - (time.perf_counter() - start), 0.001))
    except subprocess.TimeoutExpired:
        timed_out = True
        stop(signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop(signal.SIGKILL)
            child.wait()
        stop(signal.SIGKILL)
        rc = 124
    except KeyboardInterrupt:
        stop(signal.SIGTERM)
        child.wait()
        raise
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    record = {"rc": rc, "wall_s": time.perf_counter() - start, "peak_rss_mb": round(peak, 1), "timed_out": timed_out}
    if kill_step is not None:
        record["killed_at_step"] = killed_at_step
    with open(result, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1:])
