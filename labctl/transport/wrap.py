"""Remote commands that cannot outlive their SSH channel.

A command sshd starts without a pty keeps running when the channel closes. To make
Ctrl-C, timeouts and dropped connections stop it, the command runs in its own session
(process group) while a watcher blocks on the channel's stdin; when the channel goes away
stdin reaches EOF and the watcher kills the whole group (TERM, then KILL after the grace
period if anything is left). Windows hosts run commands as given: their OpenSSH server
ends the session's processes itself.
"""

from __future__ import annotations

import shlex

GRACE_SECONDS = 3

_SCRIPT = (
    # A background job's stdin is /dev/null in sh, so the channel's stdin is kept on fd 3.
    "exec 3<&0; "
    'setsid sh -c "$1" </dev/null 3<&- & p=$!; '
    # Until the child has called setsid() its group does not exist yet: retry while it lives.
    "( cat >/dev/null; while ! kill -TERM -$p 2>/dev/null; do kill -0 $p 2>/dev/null || break; sleep 0.05; done; i=0; "
    "while [ $i -lt {ticks} ] && kill -0 -$p 2>/dev/null; do sleep 0.1; i=$((i+1)); done; "
    "kill -KILL -$p 2>/dev/null ) "
    "<&3 >/dev/null 2>&1 & w=$!; "
    "exec 3<&-; wait $p; rc=$?; kill $w 2>/dev/null; exit $rc"
)


def wrap_with_watchdog(command: str, grace: int = GRACE_SECONDS) -> str:
    """A POSIX sh command line that runs `command` and dies with the channel."""
    return f"exec sh -c {shlex.quote(_SCRIPT.format(ticks=grace * 10))} labctl-run {shlex.quote(command)}"
