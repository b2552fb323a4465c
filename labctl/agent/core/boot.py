"""How a host starts the agent cached there: BOOT, and the shell line that runs it.

The controller (hosts/agent_ship.py) runs BOOT for each direct agent call, and the connection
keeper (keeper/agents.py) runs it once per kept connection with `--serve DIGEST`. BOOT runs on the
host with its own python: stdlib only, Python 3.8.
"""

from __future__ import annotations

import shlex
from typing import List

# Runs the cached zipapp only when its bytes still have the hash its name promises (a file cut
# short by a full disk, or damaged since, is replaced instead): one read of ~100 KB per call.
# It runs from agent-<digest>/ beside the zipapp, which the first call extracts from the checked
# bytes: there CPython writes each module's bytecode to __pycache__ once and reads it after, where
# zipimport compiles every module from source on every call (a third of facts.collect's CPU).
# Stdlib only, Python 3.8. See folder() for how an extraction cut short is never used.
BOOT = r"""
import hashlib, os, runpy, sys
# --read-only (call_agent's read_only): write nothing here; a folder already whole is still used.
write = sys.argv[1] != "--read-only"
if not write:
    del sys.argv[1]
path, digest = sys.argv[1], sys.argv[2]
try:
    with open(path, "rb") as f:
        data = f.read()
    whole = hashlib.sha256(data).hexdigest().startswith(digest)
except OSError:
    whole = False
if not whole:
    sys.exit(197)

def folder():
    # agent-<digest>/, extracted whole, or None to run the zipapp itself. Only a complete
    # extraction, its marker written last and all of it on disk (fsync), is renamed into place:
    # a folder there is whole, and one cut short (killed, disk full, power lost) stays a
    # .tmp-* sibling that nothing runs. Two calls extracting at once both work: the rename
    # is atomic, and the loser drops its copy and uses the winner's.
    if not path.endswith(".pyz"):
        return None
    root = os.path.abspath(path[:-4])
    mark = os.path.join(root, ".complete")
    if os.path.exists(mark):
        return root
    if not write or os.path.isdir(root):
        # A read-only call extracts nothing. A folder in place but not whole (no extraction of
        # ours leaves that) is never run, nor replaced under whoever may be using it.
        return None
    import io, shutil, zipfile
    tmp = "%s.tmp-%d-%s" % (root, os.getpid(), os.urandom(4).hex())
    try:
        os.mkdir(tmp, 0o700)  # as private as the zipapp's folder
    except OSError:
        return None  # a read-only disk, or a folder this user may not write: the zipapp runs
    try:
        made = [tmp]
        zf = zipfile.ZipFile(io.BytesIO(data))
        for name in zf.namelist():
            parts = name.split("/")
            where = tmp
            for part in parts[:-1]:
                where = os.path.join(where, part)
                if where not in made:
                    os.mkdir(where, 0o700)
                    made.append(where)
            fd = os.open(os.path.join(where, parts[-1]), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(zf.read(name))
                f.flush()
                os.fsync(f.fileno())
        for where in made:
            # Made here, 0700: CPython would make its own __pycache__ as the umask says.
            os.mkdir(os.path.join(where, "__pycache__"), 0o700)
        fd = os.open(os.path.join(tmp, ".complete"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fsync(fd)
        os.close(fd)
        for where in made:  # the names, as well as the bytes, on disk before the rename
            fd = os.open(where, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.rename(tmp, root)  # fails where another call's folder is already in place
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
    return root if os.path.exists(mark) else None

if sys.path and sys.path[0] == "":
    del sys.path[0]
sys.argv = [path] + sys.argv[3:]
root = folder()
if root:
    # The folder is the agent's own cache: its bytecode is the point even where the host's
    # environment says PYTHONDONTWRITEBYTECODE (this process only; children keep the variable).
    # A read-only call reads the bytecode there but writes none.
    sys.dont_write_bytecode = not write
runpy.run_path(root or path, run_name="__main__")
"""
MISSING_RC = 197  # BOOT's "no agent of this hash here (yet, or no longer whole)"


def boot_line(python: str, path: str, digest: str, argv: List[str], read_only: bool = False) -> str:
    """The shell line that runs the agent cached at `path` (BOOT) with `argv`."""
    boot_args = ["--read-only"] if read_only else []
    return (
        f"exec {shlex.quote(python)} -c {shlex.quote(BOOT)} {shlex.join([*boot_args, path, digest, *argv])}"
    )
