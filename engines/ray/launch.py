#!/usr/bin/env python3
"""rlvr's launcher for an engine job whose ranks span several nodes of a Ray cluster.

The worker submits it as the Ray job's entrypoint, run by the cluster's own python (the daemon's
`engines.ray_python`, which has Ray), next to the contract:

    launch.py --nodes M --per-node N --device cpu|gpu --engine-python PY SCRIPT CONTRACT

What it does: reserves N devices (CPUs or GPUs) on each of M distinct nodes with one placement
group (STRICT_SPREAD: every bundle on its own node, all of them or none, as the daemon admits a
local job's devices as a gang), starts one actor in each bundle, and has each start torchrun on
its node (`--nnodes M --node-rank i`, rendezvous at the first node's address), which starts the
node's N ranks of SCRIPT with the engine's python. It exits as the ranks did: 0 when every node
finished, 75 when they stopped at a checkpoint, 70 when the cluster could not place the job in
time (the daemon requeues it), else the first failure's status.

A SIGTERM (the Ray job's stop) is passed to every node's torchrun, which passes it to its ranks:
they agree on a step, checkpoint there and exit 75. A node whose torchrun fails stops the others
(they would wait in a collective for its ranks until the backend's timeout): checked by hand on
a two-node cluster, a node exiting after 3 s ended the job FAILED in 11 s, nothing left running. A torchrun dies with its actor (the parent
death signal), and the ranks with their torchrun, so nothing of the job outlives its driver.
"""

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

EXIT_TRANSIENT = 70
EXIT_INTERRUPTED = 75
# How long the cluster has to find room for every node's devices before the run gives up (and
# the daemon requeues the job).
PLACEMENT_PATIENCE_S = 300.0


def log(message):
    print(f"ray launcher: {message}", file=sys.stderr, flush=True)


def die_with_parent():
    """In torchrun's child, before exec: SIGKILL when its actor's process dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@ray.remote(max_concurrency=2)
class Node:
    """One node's torchrun: `run` waits for it, `terminate` (on the actor's second thread) passes
    a stop to it meanwhile."""

    def __init__(self):
        self.child = None

    def rendezvous(self):
        """This node's address and a port free on it, for the first node's torchrun to listen on."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def run(self, command):
        self.child = subprocess.Popen(command, preexec_fn=die_with_parent)
        return self.child.wait()

    def terminate(self):
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)


def exit_status(codes):
    """The job's exit from its nodes' torchrun statuses."""
    if all(code == 0 for code in codes):
        return 0
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    return next(code for code in codes if code != 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--per-node", type=int, required=True)
    parser.add_argument("--device", choices=["cpu", "gpu"], required=True)
    parser.add_argument("--engine-python", required=True)
    parser.add_argument("script")
    parser.add_argument("contract")
    args = parser.parse_args()

    ray.init(address="auto", logging_level="ERROR", log_to_driver=True)
    resource = "GPU" if args.device == "gpu" else "CPU"
    bundles = [{resource: args.per_node} for _ in range(args.nodes)]
    group = placement_group(bundles, strategy="STRICT_SPREAD")
    log(f"waiting for {args.per_node} {resource} on each of {args.nodes} nodes")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_PATIENCE_S)
    if not ready:
        remove_placement_group(group)
        log(
            f"the cluster did not place {args.nodes} nodes of {args.per_node} {resource} each within "
            f"{PLACEMENT_PATIENCE_S:.0f} s"
        )
        return EXIT_TRANSIENT
    options = {"num_gpus": args.per_node} if resource == "GPU" else {"num_cpus": args.per_node}
    nodes = [
        Node.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index
            ),
            **options,
        ).remote()
        for index in range(args.nodes)
    ]
    address, port = ray.get(nodes[0].rendezvous.remote())
    log(f"placed; torchrun rendezvous at {address}:{port}")

    stopping = {"sent": False}

    def stop_every_node(why):
        if stopping["sent"]:
            return
        stopping["sent"] = True
        log(f"{why}: passing the stop to every node")
        try:
            ray.get([node.terminate.remote() for node in nodes])
        except ray.exceptions.RayError as error:  # a node already gone is stopped enough
            log(f"stopping the nodes: {error}")

    def on_sigterm(_signum, _frame):
        stop_every_node("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)
    runs = []
    for rank, node in enumerate(nodes):
        command = [args.engine_python, "-m", "torch.distributed.run", "--nnodes", str(args.nodes)]
        command += ["--node-rank", str(rank), "--nproc-per-node", str(args.per_node)]
        command += ["--master-addr", address, "--master-port", str(port), args.script, args.contract]
        runs.append(node.run.remote(command))
    pending, codes = list(runs), {}
    while pending:
        done, pending = ray.wait(pending, timeout=1.0)
        for ref in done:
            index = runs.index(ref)
            try:
                codes[index] = ray.get(ref)
            except ray.exceptions.RayError as error:  # the node's actor died
                log(f"node {index}: {error}")
                codes[index] = EXIT_TRANSIENT
            # A node that failed leaves the others waiting in a collective until gloo's or NCCL's
            # timeout (30 minutes): they are stopped now (torchrun kills its ranks within 30 s).
            if codes[index] not in (0, EXIT_INTERRUPTED) and pending:
                stop_every_node(f"node {index}'s torchrun exited {codes[index]}")
    statuses = [codes[index] for index in range(len(runs))]
    log(f"the nodes' torchrun exited {statuses}")
    remove_placement_group(group)
    return exit_status(statuses)


if __name__ == "__main__":
    sys.exit(main())
