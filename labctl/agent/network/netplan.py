"""netplan's own parser as the judge of a config, before anything is applied.

`netplan generate --root-dir DIR` reads DIR/{lib,etc,run}/netplan/*.yaml exactly as it reads
the host's, so a copy of the host's files with the new ones laid over them is checked offline,
without touching /etc/netplan or /run. netplan accepts some configs silently that still break
a bond (a member that keeps an address from another file: the files merge); those are read
back from the merged config with `netplan get --root-dir DIR`.

Standard library only, Python 3.8: it runs on the host, and the controller's tests import it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ETC_DIR = "/etc/netplan"
# netplan reads all three; a file in /run hides one of the same name in /etc, which hides /lib.
OTHER_DIRS = ("/lib/netplan", "/run/netplan")
NETPLAN_TIMEOUT_S = 60.0
MAX_MESSAGE = 2000


def netplan_binary() -> Optional[str]:
    """netplan's path; /usr/sbin is not on the PATH of every SSH session."""
    found = shutil.which("netplan")
    if found:
        return found
    return next((p for p in ("/usr/sbin/netplan", "/sbin/netplan") if os.access(p, os.X_OK)), None)


def _netplan_dir(folder: str) -> str:
    """The folder of netplan's that `folder` stands for: /lib/netplan or /run/netplan."""
    for known in OTHER_DIRS:
        if folder.rstrip("/").endswith(known):
            return known
    raise ValueError(f"{folder} is not one of netplan's folders ({', '.join(OTHER_DIRS)})")


class _Root:
    """A temporary root with the host's netplan files and the new ones laid over them."""

    def __init__(self, new_files: Dict[str, Optional[str]], etc_dir: str, other_dirs: Sequence[str]) -> None:
        self.path = tempfile.mkdtemp(prefix="labctl-netplan-")
        # The files that were there before: a conflict found in one of these is named by it.
        self.existing: Dict[str, str] = {}
        try:
            for src in [*list(other_dirs), etc_dir]:
                host_dir = ETC_DIR if src == etc_dir else _netplan_dir(src)
                dest = self.path + host_dir
                os.makedirs(dest, exist_ok=True)
                try:
                    names = sorted(os.listdir(src))
                except FileNotFoundError:
                    continue
                for name in names:
                    if name.endswith(".yaml") and os.path.isfile(os.path.join(src, name)):
                        with open(os.path.join(src, name), encoding="utf-8", errors="replace") as f:
                            text = f.read()
                        self._write(os.path.join(dest, name), text)
                        self.existing[os.path.join(host_dir, name)] = text
            for path, new_text in new_files.items():
                folder, name = os.path.split(path)
                if folder not in (ETC_DIR, etc_dir) or not name.endswith(".yaml"):
                    raise ValueError(f"{path} is not a .yaml file in {ETC_DIR}")
                target = os.path.join(self.path + ETC_DIR, name)
                self.existing.pop(os.path.join(ETC_DIR, name), None)
                if new_text is None:
                    if os.path.exists(target):
                        os.unlink(target)
                else:
                    self._write(target, new_text)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _write(path: str, text: str) -> None:
        # netplan warns about (and newer versions refuse) files others can read: 600 as on a host.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o600)

    def run(self, netplan: str, *args: str) -> Tuple[int, str, str]:
        # With SNAP set, netplan's front end ignores --root-dir and has the host's netplan service
        # regenerate the live config over D-Bus: a check must never inherit it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNAP")}
        try:
            proc = subprocess.run(
                [netplan, *args, "--root-dir", self.path],
                capture_output=True,
                text=True,
                timeout=NETPLAN_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return 124, "", f"netplan {args[0]} did not finish in {NETPLAN_TIMEOUT_S:.0f} s"
        # Messages name the temporary copy; the person fixes the host's file of the same name.
        return proc.returncode, proc.stdout, proc.stderr.replace(self.path, "")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "_Root":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _trim(message: str) -> str:
    message = message.strip()
    if message.startswith("Traceback"):
        # netplan's Python front end lets libnetplan's parse errors escape as a traceback: the
        # message worth reading is the exception's, after its class name.
        last = re.search(r"^\w[\w.]*(?:Exception|Error): ", message, re.MULTILINE)
        if last:
            message = message[last.end() :].strip()
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + " ..."
    return message


def _generate(root: _Root, netplan: str) -> List[str]:
    """netplan's refusal of the copy's config, as the one problem; [] when it accepts it."""
    rc, _out, err = root.run(netplan, "generate")
    if rc == 0:
        return []
    return [_trim(err) or f"netplan generate failed (exit {rc}) without a message"]


def _on_copy(
    new_files: Dict[str, Optional[str]],
    etc_dir: str,
    other_dirs: Sequence[str],
    check: Callable[[_Root, str], List[str]],
) -> List[str]:
    """`check(root, netplan)` on a copy of the host's netplan files with `new_files` applied;
    its problems, or why it could not run (no netplan, the copy failed)."""
    netplan = netplan_binary()
    if netplan is None:
        return ["netplan is not installed (apt-get install netplan.io)"]
    try:
        root = _Root(new_files, etc_dir, other_dirs)
    except (OSError, ValueError) as e:
        return [f"could not copy the host's netplan files to check them: {e}"]
    with root:
        return check(root, netplan)


def check_files(
    new_files: Dict[str, Optional[str]],
    etc_dir: str = ETC_DIR,
    other_dirs: Sequence[str] = OTHER_DIRS,
) -> Optional[str]:
    """None when netplan accepts the host's config with `new_files` applied (path -> text,
    None removes the file), else netplan's message, naming the host's paths."""
    problems = _on_copy(new_files, etc_dir, other_dirs, _generate)
    return problems[0] if problems else None


def member_conflicts(
    new_files: Dict[str, Optional[str]],
    members: Sequence[str],
    etc_dir: str = ETC_DIR,
    other_dirs: Sequence[str] = OTHER_DIRS,
    nic_ids: Optional[Dict[str, Dict[str, Optional[str]]]] = None,
) -> List[str]:
    """Each bond member that the merged config still gives an address, DHCP, routes or a VLAN
    of its own, from another file: netplan accepts that silently, but a bond member must carry
    nothing of its own. `nic_ids` ({nic: {"mac", "driver"}}) resolves definitions that match
    a NIC by MAC address or driver."""
    return _on_copy(
        new_files,
        etc_dir,
        other_dirs,
        lambda root, netplan: _conflicts(root, netplan, members, nic_ids or {}),
    )


def netplan_problems(
    new_files: Dict[str, Optional[str]],
    members: Sequence[str],
    etc_dir: str = ETC_DIR,
    other_dirs: Sequence[str] = OTHER_DIRS,
    nic_ids: Optional[Dict[str, Dict[str, Optional[str]]]] = None,
) -> List[str]:
    """check_files and member_conflicts on one copy: netplan's refusal, else the conflicts."""
    return _on_copy(
        new_files,
        etc_dir,
        other_dirs,
        lambda root, netplan: _generate(root, netplan) or _conflicts(root, netplan, members, nic_ids or {}),
    )


def _conflicts(
    root: _Root, netplan: str, members: Sequence[str], nic_ids: Dict[str, Dict[str, Optional[str]]]
) -> List[str]:
    # "all", not "network": netplan 0.106 fails on a key under an empty config.
    rc, out, err = root.run(netplan, "get", "all")
    if rc != 0:
        return ["netplan get could not read the merged config: " + (_trim(err) or f"exit {rc}")]
    try:
        document = parse_netplan_yaml(out)
    except ValueError as e:
        return [f"netplan get answered in a shape labctl cannot read ({e}): {_trim(out)[:200]}"]
    network = document.get("network") if isinstance(document, dict) else None
    if not isinstance(network, dict):
        return []
    problems: List[str] = []
    ethernets = network.get("ethernets") or {}
    for member in members:
        for ident, spec in sorted(ethernets.items()) if isinstance(ethernets, dict) else []:
            if not isinstance(spec, dict) or not _applies(ident, spec, member, nic_ids.get(member) or {}):
                continue
            what = _own_config(spec)
            if what:
                named = member if ident == member else f"{member} (as {ident})"
                problems.append(
                    "bond member {} still has {}{}; a bond member must carry nothing of its own: "
                    "remove that there".format(named, ", ".join(what), _source(root, ident))
                )
        vlans = network.get("vlans") or {}
        for ident, spec in sorted(vlans.items()) if isinstance(vlans, dict) else []:
            if isinstance(spec, dict) and spec.get("link") == member:
                problems.append(
                    f"VLAN {ident} runs over bond member {member}{_source(root, ident)}; put it on the bond (link: the bond's name) "
                    "or remove it"
                )
    return problems


def _applies(ident: str, spec: Dict[str, Any], member: str, ids: Dict[str, Optional[str]]) -> bool:
    """Whether an `ethernets` definition configures the NIC `member` (by its id, its set-name,
    or its match: name glob, MAC address, driver)."""
    if spec.get("set-name") == member:
        return True
    match = spec.get("match")
    if not isinstance(match, dict) or not match:
        return ident == member
    if "name" in match and not fnmatch.fnmatchcase(member, str(match["name"])):
        return False
    if "macaddress" in match:
        mac = ids.get("mac")
        if not mac or mac.lower() != str(match["macaddress"]).lower():
            return False
    if "driver" in match:
        drivers = match["driver"] if isinstance(match["driver"], list) else [match["driver"]]
        driver = ids.get("driver")
        if not driver or not any(fnmatch.fnmatchcase(driver, str(d)) for d in drivers):
            return False
    return any(k in match for k in ("name", "macaddress", "driver"))


def _own_config(spec: Dict[str, Any]) -> List[str]:
    what: List[str] = []
    addresses = spec.get("addresses") or []
    if isinstance(addresses, list) and addresses:
        shown = [next(iter(a)) if isinstance(a, dict) and a else str(a) for a in addresses]
        what.append("address{} {}".format("es" if len(shown) > 1 else "", ", ".join(shown)))
    for key in ("dhcp4", "dhcp6"):
        if spec.get(key) is True:
            what.append(key + ": true")
    if spec.get("routes"):
        what.append("routes")
    return what


def _source(root: _Root, ident: str) -> str:
    word = re.compile(r"(?<![\w.-])" + re.escape(ident) + r"(?![\w.-])")
    files = [path for path, text in sorted(root.existing.items()) if word.search(text)]
    return " (from {})".format(", ".join(files)) if files else ""


# --- netplan's YAML, read without a YAML library --------------------------------------------
# `netplan get` prints block-style YAML from its own emitter: two-space indents, sequences at
# their key's indent, double-quoted or plain scalars. This reads that shape, not YAML at large.


def parse_netplan_yaml(text: str) -> Any:
    """The data of `netplan get`'s output. ValueError for a shape outside what it prints."""
    lines: List[List[Any]] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError("a tab in the indentation")
        lines.append([len(raw) - len(raw.lstrip(" ")), stripped])
    if not lines:
        return None
    if len(lines) == 1 and not _is_item(lines[0][1]) and _split_key(lines[0][1]) is None:
        return _scalar(lines[0][1])
    value, end = _block(lines, 0, lines[0][0])
    if end != len(lines):
        raise ValueError(f"line {lines[end][1]!r} is out of place")
    return value


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _block(lines: List[List[Any]], i: int, indent: int) -> Tuple[Any, int]:
    if _is_item(lines[i][1]):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: List[List[Any]], i: int, indent: int) -> Tuple[List[Any], int]:
    items: List[Any] = []
    while i < len(lines) and lines[i][0] == indent and _is_item(lines[i][1]):
        rest = lines[i][1][1:].lstrip()
        if not rest:
            if i + 1 < len(lines) and lines[i + 1][0] > indent:
                value, i = _block(lines, i + 1, lines[i + 1][0])
            else:
                value, i = None, i + 1
        elif _is_item(rest) or _split_key(rest) is not None:
            # "- key: value" opens a mapping whose further keys sit under "key".
            column = indent + len(lines[i][1]) - len(rest)
            lines[i] = [column, rest]
            value, i = _block(lines, i, column)
        else:
            value, i = _scalar(rest), i + 1
        items.append(value)
    return items, i


def _mapping(lines: List[List[Any]], i: int, indent: int) -> Tuple[Dict[str, Any], int]:
    out: Dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not _is_item(lines[i][1]):
        split = _split_key(lines[i][1])
        if split is None:
            raise ValueError(f"expected 'key: value', found {lines[i][1]!r}")
        key, rest = split
        i += 1
        if rest:
            out[key] = _scalar(rest)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and _is_item(lines[i][1]))):
            out[key], i = _block(lines, i, lines[i][0])
        else:
            out[key] = None
    if i < len(lines) and lines[i][0] > indent:
        raise ValueError(f"line {lines[i][1]!r} is indented too far")
    return out, i


def _split_key(text: str) -> Optional[Tuple[str, str]]:
    """("key", "rest") for "key: rest" or "key:", with a quoted key unquoted; else None."""
    if text[:1] in ('"', "'"):
        end = _quote_end(text)
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        after = text[end + 2 :]
        if after and not after.startswith(" "):
            return None
        return str(_scalar(text[: end + 1])), after.strip()
    if text[:1] in ("[", "{"):
        return None
    if text.endswith(":"):
        return text[:-1], ""
    pos = text.find(": ")
    if pos <= 0:
        return None
    return text[:pos], text[pos + 2 :].strip()


def _quote_end(text: str) -> int:
    quote, i = text[0], 1
    while i < len(text):
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            if quote == "'" and text[i + 1 : i + 2] == "'":
                i += 2
                continue
            return i
        i += 1
    return -1


def _scalar(text: str) -> Any:
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        try:
            return json.loads(text)
        except ValueError:
            return text[1:-1]
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text in ("null", "~", "Null"):
        return None
    if text == "[]":
        return []
    if text == "{}":
        return {}
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(part.strip()) for part in text[1:-1].split(",") if part.strip()]
    return text
