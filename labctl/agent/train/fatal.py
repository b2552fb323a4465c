"""A trainer's fatal error: the run ends at once, and its one-line reason is what the user reads.

A TrainerError (bad settings, the sandbox refusing the token or the request, no warm model, no
task judged) says it all and would say it again after any restart. torchrun restarts a failed
worker `--max-restarts` times whatever the cause, and then prints its own ChildFailedError
traceback over the trainer's reason. So the trainer, under a labctl launch:

1. writes its reason to FATAL_FILE in the run's folder (the first rank's reason wins), where the
   host agent finds it (`train.ps`, `train.status`) whatever became of the output streams;
2. prints `{"event": "fatal", "reason": ...}` on stdout, which the controller reads live;
3. sends SIGTERM to its torchrun agent, which then stops every local worker and exits without a
   restart (torchrun treats its own death signal as the end, not as a worker's failure);
4. exits EXIT_FATAL, the code a TrainerError has always exited with (a crash exits 1).

Outside a labctl launch (LABCTL_RUN_ID unset) only the stderr line and the exit code remain.

A crash that is not a TrainerError (a killed rank, a lost host) does none of this and keeps
torchrun's restarts. Standard library only, Python 3.8.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Dict, Optional

FATAL_FILE = "fatal"
EXIT_FATAL = 2  # a TrainerError: what is wrong is the run's setup, not this attempt (a crash is 1)
# torchrun's --tee copies a worker's output by reading its log file every few tenths of a
# second; the fatal event must be read before torchrun stops copying.
TEE_CATCH_UP_S = 1.0


def run_folder() -> Optional[str]:
    """The run's folder under a labctl launch (every launch starts torchrun in it), else None."""
    if not os.environ.get("LABCTL_RUN_ID"):
        return None
    return os.getcwd()


def record(reason: str, folder: str) -> None:
    """Write the reason once: the first rank to fail says why; the others' copies are the same."""
    doc = {
        "reason": reason,
        "rank": os.environ.get("RANK"),
        "host": os.environ.get("LABCTL_HOST"),
        "time": time.time(),
    }
    try:
        fd = os.open(os.path.join(folder, FATAL_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return  # another rank wrote it first, or the folder is gone: the event still carries it
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)


def read(folder: str) -> Optional[Dict[str, object]]:
    """The fatal record in a run's folder, or None."""
    try:
        with open(os.path.join(folder, FATAL_FILE)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("reason"), str) else None


def _parent_is_torchrun(ppid: int) -> bool:
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(a in (b"torch.distributed.run", b"torchrun") or a.endswith(b"/torchrun") for a in argv)


def stop_restarts() -> bool:
    """Under torchrun, end its agent (SIGTERM) so that no worker is started again; True if sent."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return False
    ppid = os.getppid()
    if ppid <= 1 or not _parent_is_torchrun(ppid):
        return False
    time.sleep(TEE_CATCH_UP_S)
    try:
        os.kill(ppid, signal.SIGTERM)
    except OSError:
        return False
    return True


def end_run(reason: str, who: str) -> int:
    """Say why once, on every channel the controller reads, stop torchrun's restarts; the exit code."""
    import sys

    folder = run_folder()
    if folder is not None:
        record(reason, folder)
        print(json.dumps({"event": "fatal", "reason": reason}), flush=True)
    print(f"{who}: error: {reason}", file=sys.stderr, flush=True)
    stop_restarts()
    return EXIT_FATAL
