"""Every python process of an rlvr worker's vLLM server dies with its parent.

The worker starts the server with this directory on PYTHONPATH, so Python imports this module at
the start of the server and of every process it starts (vLLM's engine core, multiprocessing's
resource tracker), before anything else runs. The worker kills the server's process group when a
run ends; this covers a worker killed with SIGKILL, after which nothing of the worker runs: the
kernel kills the server (PR_SET_PDEATHSIG, set by the worker), and then each child of it, since
each asked here for SIGKILL when its own parent dies. Without it vLLM's engine core outlives a
killed server, holding its memory (seen with vLLM 0.26.0 on CPU).

A child whose parent died before it got here would never get the signal: each process records its
pid in RLVR_VLLM_PARENT_PID for its children, and a child that finds another parent exits.
"""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
_VARIABLE = "RLVR_VLLM_PARENT_PID"


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        return
    expected = os.environ.get(_VARIABLE)
    if expected is not None and expected.isdigit() and os.getppid() != int(expected):
        os._exit(1)
    os.environ[_VARIABLE] = str(os.getpid())


_die_with_parent()
