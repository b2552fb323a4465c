"""`bond`: the inventory's NIC bond as a netplan file, applied so that it cannot lock you out.

The plan renders /etc/netplan/90-labctl-NAME.yaml from the inventory's `bond:` and compares
it, and the kernel's /proc/net/bonding/NAME, with what the host has. Before any change the
preflight refuses what cannot work or would cut labctl off (no bonding driver, a member NIC
missing, the host's address leaving with its NIC, no netplan, netplan's own objections, a
transaction already open). The change itself goes through the network transaction
(labctl/network/txn.py): the host applies it detached and reverts it by itself unless labctl
reconnects over a fresh connection and finds the bond as the inventory says, every member
up, and for 802.3ad one aggregator with a real LACP partner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from labctl.network.bond_preflight import preflight
from labctl.network.bond_render import bond_file, render_bond, switch_reminder
from labctl.network.bond_verify import verify_bond
from labctl.output.progress import Shown
from labctl.provision.resource import (
    Change,
    NotApplicable,
    Params,
    PlanError,
    Probes,
    Resource,
    State,
    probe_error,
    unified_diff,
)

if TYPE_CHECKING:
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Bond, Host
    from labctl.network.txn import FreshRun

# How long the verification waits for the bond to settle (LACP needs a few PDUs at the fast
# rate, a second each) before it calls what it sees a failure; capped by the commit margin.
SETTLE_S = 15.0
NETPLAN_APPLY = [["netplan", "generate"], ["netplan", "apply"]]


class BondParams(Params):
    revert_after: float = Field(
        90,
        ge=10,
        le=3600,
        description="seconds after which the host undoes the change unless labctl confirmed it",
    )


class BondResource(Resource):
    type_name = "bond"
    params_model = BondParams
    description = "the inventory's NIC bond (netplan), applied in a transaction that reverts by itself"

    params: BondParams

    @classmethod
    def from_playbook(cls, host: Host, raw: dict[str, Any]) -> Resource:
        if host.bond is None:
            raise NotApplicable("no bond in the inventory for this host")
        return cls(host, BondParams.model_validate(raw))

    @property
    def bond(self) -> Bond:
        assert self.host.bond is not None
        return self.host.bond

    def label(self) -> str:
        return f"bond {self.bond.name}"

    def _seen(self, host: str) -> Callable[..., None]:
        """The transaction's "seen" events, each a dim line naming the host and the bond."""

        def show(console: Any, what: str) -> None:
            console.print(f"[dim]{host}: {self.label()}: {what}[/]")

        return show

    def text(self) -> str:
        return render_bond(self.bond, self.host.name)

    def probes(self) -> Probes:
        b = self.bond
        return {
            "bond": {
                "kind": "bond",
                "name": b.name,
                "path": bond_file(b),
                "text": self.text(),
                "members": list(b.interfaces),
            },
            "txn": {"kind": "net_txn"},
        }

    def plan(self, state: State) -> Change:
        for key in ("bond", "txn"):
            err = probe_error(state, key)
            if err:
                raise PlanError(f"{self.host.name}: could not read the host's network ({key}): {err}.")
        probe = state["bond"]
        path, text = bond_file(self.bond), self.text()
        current = (probe.get("file") or {}).get("text")
        live_problems = verify_bond(probe.get("bond"), self.bond)
        change = Change()
        if current == text and not live_problems:
            return change
        problems = preflight(self.host, self.bond, probe, None)
        open_txn = (state["txn"] or {}).get("open")
        if open_txn:
            problems.append(
                f"another network transaction is open on {self.host.name} ({open_txn.get('label')}, "
                f"state {open_txn.get('state')}): wait for it to end; it reverts by itself at its deadline."
            )
        if problems:
            raise PlanError(
                f"{self.host.name}: {self.label()} not applied: " + " ".join(problems),
                "Nothing on the host was changed. Fix what is named, then run provision again.",
            )
        what = "write" if current is None else "rewrite"
        summary = f"{what} {path} and apply it ({self.bond.mode} over {', '.join(self.bond.interfaces)})"
        if current == text:
            summary = f"re-apply {path}: the kernel's {self.bond.name} is not as the file says"
        reminder = switch_reminder(self.bond, self.host.name)
        change.add(
            summary
            + f"; reverts by itself after {self.params.revert_after:g} s unless confirmed"
            + (f". Note: {reminder}" if reminder else ""),
            {
                "op": "net_transaction",
                "label": self.label(),
                "files": {path: text},
                "commands": self.commands(probe.get("bond") is not None),
                "reapply": NETPLAN_APPLY,
            },
            diff=unified_diff(path, current, text),
        )
        return change

    def commands(self, bond_exists: bool) -> list[list[str]]:
        """netplan generate + apply; networkd does not change a bond that exists (mode, hash
        policy), so one the kernel has is deleted first and made again from the file. A
        revert's `netplan apply` of the old files makes the old one again."""
        if not bond_exists:
            return NETPLAN_APPLY
        return [NETPLAN_APPLY[0], ["ip", "link", "del", "dev", self.bond.name], *NETPLAN_APPLY[1:]]

    def verify(self, fresh: FreshRun, budget: float) -> list[str]:
        """Over the new connection: the kernel's bond as the inventory says, given a few
        seconds to settle."""
        from labctl.hosts.agent_ship import call_agent

        end = time.monotonic() + min(SETTLE_S, max(1.0, budget - 1.0))
        while True:
            answer = call_agent(
                fresh, "provision.probe", {"probes": {"b": self.probes()["bond"]}}, timeout=max(2.0, budget)
            )
            problems = verify_bond((answer.get("results", {}).get("b") or {}).get("bond"), self.bond)
            if not problems or time.monotonic() >= end:
                return problems
            time.sleep(1.0)

    def apply(self, run: HostRun, change: Change) -> None:
        from labctl.network.txn import NetChange, keep_connection, transact

        op = change.ops[0]
        report = transact(
            run,
            NetChange(label=op["label"], files=op["files"], commands=op["commands"], reapply=op["reapply"]),
            revert_after=self.params.revert_after,
            verify=self.verify,
            progress=Shown(run.ctx.console, {"seen": self._seen(run.host.name)}),
        )
        if not report.ok:
            raise PlanError(
                report.message(),
                report.hint("run provision again")
                or "The host is back on its old network config. Fix what is named, then run provision again.",
            )
        keep_connection(run, report)
