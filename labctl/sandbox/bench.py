"""`labctl sandbox bench`: the warm pool against `docker run --rm`, measured on the host."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from labctl.output.errors import HostError, InputError
from labctl.sandbox.api import host_failure, lang_spec, ready_hosts, sandbox_hosts
from labctl.sandbox.limits import Limits, docker_run_argv

if TYPE_CHECKING:
    from labctl.hosts.context import Context

BENCH_TIMEOUT_S = 1800.0


def baseline_argv(spec: dict[str, Any]) -> list[str]:
    """`docker run --rm` with the pool's limits: the source arrives on stdin, is written to
    /work, compiled when the language does, and run, all in the one fresh container."""
    steps = [f"cat > /work/{shlex.quote(spec['file'])}"]
    if spec["compile"]:
        steps.append(shlex.join(spec["compile"]))
    steps.append("exec " + shlex.join(spec["run"]) + " </dev/null")
    return docker_run_argv(spec["config"], ["sh", "-c", " && ".join(steps)])


def bench(ctx: Context, lang: str, levels: list[int], runs: int, host: str | None) -> dict[str, Any]:
    from labctl.agent.sandbox import languages
    from labctl.hosts.agent_ship import ask_agent

    hosts = sandbox_hosts(ctx, host)
    if len(hosts) != 1 and host:
        raise InputError(
            f"--host '{host}' names {len(hosts)} hosts; the bench runs on one.", "Name one host."
        )
    limits = Limits()
    spec = lang_spec(lang, limits)
    target = ready_hosts(ctx, hosts, [lang])[0]
    env = spec["env"]
    argv = baseline_argv(spec)
    if env:
        argv[2:2] = [x for k, v in sorted(env.items()) for x in ("--env", f"{k}={v}")]
    hello = languages.recipe(lang).hello
    args = {
        "programs": [{"lang": lang, "source": hello, "stdin": None}],
        "lab": ctx.inventory.lab,
        "langs": {lang: spec},
        "limits": limits.as_dict(),
        "concurrency": levels,
        "runs": runs,
        "expect": "hello",
        "docker_run": argv,
    }
    try:
        answer = ask_agent(ctx, target, "sandbox.bench", args, timeout=BENCH_TIMEOUT_S)
    except HostError as e:
        raise host_failure(ctx, target, [lang], e) from None
    return {"host": target.name, "lang": lang, "runs": runs, "limits": limits.as_dict(), **answer}
