"""One-host process groups: a free rendezvous port and a clean exit for spawned ranks (tests,
``agoq train``'s spawned ranks, the planner's CPU pipeline check, the collective benchmarks)."""
from __future__ import annotations

import logging
import os
import socket
import sys

__all__ = ["free_port", "exit_spawned_rank"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_spawned_rank(code: int = 0) -> None:
    """End a spawned rank now, once its results are written and its process group destroyed.

    With ``torch._dynamo`` imported (torch.compile, FSDP2, pipelining and transformers all import it),
    ``destroy_process_group`` leaves the gloo group referenced, and its worker threads are still running
    when the interpreter tears down: the process then dies with "terminate called without an active
    exception" (SIGABRT) in about one run in four on torch 2.13, after its work is done (pytorch#190489 and
    the abandoned pytorch#179291 describe the same teardown race). Skipping the teardown avoids it; the
    standard streams and the logging handlers are flushed first so nothing printed is lost.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream has nothing left to lose
            pass
    os._exit(code)
