"""`model_cache`: the RAM model cache, a tmpfs at the inventory's `model_cache.path`.

Persistent through one marked /etc/fstab entry (edited atomically, with a backup). It never
shrinks a mount below what it holds (that would lose models) and refuses a size that would
leave the host short of RAM when the cache fills. Sizes are GiB, as tmpfs `size=NG` means.
"""

from __future__ import annotations

import re
from typing import Any, AnyStr, Optional

from pydantic import Field, field_validator

from labctl.agent.core import paths
from labctl.agent.core.textedit import body, newline_of, split_lines
from labctl.inventory.model import Host, MountPath, cache_mib, cache_size_gb
from labctl.provision.resource import (
    Change,
    FileMode,
    NotApplicable,
    Params,
    PlanError,
    Probes,
    Resource,
    State,
    probe_error,
)
from labctl.provision.resources.files import file_bytes, plan_file

GIB = 1 << 30
FSTAB = "/etc/fstab"
MARK = "# labctl:model_cache"


class ModelCacheParams(Params):
    path: Optional[MountPath] = Field(None, description="override the inventory's model_cache.path")
    size_gb: Optional[float] = Field(
        None, gt=0, description="override the inventory's model_cache.size_gb (GiB)"
    )
    reserve_gb: float = Field(
        8, ge=0, description="RAM (GiB) that must stay free for the host with the cache full"
    )
    mode: FileMode = Field(0o755, description='mode of the mount point, e.g. mode: "0755"')

    @field_validator("size_gb")
    @classmethod
    def _mountable_size(cls, v: Optional[float]) -> Optional[float]:
        return None if v is None else cache_size_gb(v)


def fstab_escape(path: str) -> str:
    """`path` as one fstab field: fstab(5) splits on blanks and reads `\\NNN` as octal."""
    return path.replace("\\", "\\134").replace(" ", "\\040")


def fstab_unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fstab_entry(path: str, size_gb: float, mode: int) -> str:
    return f"tmpfs {fstab_escape(path)} tmpfs {tmpfs_options(size_gb, mode)} 0 0"


def tmpfs_options(size_gb: float, mode: int) -> str:
    return f"size={_size_arg(size_gb)},mode={mode:04o},nosuid,nodev"


def _size_arg(size_gb: float) -> str:
    mib = cache_mib(size_gb)
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def edit_fstab(text: AnyStr, path: str, entry: str) -> AnyStr:
    """fstab with labctl's marked entry for `path` present exactly once, where it was; pure.

    An unmarked line that mounts the same path belongs to someone else: refuse rather
    than mount twice or silently take it over. Lines others add around ours stay put, and
    ours is rewritten in place, so a tool appending after it does not make us move it.
    Lines are cut at "\\n" only, as mount(8) reads them, and every other byte stays as it was.
    """
    if isinstance(text, str):
        return _edit_fstab(text.encode("utf-8", "surrogateescape"), path, entry).decode(
            "utf-8", "surrogateescape"
        )
    return _edit_fstab(text, path, entry)


def _edit_fstab(data: bytes, path: str, entry: str) -> bytes:
    mark, new = f"{MARK} {path}".encode(), entry.encode()
    nl = newline_of(data)
    pieces = split_lines(data)

    def mounts_path(line: bytes) -> bool:
        fields = line.split()  # bytes: blanks as mount(8) sees them, not U+2028 or U+00A0
        return (
            len(fields) >= 2
            and not line.lstrip().startswith(b"#")
            and fstab_unescape(fields[1].decode("utf-8", "surrogateescape")) == path
        )

    out: list[bytes] = []
    placed = False
    i = 0
    while i < len(pieces):
        piece = pieces[i]
        line = body(piece)
        i += 1
        if line.strip() == mark:
            # Our old entry follows the marker: replaced in place, keeping its own line ending.
            ours = i < len(pieces) and mounts_path(body(pieces[i]))
            ending = pieces[i][len(body(pieces[i])) :] if ours else nl
            i += ours
            if not placed:
                out += [line + (piece[len(line) :] or nl), new + ending]
                placed = True
            continue
        if mounts_path(line):
            shown = line.decode("utf-8", "replace").strip()
            raise PlanError(
                f"{FSTAB} line {i} already mounts {path} and was not written by labctl: {shown!r}.",
                "Remove that line, or point model_cache.path somewhere else.",
            )
        out.append(piece)
    result = b"".join(out)
    if not placed:
        if result and not result.endswith(b"\n"):
            result += nl
        result += mark + nl + new + nl
    return result


class ModelCache(Resource):
    type_name = "model_cache"
    params_model = ModelCacheParams
    description = "tmpfs RAM cache for models, with its fstab entry and manifest folder"
    params: ModelCacheParams

    @classmethod
    def from_playbook(cls, host: Host, raw: dict[str, Any]) -> Resource:
        params = ModelCacheParams.model_validate(raw)
        mc = host.model_cache
        if mc is None and (params.path is None or params.size_gb is None):
            raise NotApplicable("no model_cache in the inventory for this host")
        if params.path is None:
            params.path = mc.path if mc else None
        if params.size_gb is None:
            params.size_gb = mc.size_gb if mc else None
        return cls(host, params)

    @property
    def path(self) -> str:
        assert self.params.path is not None
        return self.params.path.rstrip("/") or "/"

    @property
    def size_gb(self) -> float:
        assert self.params.size_gb is not None
        return self.params.size_gb

    def label(self) -> str:
        return f"model_cache {self.path} {self.size_gb:g}G"

    def probes(self) -> Probes:
        return {
            "mount": {"kind": "mount", "path": self.path},
            "mem": {"kind": "meminfo"},
            "fstab": {"kind": "file", "path": FSTAB, "whole": True},
            "manifest": {"kind": "file", "path": f"{self.path}/{paths.CACHE_META}"},
        }

    def plan(self, state: State) -> Change:
        for key in ("mount", "mem", "fstab"):
            if probe_error(state, key):
                raise PlanError(f"cannot read the host's {key}: {probe_error(state, key)}.")
        path, size = self.path, cache_mib(self.size_gb) << 20  # what the mount reports
        total = int(state["mem"]["total_bytes"])
        reserve = int(self.params.reserve_gb * GIB)
        if total - size < reserve:
            biggest = max(0.0, (total - reserve) / GIB)
            raise PlanError(
                f"a {self.size_gb:g} GiB cache at {path} would leave {self.host.name} {(total - size) / GIB:.1f} GiB "
                f"of its {total / GIB:.1f} GiB RAM once full, under the {self.params.reserve_gb:g} GiB reserve.",
                f"Set model_cache.size_gb to at most {biggest:.0f} in the inventory, or lower reserve_gb in the playbook.",
            )
        change = Change()
        mount: dict[str, Any] = state["mount"]
        opts = tmpfs_options(self.size_gb, self.params.mode)
        if not mount.get("mounted"):
            change.add(
                f"mount a {self.size_gb:g} GiB tmpfs at {path}",
                {"op": "mkdir", "path": path},
                {"op": "run", "argv": ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path]},
            )
        elif mount.get("fstype") != "tmpfs":
            raise PlanError(
                f"{path} is already a {mount.get('fstype')} mount ({mount.get('device')}), not a tmpfs.",
                "Unmount it or point model_cache.path elsewhere; labctl will not mount over it.",
            )
        elif int(mount.get("size_bytes", 0)) != size:
            used = int(mount.get("used_bytes", 0))
            if used > size:
                raise PlanError(
                    f"{path} holds {used / GIB:.1f} GiB; shrinking it to {self.size_gb:g} GiB would lose models.",
                    "Evict models first (labctl cache evict), or keep size_gb at least that large.",
                )
            change.add(
                f"resize the tmpfs at {path} from {int(mount['size_bytes']) / GIB:g} to {self.size_gb:g} GiB",
                {"op": "run", "argv": ["mount", "-o", f"remount,size={_size_arg(self.size_gb)}", path]},
            )
        fstab = state["fstab"]
        current = file_bytes(fstab) or b""
        wanted = edit_fstab(current, path, fstab_entry(path, self.size_gb, self.params.mode))
        if wanted != current:
            fs_change = plan_file(FSTAB, wanted, fstab)
            for op in fs_change.ops:
                if op["op"] == "write_file":
                    op["backup"] = paths.FSTAB_BACKUP
            change.add(
                f"persist it in {FSTAB} (the old one kept as {paths.FSTAB_BACKUP})",
                {"op": "mkdir", "path": paths.BACKUP_DIR, "mode": 0o700},
                *fs_change.ops,
                diff="".join(fs_change.diffs),
            )
        if not state.get("manifest", {}).get("is_dir") or not mount.get("mounted"):
            change.add(
                f"create the manifest folder {path}/{paths.CACHE_META}",
                {"op": "mkdir", "path": f"{path}/{paths.CACHE_META}", "mode": 0o755},
            )
        return change
