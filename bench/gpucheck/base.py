"""What every section of the GPU check shares: the run's environment and a section's result.

A section is a module in this package with `TITLE`, `PLAN` (the lines a dry run prints) and
`run(env) -> Section`. It measures through labctl's own code paths (the agent's loader and
trainer, the orchestra's server, the CLI's `--json`) and compares each figure with its peer
or ceiling measured in the same run. A section that fails is recorded with its error and the
next one still runs: one GPU session must give every figure it can.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LAB = "gpucheck"  # the one-host lab's name: its orchestra servers are tagged with it


@dataclass
class Goal:
    """A figure against the target the issue set for it (`value >= target` is met)."""

    name: str
    value: float | None
    target: float
    unit: str = "x"
    why: str = ""  # what the target is: "pinned host-to-device ceiling", "safetensors to CUDA"

    @property
    def met(self) -> bool:
        return self.value is not None and self.value >= self.target

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "target": self.target,
            "unit": self.unit,
            "why": self.why,
            "met": self.met,
        }


@dataclass
class Section:
    """One section's outcome: figures for the JSON, rows for the markdown table."""

    key: str
    title: str
    figures: dict[str, Any] = field(default_factory=dict)
    # (what was measured, the figure, what it is compared with / the peer's figure)
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"what", "why"}
    error: str | None = None
    seconds: float = 0.0

    def row(self, what: str, figure: str, against: str = "") -> None:
        self.rows.append((what, figure, against))

    def skip(self, what: str, why: str) -> None:
        self.skipped.append({"what": what, "why": why})

    def goal(self, name: str, value: float | None, target: float, unit: str = "x", why: str = "") -> Goal:
        g = Goal(name, value, target, unit, why)
        self.goals.append(g)
        return g

    @property
    def ok(self) -> bool:
        return self.error is None and all(g.met for g in self.goals)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "figures": self.figures,
            "rows": [list(r) for r in self.rows],
            "goals": [g.to_json() for g in self.goals],
            "skipped": self.skipped,
            "error": self.error,
        }


class CheckFailed(RuntimeError):
    """A step of a section failed; the message says which and carries the command's output."""


@dataclass
class CheckEnv:
    """Where a run happens: the scratch folder, the device, the one-host local lab."""

    out: Path  # the JSON document and markdown table go here
    work: Path  # scratch: the 4 GB checkpoint, models, checkpoints, inventories
    device: str  # "cuda" on a GPU; "cpu" for the smoke run that tries the code paths here
    smoke: bool  # small sizes on the CPU: the same code paths, none of the figures count
    python: str = sys.executable
    host: str = "here"
    inventory: Path | None = None  # written by gpu_check.write_inventory
    gpu: dict[str, Any] = field(default_factory=dict)  # name, memory_gb, cc: from torch
    log_file: Path | None = None

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.log_file is not None:
            with self.log_file.open("a") as f:
                f.write(line + "\n")

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment for a child: labctl importable from this checkout, output unbuffered."""
        env = dict(os.environ)
        paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("LABCTL_INVENTORY", str(self.inventory or ""))
        if extra:
            env.update(extra)
        return env

    def run(
        self, cmd: list[str], timeout: float, check: bool = True, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command from the checkout; its output goes to the run's log, a failure raises CheckFailed."""
        self.log("$ " + " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout, env=self.environ(extra_env)
            )
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            self._keep(cmd, out, err)
            raise CheckFailed(f"{' '.join(cmd[:6])} ran past {timeout:.0f} s\n{tail(err or out)}") from None
        self._keep(cmd, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise CheckFailed(
                f"{' '.join(cmd[:8])} exited {proc.returncode}\n{tail(proc.stderr or proc.stdout)}"
            )
        return proc

    def _keep(self, cmd: list[str], out: str, err: str) -> None:
        if self.log_file is not None:
            with self.log_file.open("a") as f:
                f.write(f"--- {' '.join(cmd)}\n{tail(out, 4000)}\n--- stderr\n{tail(err, 4000)}\n")

    def labctl(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> tuple[int, Any, subprocess.CompletedProcess[str]]:
        """`labctl -i INVENTORY --json ARGS`: (exit code, the JSON document or None, the process)."""
        assert self.inventory is not None, "write_inventory first"
        cmd = [self.python, "-m", "labctl", "-i", str(self.inventory), "--json", *args]
        proc = self.run(cmd, timeout=timeout, check=check)
        try:
            doc = json.loads(proc.stdout) if proc.stdout.strip() else None
        except json.JSONDecodeError:
            doc = None
        return proc.returncode, doc, proc


def tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def median_seconds(fn: Callable[[], Any], reps: int, warmup: int = 1) -> tuple[float, list[float]]:
    """(median, all times) of `fn` over `reps` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def fmt(v: float | None, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}{(' ' + unit) if unit else ''}"


def write_inventory(env: CheckEnv, cache_gb: float = 16.0) -> Path:
    """A one-host lab on this machine (`connection: local`, no SSH): every role the check uses.

    The GPU is declared as torch found it, so `doctor` compares the card with itself and any
    failure it reports is a real one. Model library and RAM cache are folders in the scratch
    space (the check mounts nothing).
    """
    import yaml

    host: dict[str, Any] = {
        "address": "127.0.0.1",
        "connection": "local",
        "python": env.python,
        "roles": ["train", "inference", "cache", "storage", "orchestrator"],
        "model_cache": {"path": str(env.work / "cache"), "size_gb": cache_gb, "source": env.host},
        "storage": {"models": str(env.work / "models")},
    }
    if env.gpu:
        gpu: dict[str, Any] = {"model": env.gpu["name"], "memory_gb": env.gpu["memory_gb"], "count": 1}
        if env.gpu.get("cc"):
            gpu["compute_capability"] = env.gpu["cc"]
        host["gpus"] = [gpu]
    for d in ("cache", "models"):
        (env.work / d).mkdir(parents=True, exist_ok=True)
    path = env.work / "lab.yaml"
    path.write_text(yaml.safe_dump({"lab": LAB, "hosts": {env.host: host}}, sort_keys=False))
    env.inventory = path
    return path


class Nvml:
    """GPU 0 through NVML (the card labctl trains on: the first in PCI order), or why not."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.name: str | None = None
        self.count = 0
        self.why: str | None = None
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as exc:
            self.why = f"pynvml (nvidia-ml-py) is not importable: {exc}"
            return
        self.pynvml = pynvml
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            self.why = f"NVML init failed: {type(exc).__name__}: {exc}"
            return
        try:
            self.count = int(pynvml.nvmlDeviceGetCount())
            if self.count < 1:
                self.why = "NVML sees no GPU"
                return
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(self.handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:
            self.why = f"NVML could not open GPU 0: {type(exc).__name__}: {exc}"

    @property
    def ok(self) -> bool:
        return self.handle is not None

    def query(self) -> dict[str, Any]:
        nv, h = self.pynvml, self.handle
        out: dict[str, Any] = {
            "util_pct": int(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_mib": round(int(nv.nvmlDeviceGetMemoryInfo(h).used) / 2**20, 1),
        }
        try:
            out["power_w"] = round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)  # milliwatts
        except Exception:  # not supported on this card or driver: utilisation and memory still count
            out["power_w"] = None
        return out

    def close(self) -> None:
        if hasattr(self, "pynvml"):
            try:
                self.pynvml.nvmlShutdown()
            except Exception:
                pass
