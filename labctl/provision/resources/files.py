"""`file` and `line`: the primitives other resources and playbooks build on."""

from __future__ import annotations

import base64
import hashlib
import re
import string
from typing import Any, AnyStr, Literal, Optional

from pydantic import Field, model_validator

from labctl.agent.core.fsutil import MAX_CONTENT
from labctl.agent.core.textedit import edit_line
from labctl.inventory.model import Host, HostPath
from labctl.provision.resource import (
    Change,
    FileMode,
    Params,
    PlanError,
    Probes,
    Resource,
    State,
    probe_error,
    unified_diff,
)


def host_vars(host: Host) -> dict[str, str]:
    return {"name": host.name, "address": host.address, "roles": ",".join(host.roles), "user": host.user}


def file_text(state: dict[str, Any]) -> str | None:
    if not state.get("exists"):
        return None
    if "text" in state:
        return str(state["text"])
    if "b64" in state:
        return base64.b64decode(state["b64"]).decode("utf-8", "replace")
    return None


def file_bytes(state: dict[str, Any]) -> bytes | None:
    """The file's bytes as the probe sent them; None when absent or not sent (too large)."""
    if not state.get("exists"):
        return None
    if "text" in state:
        return str(state["text"]).encode("utf-8", "surrogateescape")
    if "b64" in state:
        return base64.b64decode(state["b64"])
    return None


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content


def same_content(st: dict[str, Any], want: bytes) -> bool:
    """Whether the probed file holds `want`. The agent sends a file's sha256 at any size but its
    content only up to MAX_CONTENT, so the hash is what both sides compare whenever it is there."""
    if st.get("sha256"):
        return bool(st["sha256"] == hashlib.sha256(want).hexdigest())
    return file_bytes(st) == want


def content_diff(path: str, st: dict[str, Any], want: bytes | None) -> str:
    """The diff --diff shows; for content too large to send or show, one line saying so."""
    old = file_bytes(st)
    if (st.get("exists") and old is None) or max(len(old or b""), len(want or b"")) > MAX_CONTENT:
        now = f"{st.get('size', len(old or b''))} bytes" if st.get("exists") else "no file"
        planned = "no file" if want is None else f"{len(want)} bytes"
        return (
            f"--- {path} (now)\n+++ {path} (planned)\n"
            f"@@ content differs: {now} now, {planned} planned; too large to show @@\n"
        )

    def shown(data: bytes | None) -> str | None:
        return None if data is None else data.decode("utf-8", "replace")

    return unified_diff(path, shown(old) if st.get("exists") else None, shown(want))


def write_op(path: str, data: bytes) -> dict[str, Any]:
    """A write_file op carrying `data` byte for byte: as text when it is UTF-8, else base64."""
    try:
        return {"op": "write_file", "path": path, "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"op": "write_file", "path": path, "b64": base64.b64encode(data).decode()}


def writable_text(field: str, value: str | None) -> None:
    """ValueError when `value` holds a lone surrogate (YAML's "\\ud800"): no file can hold it."""
    bad = re.search("[\ud800-\udfff]", value or "")
    if bad:
        raise ValueError(
            f"{field} holds {bad.group()!r}, half of a UTF-16 pair that no UTF-8 file can hold; "
            "write the character itself (or its \\U0001XXXX escape)"
        )


class FileParams(Params):
    path: HostPath = Field(description="absolute path on the host, e.g. path: /etc/motd")
    content: Optional[str] = Field(None, description="the file's text")
    template: bool = Field(False, description="substitute $name, $address, $roles, $user in content")
    mode: Optional[FileMode] = Field(None, description='e.g. mode: "0644"')
    owner: Optional[str] = Field(None, description="user name, e.g. owner: root")
    group: Optional[str] = Field(None, description="group name, e.g. group: root")
    state: Literal["present", "absent"] = "present"

    @model_validator(mode="after")
    def _content_needed(self) -> FileParams:
        if self.state == "present" and self.content is None:
            raise ValueError("a present file needs content (or state: absent)")
        writable_text("content", self.content)
        return self


def plan_file(
    path: str,
    want: str | bytes | None,
    st: dict[str, Any],
    mode: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> Change:
    """The change that makes `path` hold `want` (None: absent) with mode/owner; pure."""
    change = Change()
    exists = bool(st.get("exists"))
    if st.get("is_dir"):
        raise PlanError(f"{path} is a directory, not a file.", "Remove it or choose another path.")
    if want is None:
        if exists:
            change.add(f"remove {path}", {"op": "remove", "path": path}, diff=content_diff(path, st, None))
        return change
    data = _as_bytes(want)
    if not exists or not same_content(st, data):
        op = write_op(path, data)
        if mode is not None:
            op["mode"] = mode
        if uid is not None:
            op["uid"] = uid
        if gid is not None:
            op["gid"] = gid
        verb = "create" if not exists else "update"
        change.add(f"{verb} {path}", op, diff=content_diff(path, st, data))
        return change
    fix: dict[str, Any] = {}
    if mode is not None and st.get("mode") != mode:
        fix["mode"] = mode
    if uid is not None and st.get("uid") != uid:
        fix["uid"] = uid
    if gid is not None and st.get("gid") != gid:
        fix["gid"] = gid
    if fix:
        change.add(
            f"set {', '.join(fix)} of {path}",
            {
                "op": "chmod",
                "path": path,
                "mode": fix.get("mode", st.get("mode")),
                **{k: v for k, v in fix.items() if k != "mode"},
            },
        )
    return change


def with_parent(path: str, parent: dict[str, Any], change: Change) -> Change:
    """`change`, preceded by creating the folder `path` goes in when it is missing."""
    if not change.changed or parent.get("is_dir"):
        return change
    folder = path.rsplit("/", 1)[0] or "/"
    if parent.get("exists"):
        raise PlanError(
            f"{folder} exists but is not a folder, so {path} cannot be written.",
            "Remove it or choose another path.",
        )
    out = Change()
    out.add(f"create the folder {folder}", {"op": "mkdir", "path": folder, "mode": 0o755})
    out.ops += change.ops
    out.summary += change.summary
    out.diffs += change.diffs
    return out


def parent_probe(path: str) -> dict[str, Any]:
    return {"kind": "file", "path": path.rsplit("/", 1)[0] or "/"}


def owner_ids(state: State, key: str) -> tuple[int | None, int | None]:
    ids = state.get(key) or {}
    for err_key in ("uid_error", "gid_error", "error"):
        if ids.get(err_key):
            raise PlanError(
                str(ids[err_key]) + ".", "Create it on the host first, or fix owner/group in the playbook."
            )
    return ids.get("uid"), ids.get("gid")


class File(Resource):
    type_name = "file"
    params_model = FileParams
    description = "a file with exact content, mode and owner (atomic replace)"
    params: FileParams

    def label(self) -> str:
        return f"file {self.params.path}"

    def desired(self) -> str | None:
        p = self.params
        if p.state == "absent" or p.content is None:
            return None
        return string.Template(p.content).safe_substitute(host_vars(self.host)) if p.template else p.content

    def probes(self) -> Probes:
        probes: Probes = {
            "file": {"kind": "file", "path": self.params.path},
            "parent": parent_probe(self.params.path),
        }
        if self.params.owner or self.params.group:
            probes["ids"] = {"kind": "ids", "user": self.params.owner, "group": self.params.group}
        return probes

    def plan(self, state: State) -> Change:
        err = probe_error(state, "file")
        if err:
            raise PlanError(f"cannot read {self.params.path}: {err}.")
        uid, gid = owner_ids(state, "ids") if "ids" in state else (None, None)
        change = plan_file(self.params.path, self.desired(), state["file"], self.params.mode, uid, gid)
        return with_parent(self.params.path, state.get("parent", {"is_dir": True}), change)


class LineParams(Params):
    path: HostPath = Field(description="absolute path, e.g. path: /etc/sysctl.d/90-labctl.conf")
    line: Optional[str] = Field(None, description="the whole line, e.g. line: vm.swappiness = 10")
    regexp: Optional[str] = Field(
        None, description="lines matching this are replaced (present) or removed (absent)"
    )
    state: Literal["present", "absent"] = "present"
    create: bool = Field(True, description="create the file when missing")
    mode: Optional[FileMode] = Field(None, description='mode for a created file, e.g. mode: "0644"')

    @model_validator(mode="after")
    def _needs(self) -> LineParams:
        if self.state == "present" and self.line is None:
            raise ValueError("state: present needs line")
        if self.line is None and self.regexp is None:
            raise ValueError("give line or regexp")
        if self.line is not None and any(ord(c) < 32 and c != "\t" for c in self.line):
            raise ValueError("line must be a single line of text, without control characters")
        writable_text("line", self.line)
        if self.regexp is not None:
            try:
                re.compile(self.regexp)
            except re.error as e:
                raise ValueError(f"regexp does not compile: {e}") from None
        return self


def edit_lines(text: AnyStr, line: str | None, regexp: str | None, present: bool) -> AnyStr:
    """`text` with `line` present once (replacing the first `regexp` match) or absent; pure.
    Lines are cut at "\\n" only, and every byte but the managed line's stays (textedit)."""
    if isinstance(text, str):
        data = edit_line(text.encode("utf-8", "surrogateescape"), line, regexp, present)
        return data.decode("utf-8", "surrogateescape")
    return edit_line(text, line, regexp, present)


class Line(Resource):
    type_name = "line"
    params_model = LineParams
    description = "one line present (or absent) in a file, the rest kept"
    params: LineParams

    def label(self) -> str:
        return f"line in {self.params.path}"

    def probes(self) -> Probes:
        # whole: the edit needs the content at any size (the agent's default stops at MAX_CONTENT).
        return {
            "file": {"kind": "file", "path": self.params.path, "whole": True},
            "parent": parent_probe(self.params.path),
        }

    def plan(self, state: State) -> Change:
        p = self.params
        st = state["file"]
        if probe_error(state, "file"):
            raise PlanError(f"cannot read {p.path}: {probe_error(state, 'file')}.")
        if not st.get("exists"):
            if p.state == "absent":
                return Change()
            if not p.create:
                raise PlanError(f"{p.path} does not exist.", "Create it first or set create: true.")
        current = file_bytes(st)
        if current is None and st.get("exists") and not st.get("is_dir"):
            raise PlanError(
                f"{p.path} is not a regular file, so labctl cannot edit a line in it.",
                "Point path at a regular file, or replace it with one by hand.",
            )
        current = current or b""
        new = edit_lines(current, p.line, p.regexp, p.state == "present")
        if st.get("exists") and new == current:
            return Change()
        change = plan_file(p.path, new, st, p.mode if not st.get("exists") else None)
        return with_parent(p.path, state.get("parent", {"is_dir": True}), change)
