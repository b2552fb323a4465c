"""`--backend ssh` (the default): torchrun on the lab's hosts now, attached or `--detach`ed.

The host side is train/launch.py's; this module decides what happens around it: the run
record, stopping every host when a detached start fails, and the attached run's summary.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from labctl.train.backends import BaseBackend, RunsOn
from labctl.train.results import Attached, Detached

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.output.progress import Progress
    from labctl.train.backends import PlannedRun


class SshBackend(BaseBackend):
    """Reads no request option: the spec (its time limit in the trainer's settings and each
    host's environment already) is the whole run."""

    name = "ssh"
    runs_on = RunsOn.LAB

    def submit(self, ctx: Context, run: PlannedRun, progress: Progress) -> Attached | Detached:
        # launch pulls in pydantic and yaml; `labctl --help` reads every backend's options.
        from labctl.train import launch, runs

        spec, hosts = run.spec, run.hosts
        if run.script is not None:
            launch.ship_script(ctx, spec, hosts, run.script)
        runs.save(
            run.runs_root,
            {
                "run_id": spec.run_id,
                "phase": spec.phase,
                "inventory": str(ctx.inventory_path),
                "hosts": [n.host for n in spec.nodes],
                "log_dir": spec.log_dir,
                "grace": run.settings.stop_grace,
                "detached": run.request.detach,
                "started": time.time(),
                "state": "running",
                "world_size": spec.world_size,
                "device": spec.nodes[0].device,
                "commands": {n.host: spec.shell_line(n) for n in spec.nodes},
                "checkpoint_dir": spec.settings.get("checkpoint_dir"),  # where `labctl ckpt backup` looks
            },
        )
        if run.request.detach:
            return self.detached(ctx, run)
        return self.attached(ctx, run, progress)

    def detached(self, ctx: Context, run: PlannedRun) -> Detached:
        from labctl.train import launch, runs

        result = Detached(run.spec.run_id, launch.run_detached(ctx, run.spec, run.hosts))
        if not result.ok:
            # Hosts that did start must not train on without the others.
            launch.stop_everywhere(ctx, run.spec.run_id, run.hosts, run.settings.stop_grace, run.spec.log_dir)
        runs.update(run.runs_root, run.spec.run_id, state="running" if result.ok else "failed")
        return result

    def attached(self, ctx: Context, run: PlannedRun, progress: Progress) -> Attached:
        from labctl.train import launch, runs

        spec = run.spec
        folder = run.runs_root / spec.run_id
        progress.event("started", spec=spec, log_dir=folder)
        stream = launch.Stream(folder, run.request.ranks, progress)
        stream.open([n.host for n in spec.nodes])
        try:
            outcome = launch.run_attached(ctx, spec, run.hosts, stream, run.settings.stop_grace)
        finally:
            stream.close()
        result = Attached.from_outcome(spec, outcome, folder)
        runs.update(
            run.runs_root,
            spec.run_id,
            state=result.state,
            ended=time.time(),
            remaining=result.remaining,
            resume_step=result.resume_step,
            reason=result.fatal,
        )
        return result
