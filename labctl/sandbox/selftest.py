"""`labctl sandbox selftest`: run every attack, check the host after each, judge containment.

The engine and the host check come in as functions, so the same loop runs over SSH through the
agent (`sandbox.run`, `sandbox.hostcheck`) and, in tests, against any runner that takes the
same requests and answers the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from labctl.output.errors import LabctlError
from labctl.sandbox.attacks import Attack, attacks_for

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.inventory.model import Host

# (requests, concurrency) -> one result per request, in order
RunBatch = Callable[[list[dict[str, Any]], int], list[dict[str, Any]]]
# (action, args) -> the agent's answer to sandbox.hostcheck
HostCheck = Callable[[str, dict[str, Any]], dict[str, Any]]
# How long the host may take to remove a used container and give back its memory.
SETTLE_S = 30.0
# The agent call's own limit on top of twice the programs' time limits (compile, then run).
RUN_SLACK_S = 60.0


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    """A result without its (possibly 1 MiB) output: what the table and --json carry."""
    out = {k: r.get(k) for k in ("exit_code", "truncated", "timed_out", "oom_killed", "wall_ms")}
    out["stdout_bytes"] = len(r.get("stdout") or "")
    out["stderr_bytes"] = len(r.get("stderr") or "")
    out["stdout_head"] = (r.get("stdout") or "")[:300]
    return out


def run_attack(
    attack: Attack, run_batch: RunBatch, hostcheck: HostCheck, labels: Sequence[str] = ()
) -> dict[str, Any]:
    """One attack: its runs, the host check after them, the verdict. `contained` is None when
    the attack could not be run at all (that is no proof of containment either)."""
    row: dict[str, Any] = {
        "lang": attack.lang,
        "attack": attack.name,
        "kind": attack.kind,
        "what": attack.what,
    }
    before = hostcheck("snapshot", {"labels": list(labels)})["snapshot"]
    try:
        reqs = attack.requests()
        # one after another (a marker for the next run) unless they must meet (signalling)
        results = run_batch(reqs, len(reqs)) if attack.together else [run_batch([req], 1)[0] for req in reqs]
    except Exception as e:  # the engine's failure is the row's detail, not the end of the table
        why = e.paragraph() if isinstance(e, LabctlError) else str(e)  # with its fix
        row.update(contained=None, detail=f"could not run: {why}", runs=[])
        return row
    host = hostcheck("compare", {"before": before, "wait_s": SETTLE_S})
    contained, detail = attack.judge(results, host)
    row.update(
        contained=contained,
        detail=detail,
        runs=[_brief(r) for r in results],
        host_problems=host.get("problems", []),
    )
    return row


def selftest(
    langs: Sequence[str],
    run_batch: RunBatch,
    hostcheck: HostCheck,
    labels: Sequence[str] = (),
    on_row: Callable[[dict[str, Any]], None] | None = None,
    only: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Every attack of every language in `langs` (those named in `only`, when given), in order; a
    language without attacks gets one row saying so (contained None)."""
    rows: list[dict[str, Any]] = []
    for lang in langs:
        attacks = attacks_for(lang)
        if only and attacks:
            attacks = [a for a in attacks if a.name in only]
            if not attacks:
                continue  # none of the named attacks is written for this language: nothing to run
        if not attacks:
            rows.append(
                {
                    "lang": lang,
                    "attack": "-",
                    "kind": "-",
                    "what": "-",
                    "contained": None,
                    "detail": f"no attacks are written for {lang}",
                    "runs": [],
                }
            )
            continue
        for attack in attacks:
            row = run_attack(attack, run_batch, hostcheck, labels)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def escaped(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("contained") is False]


def check_attack_names(names: Sequence[str], langs: Sequence[str]) -> None:
    """Refuse an --attack that no language of this run has, before any host is asked."""
    from labctl.documents.suggest import did_you_mean
    from labctl.output.errors import InputError

    known = [a.name for lang in langs for a in attacks_for(lang)]
    for name in names:
        if name not in known:
            raise InputError(
                f"No self-test attack is named '{name}' for {', '.join(langs)}." + did_you_mean(name, known),
                f"Name one of: {', '.join(dict.fromkeys(known))}; or leave out --attack to run them all.",
            )


def on_hosts(ctx: Context, host: str | None, lang: str | None, only: Sequence[str] = ()) -> dict[str, Any]:
    """The self-test on each sandbox host (--host, or the inventory's role `sandbox`) through
    its agent: `sandbox.run` for the attacks, `sandbox.hostcheck` around each. The languages are
    --lang's, else each host's inventory `sandbox.languages`; `only` keeps the attacks so named."""
    from labctl.agent.sandbox import LABEL_LAB
    from labctl.hosts.agent_ship import ask_agent
    from labctl.sandbox.api import DEFAULT_POOL, host_failure, lang_spec, ready_hosts, sandbox_hosts
    from labctl.sandbox.limits import Limits

    limits = Limits()
    hosts = sandbox_hosts(ctx, host)
    if lang:
        lang_spec(lang, limits)  # an unknown language is named before a host is looked at
        check_attack_names(only, [lang])
        hosts = ready_hosts(ctx, hosts, [lang])
    plan = []
    for h in hosts:
        langs = [lang] if lang else list(h.sandbox.languages if h.sandbox else ["python"])
        # every language checked before anything runs: a typo fails at once, not mid-table
        plan.append((h, langs, {x: lang_spec(x, limits) for x in langs}))
    if only and not lang:
        check_attack_names(only, [x for _, langs, _ in plan for x in langs])
    rows: list[dict[str, Any]] = []
    for h, langs, specs in plan:
        pool = h.sandbox.pool if h.sandbox else DEFAULT_POOL

        def run_batch(
            reqs: list[dict[str, Any]],
            conc: int,
            h: Host = h,
            specs: dict[str, Any] = specs,
            pool: int = pool,
        ) -> list[dict[str, Any]]:
            args = {
                "programs": reqs,
                "lab": ctx.inventory.lab,
                "langs": specs,
                "limits": limits.as_dict(),
                "concurrency": conc,
                "pool": pool,
            }
            timeout = max(float(r["timeout"]) for r in reqs) * 2 + RUN_SLACK_S
            try:
                return list(ask_agent(ctx, h, "sandbox.run", args, timeout=timeout)["results"])
            except LabctlError as e:
                raise host_failure(ctx, h, list(specs), e) from None

        def hostcheck(action: str, args: dict[str, Any], h: Host = h) -> dict[str, Any]:
            return dict(
                ask_agent(ctx, h, "sandbox.hostcheck", {"action": action, **args}, timeout=SETTLE_S + 60)
            )

        # the host check judges this lab's containers only: another lab's runs on the same
        # dockerd are neither left behind by this test nor its to count
        labels = [f"{LABEL_LAB}={ctx.inventory.lab}"]
        for row in selftest(langs, run_batch, hostcheck, labels, only=only):
            rows.append({"host": h.name, **row})
    return {"hosts": [h.name for h, _, _ in plan], "rows": rows, "escaped": len(escaped(rows))}
