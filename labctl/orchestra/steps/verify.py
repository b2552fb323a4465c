"""After the plan: every host read afresh and compared with the plan's warm set."""

from __future__ import annotations

from labctl.orchestra.hoststate import leftovers, read_views
from labctl.orchestra.steps.state import Rotation
from labctl.output.errors import HostError


def verify(rot: Rotation) -> None:
    """Plan again: read every host's state afresh and compare it with the plan's warm set;
    exit 1 naming whatever differs, and the hosts removed from the inventory that still ran
    servers at the last commit."""
    hosts = [*rot.hosts.values(), *rot.retired.values()]
    views = read_views(rot.ctx, hosts, rot.orch.server.health, gpus=False)
    after = rot.plan.after.assignment()
    left = leftovers(views, after)
    stranded = [lb for lb in rot.result.left_behind if lb["command"]]
    if not left and not stranded:
        return
    what = "rotate" if rot.opts.kind == "rotate" else f"orchestra {rot.opts.kind}"
    lines = [x.text for x in left] + [lb["note"] for lb in stranded]
    pids: dict[str, list[int]] = {}
    for x in left:
        if x.pid is not None:
            pids.setdefault(x.host, []).append(x.pid)
    kills = [
        f"`labctl exec -l {h} -- kill -TERM {' '.join(f'-{p}' for p in sorted(ps))}`"
        for h, ps in sorted(pids.items())
    ]
    if kills:
        hint = (
            f"Stop what is left by hand ({', '.join(kills)}: each server is a process group; "
            "-KILL for one that ignores TERM), then check with `labctl orchestra status`. A server that "
            "outlives SIGKILL is stuck in the kernel (a GPU driver): check the host."
        )
    elif left:
        hint = f"Run `labctl {what}` again: it repairs warm.json from what answers (`labctl orchestra status` shows it)."
    else:
        hint = "Stop the servers named above on their hosts (labctl no longer tracks them), or put the host back in the inventory."
    raise HostError(
        f"`labctl {what}` carried out its plan, but the hosts do not run what it planned: "
        + "; ".join(lines)
        + ".",
        hint,
    )
