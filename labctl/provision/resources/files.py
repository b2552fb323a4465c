"""`file` and `line`: the primitives other resources and playbooks build on."""

from __future__ import annotations

import base64
import re
import string
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

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
    register,
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
        return self


def plan_file(
    path: str,
    want: str | None,
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
            change.add(
                f"remove {path}", {"op": "remove", "path": path}, diff=unified_diff(path, file_text(st), None)
            )
        return change
    current = file_text(st)
    if not exists or current != want:
        op: dict[str, Any] = {"op": "write_file", "path": path, "text": want}
        if mode is not None:
            op["mode"] = mode
        if uid is not None:
            op["uid"] = uid
        if gid is not None:
            op["gid"] = gid
        verb = "create" if not exists else "update"
        change.add(f"{verb} {path}", op, diff=unified_diff(path, current if exists else None, want))
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


@register
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
        if self.regexp is not None:
            try:
                re.compile(self.regexp)
            except re.error as e:
                raise ValueError(f"regexp does not compile: {e}") from None
        return self


def edit_lines(text: str, line: str | None, regexp: str | None, present: bool) -> str:
    """`text` with `line` present once (replacing the first `regexp` match) or absent; pure."""
    lines = text.splitlines()
    pattern = re.compile(regexp) if regexp else None

    def matches(candidate: str) -> bool:
        return bool(pattern.search(candidate)) if pattern else candidate == line

    if present:
        assert line is not None
        if line in lines:
            return text
        for i, candidate in enumerate(lines):
            if matches(candidate):
                lines[i] = line
                break
        else:
            lines.append(line)
    else:
        lines = [c for c in lines if not matches(c) and c != line]
    out = "\n".join(lines)
    return out + "\n" if out else ""


@register
class Line(Resource):
    type_name = "line"
    params_model = LineParams
    description = "one line present (or absent) in a file, the rest kept"
    params: LineParams

    def label(self) -> str:
        return f"line in {self.params.path}"

    def probes(self) -> Probes:
        return {"file": {"kind": "file", "path": self.params.path}, "parent": parent_probe(self.params.path)}

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
        current = file_text(st) or ""
        new = edit_lines(current, p.line, p.regexp, p.state == "present")
        if st.get("exists") and new == current:
            return Change()
        change = plan_file(p.path, new, st, p.mode if not st.get("exists") else None)
        return with_parent(p.path, state.get("parent", {"is_dir": True}), change)
