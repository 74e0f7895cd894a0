#!/usr/bin/env python3
"""Runs a command with a wall-clock limit and writes how it went: the benchmarks' runner.

Usage: run_measured.py [--stdout FILE] [--kill-at-step K METRICS | --kill-after-step K PROGRESS] [--gpu-memory]
                       RESULT LIMIT COMMAND...

The command runs in its own process group, so a timeout or Ctrl-C ends everything it started and
nothing else. Its stdout goes to our stderr, or to FILE with --stdout (the worker's outcome line);
its stderr is ours. RESULT gets {rc, wall_s, peak_rss_mb, timed_out}: rc 124 when it ran past
LIMIT seconds (SIGTERM, then SIGKILL after 30 s); peak_rss_mb is the child's ru_maxrss (the
largest process waited for).

--kill-at-step K METRICS: SIGKILL the command as soon as METRICS (a worker's metrics.jsonl) has
step K's line, polled every 10 ms; RESULT then also has killed_at_step (K, or null when the
command ended before that line appeared). Used for the exact-resume check of gpu.sh.

--kill-after-step K PROGRESS: the same once PROGRESS (a worker's progress.json, rewritten after
a step's metrics and rollout records) says step K: a benchmark's run ends with its last measured
step, without the final checkpoint (billions of parameters and their optimizer state written to
disk, which no figure counts).

--gpu-memory: also sample, every 0.25 s, what the GPU itself counts as the command's (nvidia-smi's
used_memory of the command's processes: the CUDA context and everything libtorch's allocator
holds, cached blocks included); RESULT then has gpu_used_peak_mb (null when nvidia-smi showed none
of its processes).

Stdlib only. Used by trainer.sh, shapes.sh and gpu.sh.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import threading
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


def progress_reached(progress, step):
    """Whether PROGRESS (written whole, by rename) says step `step` or later is done."""
    try:
        with open(progress, encoding="utf-8") as f:
            return json.load(f).get("step", 0) >= step
    except (FileNotFoundError, ValueError):
        return False


def group_pids(pgid):
    """The processes of process group `pgid` (the command and what it started), from /proc."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.add(int(entry))
            except OSError:
                pass
    return pids


class GpuMemory(threading.Thread):
    """The largest GPU memory nvidia-smi reports for the process group `pgid`, in MiB."""

    def __init__(self, pgid):
        super().__init__(daemon=True)
        self.pgid, self.peak_mb, self.done = pgid, None, threading.Event()

    def run(self):
        while not self.done.wait(0.25):
            try:
                rows = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10,
                ).stdout
            except (OSError, subprocess.SubprocessError):
                return
            pids = group_pids(self.pgid)
            used = sum(int(mb) for pid, mb in (row.split(",") for row in rows.splitlines() if "," in row)
                       if pid.strip().isdigit() and mb.strip().isdigit() and int(pid) in pids)
            if used and (self.peak_mb is None or used > self.peak_mb):
                self.peak_mb = used


def main(argv):
    stdout_path = kill_step = metrics = None
    gpu_memory = False
    while argv and argv[0].startswith("--"):
        if argv[0] == "--stdout" and len(argv) > 1:
            stdout_path, argv = argv[1], argv[2:]
        elif argv[0] == "--gpu-memory":
            gpu_memory, argv = True, argv[1:]
        elif argv[0] == "--kill-at-step" and len(argv) > 2:
            kill_step, metrics, argv = int(argv[1]), argv[2], argv[3:]
            reached = step_logged
        elif argv[0] == "--kill-after-step" and len(argv) > 2:
            kill_step, metrics, argv = int(argv[1]), argv[2], argv[3:]
            reached = progress_reached
        else:
            usage(f"unknown option {argv[0]}")
    if len(argv) < 3:
        usage("expected RESULT LIMIT COMMAND...")
    result, limit, command = argv[0], float(argv[1]), argv[2:]

    stdout = open(stdout_path, "w") if stdout_path else sys.stderr
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=stdout, start_new_session=True)
    sampler = GpuMemory(child.pid) if gpu_memory else None
    if sampler:
        sampler.start()

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
                if reached(metrics, kill_step):
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
    if sampler:
        sampler.done.set()
        sampler.join()
        record["gpu_used_peak_mb"] = sampler.peak_mb
    with open(result, "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1:])
