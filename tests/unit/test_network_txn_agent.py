"""The host side of a network transaction: the keeper's states, one transaction at a time,
and the config files a revert puts back. The keeper is a real detached process here; only
the live network state is a stand-in (named so in each test), because these tests run in
this machine's own network namespace, which they must never change: the integration tests
(tests/integration/test_network_txn.py) change a simulated host's network for real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.core.errors import AgentError
from labctl.agent.network import live, txn

STATE: dict[str, Any] = {
    "links": {"eth0": {"up": True, "master": None, "kind": None, "addresses": ["10.0.0.2/24"]}},
    "routes": [],
}


@pytest.fixture
def net_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LABCTL_NET_DIR", str(tmp_path / "net"))
    # The stand-in: the forked keeper inherits these, so it never runs `ip` on this machine.
    monkeypatch.setattr(live, "snapshot", lambda: json.loads(json.dumps(STATE)))
    monkeypatch.setattr(
        live, "restore", lambda old, owned=None, rounds=3: {"ran": [], "errors": [], "differences": []}
    )
    # Only the test's own folder is watched, never this machine's /etc/netplan.
    monkeypatch.setattr(txn, "CONFIG_PATHS", (str(tmp_path / "etc-netplan"),))
    (tmp_path / "etc-netplan").mkdir()
    return tmp_path / "net"


def wait_state(txn_id: str, states: tuple[str, ...], within: float = 15.0) -> dict[str, Any]:
    end = time.monotonic() + within
    doc = txn.status_command({"id": txn_id})
    while doc["state"] not in states and time.monotonic() < end:
        time.sleep(0.05)
        doc = txn.status_command({"id": txn_id})
    return doc


def begin(txn_id: str, **kw: Any) -> dict[str, Any]:
    args = {"id": txn_id, "label": "test", "revert_after": 2, "apply_delay": 0, "commands": [["true"]], **kw}
    return txn.begin_command(args)


def test_committed_in_time_the_keeper_leaves_it_with_stand_in_live_state(net_dir: Path) -> None:
    began = begin("t-commit", revert_after=5)
    assert began["keeper_pid"] > 0
    assert wait_state("t-commit", ("applied",))["state"] == "applied"
    assert txn.commit_command({"id": "t-commit"}) == {"committed": True, "state": "committed"}
    time.sleep(5.5)  # past the deadline: a committed transaction is never reverted
    doc = txn.status_command({"id": "t-commit"})
    assert doc["state"] == "committed" and "revert" not in doc
    assert not doc["keeper_running"]
    assert not (net_dir / "current").exists()


def test_unconfirmed_the_keeper_reverts_by_itself_with_stand_in_live_state(net_dir: Path) -> None:
    begin("t-revert")
    doc = wait_state("t-revert", ("reverted", "revert_incomplete"))
    assert doc["state"] == "reverted"
    assert doc["revert"]["reason"] == "not confirmed within 2 s"
    # Too late: a commit after the revert started is refused, and says why.
    assert txn.commit_command({"id": "t-revert"}) == {"committed": False, "state": "reverted"}


def test_a_second_transaction_is_refused_while_one_is_open_with_stand_in_live_state(net_dir: Path) -> None:
    begin("t-first", revert_after=30)
    with pytest.raises(AgentError) as err:
        begin("t-second")
    assert err.value.kind == "busy"
    assert "t-first" in err.value.message and "reverts it by itself" in err.value.message
    assert not (net_dir / "t-second").exists()
    txn.abort_command({"id": "t-first", "reason": "test over"})
    doc = wait_state("t-first", ("reverted",))
    assert doc["revert"]["reason"] == "labctl asked for it: test over"
    begin("t-third")  # the host takes a new one once the first has ended
    wait_state("t-third", ("reverted",))


def test_a_revert_puts_files_back_and_removes_the_ones_the_change_added_with_stand_in_live_state(
    net_dir: Path, tmp_path: Path
) -> None:
    etc = tmp_path / "etc-netplan"
    (etc / "50-base.yaml").write_text("old\n")
    (etc / "50-base.yaml").chmod(0o600)
    added = etc / "90-labctl-bond0.yaml"
    files = {
        str(added): {"text": "new bond\n", "mode": 0o600},
        str(etc / "50-base.yaml"): {"text": "changed\n"},
    }
    begin("t-files", files=files, commands=[["sh", "-c", f"test -f {added}"]])
    doc = wait_state("t-files", ("reverted",))
    assert doc["apply"]["ok"] is True  # the files were there when the commands ran
    assert sorted(doc["revert"]["files"]) == [f"removed {added}", f"restored {etc / '50-base.yaml'}"]
    assert (etc / "50-base.yaml").read_text() == "old\n"
    assert (etc / "50-base.yaml").stat().st_mode & 0o777 == 0o600
    assert not added.exists()


def test_a_change_that_fails_on_the_host_is_reverted_at_once_with_stand_in_live_state(net_dir: Path) -> None:
    start = time.monotonic()
    begin("t-fail", revert_after=60, commands=[["sh", "-c", "echo broken >&2; exit 3"]])
    doc = wait_state("t-fail", ("reverted",))
    assert time.monotonic() - start < 30  # not at the 60 s deadline
    assert doc["apply"]["ok"] is False
    assert doc["apply"]["steps"][0]["rc"] == 3 and "broken" in doc["apply"]["steps"][0]["output"]
    assert doc["revert"]["reason"] == "the change failed on the host"


def test_bad_ids_and_deadlines_are_refused(net_dir: Path) -> None:
    with pytest.raises(AgentError):
        txn.status_command({"id": "../etc"})
    with pytest.raises(AgentError) as err:
        begin("t-bad", revert_after=0)
    assert err.value.kind == "input"
