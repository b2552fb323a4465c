"""Remote commands that cannot outlive their SSH channel.

A command sshd starts without a pty keeps running when the channel closes. To make
Ctrl-C, timeouts and dropped connections stop it, the command runs in its own session
(process group) while a watcher blocks on the channel's stdin; when the channel goes away
stdin reaches EOF and the watcher kills the whole group (TERM, then KILL).
"""

from __future__ import annotations

import shlex

GRACE_SECONDS = 3

_SCRIPT = (
    # A background job's stdin is /dev/null in sh, so the channel's stdin is kept on fd 3.
    "exec 3<&0; "
    'setsid sh -c "$1" </dev/null 3<&- & p=$!; '
    "( cat >/dev/null; kill -TERM -$p 2>/dev/null || exit 0; sleep {grace}; kill -KILL -$p 2>/dev/null ) "
    "<&3 >/dev/null 2>&1 & w=$!; "
    "exec 3<&-; wait $p; rc=$?; kill $w 2>/dev/null; exit $rc"
)


def wrap_with_watchdog(command: str, grace: int = GRACE_SECONDS) -> str:
    """A POSIX sh command line that runs `command` and dies with the channel."""
    return f"exec sh -c {shlex.quote(_SCRIPT.format(grace=grace))} labctl-run {shlex.quote(command)}"
