"""The attack programs in C: each is a file under c_sources/ (package data; not c/, which
would share this module's import name), read once at import.

The network programs share one head (the tcp() and gateway() helpers): net_head.c holds it and
each net_*.c holds only its main(), so the program is the head followed by its file. plant.c and
find.c name the marker file literally: it must stay labctl.sandbox.programs.MARKER
(tests/unit/test_sandbox_programs_files.py checks it).
"""

from importlib.resources import files

_SOURCES = files("labctl.sandbox.programs").joinpath("c_sources")


def _read(name: str) -> str:
    # Bytes, not read_text: the text must reach the compiler exactly as written, whatever the
    # platform's newline or locale.
    return _SOURCES.joinpath(name).read_bytes().decode("utf-8")


C_FORK = _read("fork.c")
C_MEMORY = _read("memory.c")
C_MEMORY_THREADS = _read("memory_threads.c")
C_DISK = _read("disk.c")  # {path}: filled in by the attack
C_READONLY_ROOT = _read("readonly_root.c")
C_PLANT = _read("plant.c")
C_FIND = _read("find.c")
C_FLOOD = _read("flood.c")  # {fd}: filled in by the attack
C_LINE = _read("line.c")
C_IGNORE_TERM = _read("ignore_term.c")
C_DOUBLE_FORK = _read("double_fork.c")  # {close}: filled in by the attack
C_CPU = _read("cpu.c")
C_NET_HEAD = _read("net_head.c")
C_NET_GATEWAY = C_NET_HEAD + _read("net_gateway.c")
C_NET_OUTSIDE = C_NET_HEAD + _read("net_outside.c")
C_NET_UDP = C_NET_HEAD + _read("net_udp.c")
C_NET_DNS = C_NET_HEAD + _read("net_dns.c")
C_NET_SOCKETS = C_NET_HEAD + _read("net_sockets.c")
C_PROC = _read("proc.c")
C_MOUNT = _read("mount.c")
C_UNSHARE = _read("unshare.c")
C_KEYCTL = _read("keyctl.c")
C_PEERS = _read("peers.c")
C_INCLUDE_SHADOW = _read("include_shadow.c")
C_INCLUDE_HOST = _read("include_host.c")
C_INCLUDE_ZERO = _read("include_zero.c")
C_NEIGHBOUR = _read("neighbour.c")
