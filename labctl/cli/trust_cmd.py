"""`labctl trust HOST…`: fetch a host's SSH key, show its fingerprint, pin it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from labctl.cli.common import InventoryOpt, JsonOpt, VerboseOpt
from labctl.cli.runner import Outcome, run_command

if TYPE_CHECKING:
    from labctl.hosts.context import Context


def trust(
    ctx: typer.Context,
    hosts: Annotated[Optional[list[str]], typer.Argument(help="Host names (default: every host).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Pin without asking.")] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Allow replacing a key that is already pinned and differs.")
    ] = False,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = 0,
) -> None:
    """Pin hosts' SSH keys in the inventory's known_hosts, after showing their fingerprints.

    Compare each fingerprint with the one the host's console prints
    (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) before you accept it. A key
    that differs from the pinned one is only replaced with `--replace`.

    Examples:

        labctl trust m5 irina

        labctl trust --yes            # every host, no questions (a freshly built lab)
    """
    from labctl.hosts.fanout import HostResult, HostRun, fan_out
    from labctl.hosts.recap import print_recap
    from labctl.inventory.select import select_hosts
    from labctl.output.errors import InputError
    from labctl.transport.hostkeys import fetch_host_key, fingerprint, pin_host_key, pinned_keys
    from labctl.transport.localfiles import check_local_files

    def work(c: Context) -> Outcome:
        chosen = select_hosts(c.inventory, ",".join(hosts) if hosts else None, label="labctl trust")
        chosen = [h for h in chosen if h.connection == "ssh"]
        for h in chosen:
            if h.known_hosts is None:
                raise InputError(
                    f"Host {h.name} has no known_hosts file set.",
                    "Add known_hosts: keys/known_hosts to the inventory's defaults.",
                )
        if not yes and not c.console.is_interactive and not c.json_mode:
            raise InputError(
                "labctl trust needs a yes for each key, and there is no terminal to ask on.", "Add --yes."
            )

        def fetch(run: HostRun) -> HostResult:
            h = run.host
            key = fetch_host_key(h.address, h.port, timeout=h.connect_timeout)
            pinned = pinned_keys(h.known_hosts, h.address, h.port)
            same = any(k.asbytes() == key.asbytes() for k in pinned.values())
            r = HostResult(h.name, "ok")
            r.extra = {
                "fingerprint": fingerprint(key),
                "key_type": key.get_name(),
                "pinned": [fingerprint(k) for k in pinned.values()],
                "already_pinned": same,
                "_key": key,
            }
            return r

        check_local_files(
            chosen, writing_known_hosts=True
        )  # before a key is fetched that could not be pinned
        results = fan_out(c, chosen, fetch, label="fetching host keys")
        for r in results:
            if not r.ok:
                continue
            h = c.inventory.host(r.host)
            key = r.extra.pop("_key")
            fp = r.extra["fingerprint"]
            if r.extra["already_pinned"]:
                r.error = f"already pinned ({fp})"
                continue
            if r.extra["pinned"]:
                old = ", ".join(r.extra["pinned"])
                if not replace:
                    r.status, r.error = "hostkey", f"offers {fp} but {old} is pinned"
                    r.hint = f"If {h.name} was rebuilt, run `labctl trust {h.name} --replace`."
                    continue
                c.console.print(f"[bold red]{h.name}'s key changed:[/] pinned {old}, now offers {fp}")
            if not yes:
                ok = typer.confirm(
                    f"{h.name} ({h.address}:{h.port}) offers {r.extra['key_type']} key {fp}. Pin it?",
                    err=True,
                )
                if not ok:
                    r.status, r.error = "skipped", "not pinned (declined)"
                    continue
            assert h.known_hosts is not None
            pin_host_key(h.known_hosts, h.address, h.port, key)
            r.status, r.error = "changed", f"pinned {fp} in {h.known_hosts}"
        for r in results:
            r.extra.pop("_key", None)
        return Outcome(
            {"results": [r.to_json() for r in results]},
            lambda: print_recap(c.console, results, title="trust"),
            0 if all(r.ok for r in results) else 1,
        )

    run_command(ctx, work, inventory, json_out, verbose)
