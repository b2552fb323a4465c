"""The controller's record of training runs: `<inventory dir>/.labctl/runs/<run-id>/`.

    run.json        phase, hosts, each host's log folder, how it was started, its state
    <host>.log      every line the host's torchrun printed (attached runs), all ranks
    metrics.jsonl   rank 0's events (step, loss, tokens/s, checkpoints)
    samples.jsonl   phase 3's sample per step: a model's program and how the sandbox ran it

`labctl train status` and `stop` start from these records; the hosts hold the truth about
which processes still run.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from labctl.documents.validation import path_component
from labctl.output.errors import InputError
from labctl.output.files import write_output


def runs_dir(inventory_path: Path) -> Path:
    # absolute(), not resolve(): the seed inventory is a symlink into the package, runs belong beside the link.
    return Path(inventory_path).absolute().parent / ".labctl" / "runs"


def new_run_id(phase: int) -> str:
    # Lower-case letters, digits and dashes: valid as a Slurm job name and a Kubernetes name.
    return f"p{phase}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def save(root: Path, record: dict[str, Any]) -> Path:
    folder = root / record["run_id"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.json"
    write_output(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return path


def update(root: Path, run_id: str, **changes: Any) -> dict[str, Any]:
    record = load(root, run_id)
    record.update(changes)
    save(root, record)
    return record


def load(root: Path, run_id: str) -> dict[str, Any]:
    path_component(run_id, "The run id", "p1-20250101-120000-ab12 (`labctl train status` lists the runs)")
    path = root / run_id / "run.json"
    if not path.exists():
        known = [r["run_id"] for r in list_runs(root)][:5]
        raise InputError(
            f"No run '{run_id}' recorded in {root}.",
            f"Recent runs: {', '.join(known)}." if known else "`labctl train status` lists the runs.",
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Recorded runs, newest first."""
    out = []
    for path in root.glob("*/run.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.get("started", 0), reverse=True)


def samples(root: Path, run_id: str, last: int) -> list[dict[str, Any]]:
    """The newest `last` of phase 3's samples that rank 0 streamed here for run `run_id`."""
    from labctl.agent.train.events import SAMPLES_FILE

    record = load(root, run_id)
    path = root / run_id / SAMPLES_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    out = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut by a run that was killed mid-write
        if isinstance(item, dict):
            out.append(item)
    if not out:
        host = (record.get("hosts") or ["HOST"])[0]
        where = f"{record.get('log_dir') or 'RUN_FOLDER'}/{SAMPLES_FILE}"
        raise InputError(
            f"Run {run_id} has no samples in {path}: only phase 3 keeps them, one per step, and only "
            "an attached run streams them here.",
            f"A detached run's are on its first host: labctl exec -l {host} -- tail -n {last} {where}",
        )
    return out[-last:]
