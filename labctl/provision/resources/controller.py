"""What a host needs to run labctl itself on a schedule (`labctl cron install`).

`controller_install`: labctl at this controller's exact version under paths.CONTROLLER_DIR
(a release swapped in atomically, recorded so the same version changes nothing).
`ssh_keypair`: a key generated on the host with ssh-keygen; the private half is never read
back (the probe asks for its mode only). `authorized_key`: one marked line in a user's
~/.ssh/authorized_keys, replaced when the key under that mark changes.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from typing import Literal, Optional

from pydantic import Field, field_validator

from labctl.agent.core import paths
from labctl.inventory.model import HostPath
from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State, probe_error
from labctl.provision.resources.bundle import RUNTIME_PROBE, make_bundle, oldest_python, runtime
from labctl.provision.resources.files import edit_lines, file_bytes, owner_ids, plan_file

KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp[0-9]+) [A-Za-z0-9+/=]+\Z")
MARK_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,100}\Z")


class InstallParams(Params):
    root: HostPath = Field(paths.CONTROLLER_DIR, description="where labctl is installed on the host")
    state: Literal["present", "absent"] = "present"


def install_ops(root: str, copy: bool, python: str, host_runtime: str) -> tuple[dict[str, object], str]:
    """The agent op that installs this controller's labctl under `root`, and its release tag."""
    bundle = make_bundle(copy)
    op: dict[str, object] = {
        "op": "install_tree",
        "root": root,
        "tag": bundle.tag,
        "record": {**bundle.record, "host": host_runtime},
        "b64": base64.b64encode(bundle.tar_gz()).decode(),
    }
    if bundle.pip:
        op["pip"] = {"python": python, "requirements": list(bundle.pip)}
    return op, bundle.tag


class ControllerInstall(Resource):
    type_name = "controller_install"
    params_model = InstallParams
    description = "labctl itself at this controller's version (package + dependencies), atomically"
    params: InstallParams

    def label(self) -> str:
        return f"controller_install {self.params.root}"

    def probes(self) -> Probes:
        return {
            "record": {"kind": "file", "path": f"{self.params.root}/current/install.json"},
            "root": {"kind": "file", "path": self.params.root},
            "runtime": {"kind": "command", "argv": [self.host.python, "-c", RUNTIME_PROBE]},
        }

    def plan(self, state: State) -> Change:
        root = self.params.root
        change = Change()
        if self.params.state == "absent":
            if state["root"].get("exists"):
                change.add(f"remove {root}", {"op": "remove_tree", "path": root})
            return change
        probe = state["runtime"]
        if probe.get("rc") != 0:
            raise PlanError(
                f"{self.host.python} on {self.host.name} did not run: {probe.get('stderr') or probe.get('error')}.",
                "Install python3 there (3.8 or newer) or set `python:` for the host in the inventory.",
            )
        host_runtime = str(probe.get("stdout", "")).strip()
        need = oldest_python()
        have_py = tuple(int(x) for x in re.findall(r"\d+", host_runtime.split(" ")[0])[:2])
        if have_py < need:
            raise PlanError(
                f"labctl needs Python {need[0]}.{need[1]} or newer to run on {self.host.name}; "
                f"{self.host.python} there is {host_runtime.split(' ')[0] or 'unknown'}.",
                f"Install python{need[0]}.{need[1]} there and point `python:` of {self.host.name} at it in the inventory.",
            )
        mine = runtime()
        copy = host_runtime == f"{mine['python']} {mine['platform']}"
        want = {**make_bundle(copy).record, "host": host_runtime}
        try:
            have = json.loads(state["record"].get("text") or "null")
        except ValueError:
            have = None
        if have == want:
            return change
        op, tag = install_ops(root, copy, self.host.python, host_runtime)
        how = "copied from this controller" if copy else f"pip install --target on the host ({host_runtime})"
        was = (
            f" (replacing {have.get('labctl')}-{str(have.get('digest'))[:12]})"
            if isinstance(have, dict)
            else ""
        )
        change.add(f"install labctl {tag} in {root}/current, {how}{was}", op)
        return change


class KeypairParams(Params):
    path: HostPath = Field(description="private key path on the host; the public half is PATH.pub")
    comment: str = Field(description="the key's comment, e.g. labctl-orchestrator@pharaoh")
    state: Literal["present", "absent"] = "present"

    @field_validator("comment")
    @classmethod
    def _comment(cls, v: str) -> str:
        if not MARK_RE.match(v):
            raise ValueError(f"{v!r} must be one word of letters, digits, '.', '_', '-' or '@'")
        return v


class SshKeypair(Resource):
    type_name = "ssh_keypair"
    params_model = KeypairParams
    description = "an SSH key pair generated on the host; the private half never leaves it"
    params: KeypairParams

    def label(self) -> str:
        return f"ssh_keypair {self.params.path}"

    def probes(self) -> Probes:
        p = self.params.path
        return {
            "key": {"kind": "file", "path": p, "content": False},
            "pub": {"kind": "file", "path": p + ".pub"},
            "dir": {"kind": "file", "path": p.rsplit("/", 1)[0] or "/"},
        }

    def plan(self, state: State) -> Change:
        p = self.params
        change = Change()
        for key in ("key", "pub", "dir"):
            if probe_error(state, key):
                raise PlanError(f"cannot read {p.path}: {probe_error(state, key)}.")
        if p.state == "absent":
            for key, path in (("key", p.path), ("pub", p.path + ".pub")):
                if state[key].get("exists"):
                    change.add(f"remove {path}", {"op": "remove", "path": path})
            return change
        folder = p.path.rsplit("/", 1)[0] or "/"
        if not state["dir"].get("is_dir"):
            change.add(f"create the folder {folder} (0700)", {"op": "mkdir", "path": folder, "mode": 0o700})
        elif state["dir"].get("mode") != 0o700:
            change.add(f"set mode 0700 on {folder}", {"op": "chmod", "path": folder, "mode": 0o700})
        if not state["key"].get("exists"):
            argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", p.comment, "-f", p.path]
            change.add(
                f"generate an ed25519 key {p.path} ({p.comment}) on the host", {"op": "run", "argv": argv}
            )
            return change
        if state["key"].get("mode") != 0o600:
            change.add(f"set mode 0600 on {p.path}", {"op": "chmod", "path": p.path, "mode": 0o600})
        if not state["pub"].get("exists"):
            q = shlex.quote
            line = f"ssh-keygen -y -f {q(p.path)} | sed 's/$/ {p.comment}/' > {q(p.path + '.pub')}"
            change.add(f"write {p.path}.pub from the private key", {"op": "run", "argv": ["sh", "-c", line]})
        return change


class AuthorizedKeyParams(Params):
    mark: str = Field(description="the comment that marks labctl's line, e.g. labctl-orchestrator@pharaoh")
    key: Optional[str] = Field(None, description="the public key, 'ssh-ed25519 AAAA...'")
    user: Optional[str] = Field(None, description="whose authorized_keys (default: the host's SSH user)")
    state: Literal["present", "absent"] = "present"

    @field_validator("mark")
    @classmethod
    def _mark(cls, v: str) -> str:
        if not MARK_RE.match(v):
            raise ValueError(f"{v!r} must be one word of letters, digits, '.', '_', '-' or '@'")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        words = v.split()
        if len(words) < 2 or not KEY_RE.match(" ".join(words[:2])):
            raise ValueError("a public key is 'TYPE BASE64', e.g. ssh-ed25519 AAAAC3...")
        return " ".join(words[:2])


def authorized_line(key: str, mark: str) -> str:
    return f"{key} {mark}"


class AuthorizedKey(Resource):
    type_name = "authorized_key"
    params_model = AuthorizedKeyParams
    description = "one marked public key in a user's ~/.ssh/authorized_keys"
    params: AuthorizedKeyParams

    def label(self) -> str:
        return f"authorized_key {self.params.mark}"

    @property
    def user(self) -> str:
        return self.params.user or self.host.user

    def probes(self) -> Probes:
        return {"keys": {"kind": "authorized_keys", "user": self.user}}

    def plan(self, state: State) -> Change:
        p = self.params
        st = state["keys"]
        uid, gid = owner_ids(state, "keys")
        gid = st.get("user_gid", gid)
        if p.state == "present" and p.key is None:
            raise PlanError(f"authorized_key {p.mark}: no key given.", "Give key: 'ssh-ed25519 AAAA...'.")
        path, ssh_dir = str(st["path"]), str(st["path"]).rsplit("/", 1)[0]
        if probe_error({"f": st["file"]}, "f"):
            raise PlanError(f"cannot read {path}: {probe_error({'f': st['file']}, 'f')}.")
        # Bytes: a file that is not UTF-8 has no "text", and must not read as empty (all keys lost).
        current = file_bytes(st["file"]) or b""
        line = authorized_line(p.key, p.mark) if p.key else None
        # Any line under our mark is ours: a new key replaces the old one in place.
        # sshd cuts a key line at spaces and tabs only; \s would also take U+00A0, \x85 or \v.
        new = edit_lines(current, line, rf"[ \t]{re.escape(p.mark)}\Z", p.state == "present")
        change = Change()
        if new == current:
            return change
        if p.state == "present" and not st["ssh_dir"].get("is_dir"):
            change.add(
                f"create {ssh_dir} (0700)",
                {"op": "mkdir", "path": ssh_dir, "mode": 0o700},
                {"op": "chmod", "path": ssh_dir, "mode": 0o700, "uid": uid, "gid": gid},
            )
        sub = plan_file(path, new, st["file"], 0o600, uid, gid)
        change.ops += sub.ops
        change.diffs += sub.diffs
        verb = "authorise" if p.state == "present" else "remove"
        change.summary.append(f"{verb} the key marked {p.mark} in {path}")
        return change
