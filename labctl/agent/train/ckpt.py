"""The reference trainer's checkpoints: written atomically, validated by hash, pruned, agreed on.

A checkpoint is two files in the run's checkpoint folder on one host:

- `step-00000120.pt`: whatever state the trainer saves (torch.save), and
- `step-00000120.json`: its manifest (sha256 and size of the .pt, step, model config, time).

Both are written to a temporary name in the same folder, flushed, fsynced and renamed, the
.pt first: a manifest therefore only exists for a .pt that was complete. A checkpoint is
valid when its manifest is present and readable, and the .pt has the manifest's size and
sha256; anything else (a crash mid-write, a truncated copy, flipped bits, a manifest
deleted by hand) is skipped with the reason.

Hosts share no file system, so each host keeps its own folder and a run resumes from the
newest step that is valid on every host (`choose_common`).

Standard library only at import: torch is the trainer's business (`save` takes a writer).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core.fsutil import write_atomic

FORMAT = "labctl-trainer-checkpoint/1"
_NAME = re.compile(r"step-([0-9]{8})\.(pt|json)\Z")
_TEMP = re.compile(r"\.step-[0-9]{8}\.(pt|json)\..*\.tmp\Z")
# The model fields that must match for a checkpoint's weights to fit the model being trained.
MODEL_KEYS = ("vocab", "d_model", "n_layers", "n_heads", "d_ff", "max_seq", "tie_embeddings")
_CHUNK = 1 << 20


def pt_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def manifest_name(step: int) -> str:
    return f"step-{step:08d}.json"


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it.

    torch.save streams its zip archive through write(), so the sha256 costs no second read
    of a checkpoint that may be gigabytes.
    """

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.bytes += view.nbytes
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()


def _torch_save(state: Any, f: Any) -> None:
    import torch

    torch.save(state, f)


def sha256_file(path: str) -> Tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                break
            sha.update(block)
            size += len(block)
    return sha.hexdigest(), size


def config_mismatch(saved: Dict[str, Any], wanted: Dict[str, Any]) -> List[str]:
    """'key: saved vs wanted' for each model field that differs (empty when the weights fit)."""
    out = []
    for key in MODEL_KEYS:
        a, b = saved.get(key), wanted.get(key)
        if key == "tie_embeddings":
            a, b = bool(a), bool(b)
        if a != b:
            out.append(f"{key} {a!r} in the checkpoint vs {b!r} in the settings")
    return out


def choose_common(valid_per_host: Sequence[Sequence[int]]) -> Optional[int]:
    """The newest step valid on every host, or None (no host list, or nothing in common)."""
    if not valid_per_host:
        return None
    common = set(valid_per_host[0])
    for steps in valid_per_host[1:]:
        common &= set(steps)
    return max(common) if common else None


class CheckpointDir:
    """One host's checkpoint folder."""

    def __init__(self, path: str) -> None:
        self.path = path
        # step -> (size, mtime_ns, sha256) of the .pt files this process wrote: pruning after
        # each save need not re-hash the kept checkpoints. Resuming never trusts it.
        self._written: Dict[int, Tuple[int, int, str]] = {}

    def pt_path(self, step: int) -> str:
        return os.path.join(self.path, pt_name(step))

    def manifest_path(self, step: int) -> str:
        return os.path.join(self.path, manifest_name(step))

    def save(
        self,
        step: int,
        state: Any,
        model_config: Dict[str, Any],
        save: Optional[Callable[[Any, Any], None]] = None,
    ) -> Dict[str, Any]:
        """Write step's checkpoint and its manifest; the manifest (with "path") is returned.

        `save(state, file)` serialises the state (torch.save by default).
        """
        save_fn = save if save is not None else _torch_save
        os.makedirs(self.path, exist_ok=True)
        writers: List[_HashingWriter] = []

        def fill_pt(f: IO[bytes]) -> None:
            w = _HashingWriter(f)
            writers.append(w)
            save_fn(state, w)

        write_atomic(self.pt_path(step), fill_pt, durable=True)
        w = writers[0]
        sha = w.sha.hexdigest()
        st = os.stat(self.pt_path(step))
        if st.st_size != w.bytes:
            raise OSError(f"{self.pt_path(step)}: {st.st_size} bytes on disk, {w.bytes} written")
        self._written[step] = (st.st_size, st.st_mtime_ns, sha)
        now = time.time()
        manifest = {
            "format": FORMAT,
            "step": step,
            "file": pt_name(step),
            "sha256": sha,
            "bytes": w.bytes,
            "model": {k: model_config.get(k) for k in MODEL_KEYS},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "unix_time": now,
            "host": socket.gethostname(),
        }
        text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        write_atomic(os.path.join(self.path, manifest_name(step)), text, durable=True)
        out = dict(manifest)
        out["path"] = self.pt_path(step)
        return out

    def manifest(self, step: int) -> Dict[str, Any]:
        with open(self.manifest_path(step)) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("manifest is not a JSON object")
        return data

    def check(self, step: int, trust_own: bool = False) -> Optional[str]:
        """Why step's checkpoint is not valid, or None when it is.

        `trust_own`: a .pt this process wrote, unchanged in size and mtime, is not re-hashed.
        """
        pt = self.pt_path(step)
        try:
            manifest = self.manifest(step)
        except FileNotFoundError:
            return "manifest missing (" + manifest_name(step) + ")"
        except (OSError, ValueError) as exc:
            return f"manifest unreadable: {exc}"
        want_sha, want_bytes = manifest.get("sha256"), manifest.get("bytes")
        if not isinstance(want_sha, str) or not isinstance(want_bytes, int) or manifest.get("step") != step:
            return "manifest incomplete (no sha256, bytes or matching step)"
        try:
            st = os.stat(pt)
        except FileNotFoundError:
            return "checkpoint file missing (" + pt_name(step) + ")"
        if st.st_size != want_bytes:
            return f"truncated or overwritten: {st.st_size} bytes, manifest says {want_bytes}"
        own = self._written.get(step)
        if trust_own and own == (st.st_size, st.st_mtime_ns, want_sha):
            return None
        try:
            sha, _ = sha256_file(pt)
        except OSError as exc:
            return f"unreadable: {exc}"
        if sha != want_sha:
            return f"sha256 mismatch: {sha[:12]}... on disk, manifest says {want_sha[:12]}..."
        return None

    def steps_present(self) -> List[int]:
        """Steps with a .pt or a manifest in the folder, oldest first."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        steps = set()
        for name in names:
            m = _NAME.match(name)
            if m:
                steps.add(int(m.group(1)))
        return sorted(steps)

    def scan(self, trust_own: bool = False) -> Tuple[List[int], List[Dict[str, Any]]]:
        """(valid steps oldest first, [{"step", "path", "reason"}] for each invalid one)."""
        valid: List[int] = []
        skipped: List[Dict[str, Any]] = []
        for step in self.steps_present():
            reason = self.check(step, trust_own=trust_own)
            if reason is None:
                valid.append(step)
            else:
                skipped.append({"step": step, "path": self.pt_path(step), "reason": reason})
        return valid, skipped

    def prune(self, keep: int) -> List[int]:
        """Keep the newest `keep` valid checkpoints; delete every checkpoint older than those.

        Invalid ones newer than the oldest kept stay: a later save of that step replaces
        them, and until then resuming reports them.
        """
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, got {keep}")
        valid, skipped = self.scan(trust_own=True)
        if not valid:
            return []
        oldest_kept = valid[max(0, len(valid) - keep)]
        doomed = [s for s in valid if s < oldest_kept] + [
            e["step"] for e in skipped if e["step"] < oldest_kept
        ]
        for step in sorted(doomed):
            # Manifest first: a .pt without one is invalid, never a valid one half-deleted.
            for path in (self.manifest_path(step), self.pt_path(step)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            self._written.pop(step, None)
        return sorted(doomed)

    def clean_temp(self) -> List[str]:
        """Remove temporary files a crashed writer left behind (only this folder's writer calls it)."""
        removed: List[str] = []
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return removed
        for name in names:
            if _TEMP.match(name):
                try:
                    os.unlink(os.path.join(self.path, name))
                    removed.append(name)
                except FileNotFoundError:
                    pass
        return removed
