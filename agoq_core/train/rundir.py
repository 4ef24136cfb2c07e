"""The run folder of ``agoq train``: created atomically, written atomically, and marked with its status.

* **Exclusive creation.** ``create_run_dir`` makes ``<out_dir>/<name>`` with ``mkdir`` (which fails if the
  folder exists, atomically, also across processes and machines sharing the file system). A timestamp name
  that is taken gets the first free suffix ``-2``, ``-3``...; an explicit ``--run-name`` that is taken is
  an error. Two runs started in the same second therefore never share a folder.
* **Atomic files.** ``write_atomic`` writes a temporary file in the same folder and renames it over the
  target (``os.replace``): a reader sees the old file or the new one, never half of one.
  ``metrics.jsonl`` is streamed to ``metrics.jsonl.partial`` during training and renamed when training ends.
* **Status.** ``status.json`` holds ``running`` from creation on, then ``completed``, ``failed`` (with the
  error) or ``interrupted`` (with the signal: SIGINT or SIGTERM). ``RunStatus`` turns SIGTERM into a
  ``RunInterrupted`` exception (a KeyboardInterrupt, as SIGINT is) so the normal unwinding runs.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from agoq_core.errors import AgoqError

__all__ = ["RunDirError", "RunInterrupted", "check_run_name", "create_run_dir", "write_atomic", "write_status",
           "read_status", "run_status", "STATUS_FILE"]

STATUS_FILE = "status.json"


class RunDirError(AgoqError, RuntimeError):
    """The run folder cannot be created (name taken, --out-dir not writable) or its name is unsafe."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def check_run_name(name: str) -> None:
    """A run name is one plain folder name: no separators, not '.'/'..', not absolute (it must stay
    inside --out-dir)."""
    if not isinstance(name, str):
        raise RunDirError(f"run_name must be a string, got {name!r}")
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name or os.path.isabs(name) or (
            os.altsep and os.altsep in name):
        raise RunDirError(f"run_name {name!r} must be a single folder name inside --out-dir (no '/', '\\', "
                          "'..' or absolute paths); use --out-dir to choose where runs go")


def create_run_dir(out_dir: str | os.PathLike, run_name: str = "") -> Path:
    """Create a fresh run folder exclusively and mark it ``running``; see the module docstring."""
    check_run_name(run_name)
    root = Path(out_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create --out-dir {str(root)!r}: {exc.strerror or exc}; choose a writable "
                          "--out-dir") from None
    base = run_name or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(1, 10_000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
        except FileExistsError:
            if run_name:
                full = any(path.iterdir()) if path.is_dir() else True
                raise RunDirError(f"run folder {str(path)!r} already exists{' and is not empty' if full else ''}; "
                                  "pick another --run-name or remove it") from None
            continue
        except OSError as exc:
            raise RunDirError(f"cannot create the run folder {str(path)!r}: {exc.strerror or exc}; choose a "
                              "writable --out-dir") from None
        write_status(path, "running")
        return path
    raise RunDirError(f"no free run folder name {base}-N in {str(root)!r} (N < 10000)")


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_status(path: Path, status: str, **extra: Any) -> None:
    rec = {"status": status, "pid": os.getpid(), "time": _dt.datetime.now().isoformat(timespec="seconds"), **extra}
    write_atomic(Path(path) / STATUS_FILE, json.dumps(rec, indent=2) + "\n")


def read_status(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(path) / STATUS_FILE).read_text(encoding="utf-8"))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise RunInterrupted (main thread only: elsewhere Python
    cannot install handlers, and the default behaviour stays)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise RunInterrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def run_status(path: Path | None) -> Iterator[None]:
    """Mark ``path`` completed, failed or interrupted according to how the block ends (``None``: this
    process does not own the folder, e.g. a non-zero rank; signals are still turned into exceptions)."""
    with _sigterm_as_interrupt():
        try:
            yield
        except KeyboardInterrupt as exc:  # RunInterrupted (SIGINT/SIGTERM) or a plain Ctrl-C
            signame = getattr(exc, "signame", "SIGINT")
            if path is not None:
                write_status(path, "interrupted", signal=signame,
                             note="partial results: metrics.jsonl.partial holds every step finished before the signal")
                if getattr(exc, "run_dir", None) is None:
                    exc.run_dir = str(path)  # for the command's message
            raise
        except BaseException as exc:
            if path is not None:
                write_status(path, "failed", error=f"{type(exc).__name__}: {exc}")
            raise
        if path is not None:
            write_status(path, "completed")
