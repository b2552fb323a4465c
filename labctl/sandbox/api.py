"""Run untrusted programs in the sandbox host's warm pool: `labctl.sandbox.run` / `run_many`.

The controller decides every limit (limits.py) and each language's commands (languages.py)
and sends them with the programs; the host's agent (`sandbox.run`) only carries them out. A
batch travels to each sandbox host in one agent call over SSH, so a training loop that submits
hundreds of programs costs one session per host, not one per program.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from labctl.output.errors import HostError, InputError, LabctlError
from labctl.sandbox.limits import Limits, container_config

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host

ROLE = "sandbox"
PLAYBOOK = Path("playbooks/sandbox.yaml")  # the shipped playbook whose `sandbox` resource builds images
DEFAULT_POOL = 4
DEFAULT_CONCURRENCY = 8  # programs at once per host: the pool's containers share its cores
AGENT_SLACK_S = 60.0  # the agent call's own limit on top of the programs' time limits


def lang_spec(lang: str, limits: Limits) -> dict[str, Any]:
    """What the agent needs to run `lang`: its container config and its commands."""
    from labctl.agent.sandbox import languages

    try:
        r = languages.recipe(lang)
    except KeyError:
        known = ", ".join(sorted(languages.RECIPES))
        raise InputError(f"no sandbox language '{lang}'.", f"Pick one of: {known}.") from None
    return {
        "config": container_config(r.image, lang, limits, compiled=r.compile is not None),
        "file": r.file,
        "compile": list(r.compile) if r.compile else None,
        "run": list(r.run),
        "env": dict(r.env),
    }


def sandbox_hosts(ctx: Context, host: str | None) -> list[Host]:
    """--host's hosts, or else every host with the role `sandbox`."""
    from labctl.inventory.select import select_hosts

    inv = ctx.inventory
    if host:
        return select_hosts(inv, host, label="--host")
    chosen = [h for h in inv.hosts.values() if h.has_role(ROLE)]
    if not chosen:
        raise InputError(
            f"no host in {inv.path} has the role '{ROLE}'.",
            "Add `roles: [sandbox]` to the host that runs sandboxes, or name one with --host.",
        )
    return chosen


def declared(host: Host) -> list[str]:
    """The sandbox languages the inventory gives `host`: the ones provision builds images for."""
    return list(host.sandbox.languages) if host.sandbox is not None else []


def build_hint(ctx: Context, host: Host, langs: Sequence[str]) -> str:
    """The command that builds `langs`' images on `host` (and installs and starts Docker), read
    off the sandbox playbook so that it really does; or what to change when none would."""
    from labctl.provision.hint import provision_fix

    def builds(params: dict[str, Any]) -> bool:  # a play's `languages:` overrides the inventory's
        return params.get("languages") is None or set(langs) <= set(params["languages"])

    return provision_fix(ctx.inventory, host.name, "sandbox", PLAYBOOK, wants=builds)


def ready_hosts(ctx: Context, hosts: Sequence[Host], langs: Sequence[str]) -> list[Host]:
    """The hosts that declare every language of `langs`: a language the inventory does not give
    a host has no image there, and provision builds none until it does."""
    ready = [h for h in hosts if set(langs) <= set(declared(h))]
    if ready:
        return ready
    h = hosts[0]
    missing = [lang for lang in langs if lang not in declared(h)]
    names, one = ", ".join(missing), len(missing) == 1
    inv = ctx.inventory_path
    if h.sandbox is None:
        what = f"{h.name} has no sandbox languages in {inv}"
        change = f"Add `sandbox: {{languages: [{names}]}}` to hosts.{h.name} there"
    else:
        what = (
            f"{names} {'is' if one else 'are'} not among {h.name}'s sandbox languages "
            f"({', '.join(declared(h))}) in {inv}"
        )
        change = f"Add {names} to hosts.{h.name}.sandbox.languages there"
    raise InputError(
        f"{what}, so no image for {'it' if one else 'them'} is built there.",
        f"{change}, then build {'its image' if one else 'their images'}: {build_hint(ctx, h, missing)}.",
    )


def host_failure(ctx: Context, host: Host, langs: Sequence[str], e: LabctlError) -> LabctlError:
    """`e` from `host`'s agent with the fix where labctl knows it: a missing image or Docker is
    what the sandbox playbook's resource puts there."""
    from labctl.agent.sandbox import image_name
    from labctl.hosts.agent_ship import AgentFailed

    kind = e.kind if isinstance(e, AgentFailed) else ""
    if kind == "no_image":
        missing = [lang for lang in langs if image_name(lang) in e.message] or list(langs)
        images = ", ".join(image_name(lang) for lang in missing)
        return HostError(
            f"{host.name}: the sandbox image {images} is not built there.",
            f"Build {'it' if len(missing) == 1 else 'them'}: {build_hint(ctx, host, missing)}.",
        )
    if kind == "no_docker":
        return HostError(
            e.message,
            f"Install and start Docker with the sandbox resource: {build_hint(ctx, host, langs)}.",
        )
    return e


def _bytes(value: object, what: str, example: str) -> bytes | None:
    """A program's source or stdin as bytes: bytes as given, text as UTF-8 (text read with
    surrogateescape gets its original bytes back, whatever their encoding)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    raise InputError(f"a sandbox program's {what} must be text or bytes.", f"Pass {example}.")


def check_program(p: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """The program as the agent takes it: its source and stdin as base64 of their bytes, so a
    Latin-1 file or a binary input arrives in the container exactly as it was given."""
    source = _bytes(p.get("source"), "source", "source='print(1)' or the file's bytes")
    if source is None:
        raise InputError("a sandbox program needs its source.", "Pass source='print(1)' or the file's bytes.")
    timeout = p.get("timeout") or limits.timeout_s
    memory = p.get("memory_mb") or limits.memory_mb
    try:
        in_range = 0 < float(timeout) <= 3600
    except (TypeError, ValueError):
        in_range = False
    if not in_range:
        raise InputError(f"timeout {timeout} s is out of range.", "Give 0 < timeout <= 3600 seconds.")
    try:
        in_range = 6 <= int(memory) <= 65536
    except (TypeError, ValueError, OverflowError):
        in_range = False
    if not in_range:
        raise InputError(f"memory {memory} MB is out of range.", "Give 6 to 65536 MB.")
    stdin = _bytes(p.get("stdin"), "stdin", "stdin='...' or bytes, or leave it out")
    if not isinstance(p.get("lang"), str):
        raise InputError(
            "a sandbox program needs its language.", "Pass lang='python' (or another recipe's name)."
        )
    return {
        "lang": p["lang"],
        "source_b64": base64.b64encode(source).decode("ascii"),
        "stdin_b64": None if stdin is None else base64.b64encode(stdin).decode("ascii"),
        "timeout": float(timeout),
        "memory_mb": int(memory),
    }


def run_many(
    programs: Sequence[dict[str, Any]],
    *,
    limits: Limits | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    host: str | None = None,
    inventory: Path | str | None = None,
    ctx: Context | None = None,
) -> list[dict[str, Any]]:
    """Run every program (dicts: lang, source, stdin, timeout, memory_mb; source and stdin text
    or bytes) and return one result per program, in order: lang, exit_code, stdout, stderr,
    truncated, timed_out, oom_killed, wall_ms. stdout and stderr are text (bytes that are not
    UTF-8 replaced by U+FFFD); where they were not UTF-8, stdout_b64 and stderr_b64 hold the
    exact bytes, base64-encoded. Programs are dealt round-robin over the sandbox hosts, one agent call per host,
    `concurrency` at a time on each. A host that fails raises HostError naming it."""
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostResult, HostRun, fan_out

    limits = limits or Limits()
    own = ctx is None
    ctx = ctx or Context.create(inventory_path=Path(inventory) if inventory else None, json_mode=True)
    try:
        checked = [check_program(dict(p), limits) for p in programs]
        if not checked:
            return []
        specs = {lang: lang_spec(lang, limits) for lang in sorted({p["lang"] for p in checked})}
        langs = sorted(specs)
        hosts = ready_hosts(ctx, sandbox_hosts(ctx, host), langs)[: len(checked)]
        shares: dict[str, list[int]] = {h.name: [] for h in hosts}
        for i in range(len(checked)):
            shares[hosts[i % len(hosts)].name].append(i)

        def step(run: HostRun) -> HostResult:
            mine = shares[run.host.name]
            waves = math.ceil(len(mine) / max(1, concurrency))
            worst = max(checked[i]["timeout"] for i in mine)
            args = {
                "programs": [checked[i] for i in mine],
                "lab": ctx.inventory.lab,  # the pool's containers are this lab's alone
                "langs": specs,
                "limits": limits.as_dict(),
                "concurrency": concurrency,
                "pool": run.host.sandbox.pool if run.host.sandbox else DEFAULT_POOL,
            }
            try:
                # every wave may compile and run up to its time limit
                answer = call_agent(run, "sandbox.run", args, timeout=waves * worst * 2 + AGENT_SLACK_S)
            except LabctlError as e:
                raise host_failure(ctx, run.host, langs, e) from None
            return HostResult(run.host.name, "ok", data=answer["results"])

        out: list[dict[str, Any] | None] = [None] * len(checked)
        for r in fan_out(ctx, hosts, step, label="sandbox", progress=False):
            if not r.ok:
                raise HostError(
                    str(r.error) if str(r.error).startswith(f"{r.host}:") else f"{r.host}: {r.error}",
                    r.hint or "Check the sandbox host with `labctl facts`.",
                )
            for i, res in zip(shares[r.host], r.data, strict=True):
                out[i] = res
        return [r for r in out if r is not None]
    finally:
        if own:
            ctx.close()


def run(
    source: str | bytes,
    lang: str,
    *,
    stdin: str | bytes | None = None,
    timeout: float | None = None,
    memory_mb: int | None = None,
    host: str | None = None,
    inventory: Path | str | None = None,
    ctx: Optional[Context] = None,
) -> dict[str, Any]:
    """One program; see run_many."""
    prog = {"lang": lang, "source": source, "stdin": stdin, "timeout": timeout, "memory_mb": memory_mb}
    return run_many([prog], concurrency=1, host=host, inventory=inventory, ctx=ctx)[0]
