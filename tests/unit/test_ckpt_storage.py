"""Which host keeps the checkpoint library, and where a recorded run's checkpoints are."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from labctl.ckpt.library import checkpoint_dir, find_storage
from labctl.inventory.model import Host, Inventory, Storage
from labctl.output.errors import InputError

IRINA = Host(name="irina", address="10.0.0.2", storage=Storage(models="/srv/models/"))
M5 = Host(name="m5", address="10.0.0.1")


def inventory(*hosts: Host) -> Inventory:
    return Inventory(lab="t", path=Path("/tmp/inv.yaml"), hosts={h.name: h for h in hosts})


def test_the_library_is_on_the_one_storage_host_beside_its_models_unless_named() -> None:
    lib = find_storage(inventory(M5, IRINA), None)
    assert (lib.host.name, lib.path) == ("irina", "/srv/checkpoints")
    own = IRINA.model_copy(update={"storage": Storage(models="/srv/models", checkpoints="/tank/ckpt")})
    assert find_storage(inventory(M5, own), "irina").path == "/tank/ckpt"
    assert lib.key("p1-x", 120) == "p1-x/step-00000120"


@pytest.mark.parametrize(
    ("hosts", "name", "says"),
    [
        ((M5,), None, "No host in /tmp/inv.yaml has a 'storage' section"),
        ((M5, IRINA, IRINA.model_copy(update={"name": "tank"})), None, "--storage irina"),
        ((M5, IRINA), "m5", "Host 'm5' has no 'storage' section"),
        ((M5, IRINA), "nope", "No host 'nope'"),
    ],
)
def test_no_ambiguous_or_missing_storage_host_is_guessed(
    hosts: tuple[Host, ...], name: str | None, says: str
) -> None:
    with pytest.raises(InputError) as e:
        find_storage(inventory(*hosts), name)
    assert says in f"{e.value.message} {e.value.hint}"


def test_a_run_recorded_before_checkpoint_dir_was_kept_is_read_from_its_command_line() -> None:
    assert checkpoint_dir({"checkpoint_dir": "/data/ckpt/phase1"}) == "/data/ckpt/phase1"
    settings = json.dumps({"checkpoint_dir": "/data/ckpt/old", "steps": 5})
    line = f"env A=1 python -m torch.distributed.run -m labctl.agent.train.trainer --settings {shlex.quote(settings)}"
    assert checkpoint_dir({"commands": {"m5": line}}) == "/data/ckpt/old"
    assert checkpoint_dir({"commands": {"m5": "torchrun train.py"}}) is None


def _record(run_id: str, started: float, hosts: list[str], folder: str) -> dict[str, object]:
    return {"run_id": run_id, "started": started, "hosts": hosts, "checkpoint_dir": folder}


def test_a_run_whose_folder_a_newer_run_took_over_on_every_host_is_superseded() -> None:
    """A resumed or re-run phase writes into the folder an older run left: its checkpoints are the
    newest run's, and filing them under each older run id copied one checkpoint many times."""
    from labctl.ckpt.library import superseded

    records = [
        _record("p1-old", 100, ["m5", "irina"], "/var/lib/labctl/train/p1"),
        _record("p1-resumed", 200, ["m5", "irina"], "/var/lib/labctl/train/p1"),
        _record("p1-newest", 300, ["m5", "irina"], "/var/lib/labctl/train/p1"),
        # Only m5 reused: irina still holds p1-partly's own checkpoints.
        _record("p1-partly", 150, ["m5", "workstation"], "/var/lib/labctl/train/p1"),
        _record("p2", 50, ["m5"], "/var/lib/labctl/train/p2"),
    ]
    assert superseded(records) == {"p1-old": "p1-newest", "p1-resumed": "p1-newest"}
    assert superseded([]) == {}
