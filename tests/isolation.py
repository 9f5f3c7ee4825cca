"""Runs a test body in a forked child, so that a crash, a sanitizer abort or a hang in the
library becomes a failing test with a reason instead of a dead test run (shared by
tests/test_overflow.py and tests/test_nonfinite.py; the fuzz keeps a long-lived worker of
its own)."""
from __future__ import annotations

import faulthandler
import os
import pickle
import select
import signal
import time
import traceback


def run_isolated(fn, timeout: float = 60.0):
    """fn() in a forked child; its result, or an AssertionError for a crash, a
    sanitizer abort (non-zero exit), a hang or a failed assertion in the child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            faulthandler.disable()  # an expected crash needs no Python traceback dump
            try:
                out = ("ok", fn())
            except BaseException as e:  # noqa: BLE001
                out = ("fail", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
            data = memoryview(pickle.dumps(out))
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"no return within {timeout:.0f} s (hang)")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(f"the call crashed the process with {signal.Signals(os.WTERMSIG(status)).name}")
    if not chunks:
        raise AssertionError(f"the process exited with status {os.WEXITSTATUS(status)} inside the call "
                             "(a sanitizer report, if any, is in the captured stderr)")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "fail":
        raise AssertionError(value)
    return value
