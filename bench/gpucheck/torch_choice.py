"""torch_env's choice for this card: the build labctl would install, and its tables against the real torch.

labctl decides which CUDA build of torch runs on a GPU from tables of each build's
architectures (labctl/facts/gpus.py), because it must decide before torch is installed. The card
and the torch installed on it are the final word: the architectures this torch was built
for, and a kernel that really ran. Where the tables and the real build disagree, the
tables are wrong and the section fails.
"""

from __future__ import annotations

from typing import Any

from .base import CheckEnv, Section

TITLE = "torch_env's choice for this card"
PLAN = [
    "the card's compute capability from torch (9.0 expected on H100/H200)",
    "the build labctl's torch_env picks for it (cuda: auto) for labctl's pinned torch and for the installed one",
    "`labctl provision --check --tags torch`: the real resource's plan on this host",
    "labctl's architecture table for the installed build against torch.cuda.get_arch_list(); runs_on for this card",
    "a matrix product on the card proves the installed build really has kernels for it",
]


def _variant(cuda: str | None) -> str:
    """torch.version.cuda ("13.0") as the wheel's variant name ("cu130")."""
    if not cuda:
        return "cpu"
    major, _, minor = cuda.partition(".")
    return f"cu{major}{minor[:1] or '0'}"


def run(env: CheckEnv) -> Section:
    import torch

    from labctl.agent.core.gpus import arch_caps, runs_on
    from labctl.facts.gpus import build_archs, builds_for, fmt_cap, known_cap
    from labctl.provision.resources.torch_env import TorchEnvParams, choose_build

    sec = Section("torch_env", TITLE)
    # What `torch_env` installs when the playbook names no version.
    pinned = str(TorchEnvParams.model_fields["version"].default)
    installed = torch.__version__.split("+")[0]
    if env.cuda:
        cap = torch.cuda.get_device_capability(0)
        name = torch.cuda.get_device_name(0)
        sec.row("card", name, f"compute capability {cap[0]}.{cap[1]}")
    else:
        name = "NVIDIA H100 80GB HBM3 (assumed: no GPU here)"
        cap = known_cap("H100") or (9, 0)
        sec.skip("the card's own capability", "no GPU here (smoke run): H100's 9.0 from labctl's table")
    gpus = [(name, cap)]
    picks: dict[str, Any] = {}
    for version in dict.fromkeys([pinned, installed]):
        pick = choose_build(version, "auto", gpus)
        picks[version] = {"auto": pick, "all_fitting": builds_for(version, [cap])}
        sec.row(
            f"torch_env pick for torch {version}",
            f"{version}+{pick}",
            "builds that fit: " + ", ".join(picks[version]["all_fitting"]),
        )
    sec.figures["capability"] = f"{cap[0]}.{cap[1]}"
    sec.figures["picks"] = picks

    rc, doc, _ = env.labctl(
        "provision", "--check", "--tags", "torch", "--limit", env.host, timeout=180, check=False
    )
    planned = [r for r in (doc or {}).get("results", []) if r.get("type") == "torch_env"]
    sec.figures["provision_check"] = {"exit": rc, "results": planned}
    if planned:
        r = planned[0]
        sec.row(
            "provision --check --tags torch",
            r["status"],
            "; ".join(r.get("summary") or []) or str(r.get("error")),
        )
        # What this host's own GPUs call for (none in the smoke run: the CPU build).
        want = choose_build(pinned, "auto", gpus if env.cuda else [])
        if r.get("error") or (want not in " ".join(r.get("summary") or []) and r["status"] == "changed"):
            sec.error = f"torch_env's plan does not install {pinned}+{want}: {r}"
    else:
        sec.error = f"provision --check planned no torch_env (exit {rc})"

    variant = _variant(torch.version.cuda)
    table = build_archs(installed, variant)
    actual = torch.cuda.get_arch_list() if torch.cuda.is_available() else []
    sec.figures["installed"] = {"version": torch.__version__, "variant": variant, "arch_list": actual}
    if env.cuda:
        predicted = sorted(table[0]) if table else None
        real, _ = arch_caps(actual)
        sec.figures["table"] = {
            "archs": [fmt_cap(c) for c in predicted or []],
            "ptx": table[1] if table else None,
        }
        sec.row(
            f"installed torch {torch.__version__}: get_arch_list()",
            " ".join(actual),
            "labctl's table: "
            + (" ".join(fmt_cap(c) for c in predicted) if predicted else f"no entry for {variant}"),
        )
        verdict_table = runs_on([f"sm_{a}{b}" for a, b in predicted or []], cap) if predicted else None
        verdict_real = runs_on(actual, cap)
        sec.row(
            "runs_on(get_arch_list(), this card)", str(verdict_real), f"from labctl's table: {verdict_table}"
        )
        a = torch.randn(1024, 1024, device="cuda")
        ran = bool(torch.isfinite(a @ a).all().item())
        sec.row("a matrix product on the card", "ran" if ran else "failed", "the installed build's kernels")
        sec.figures.update({"runs_on": verdict_real, "runs_on_table": verdict_table, "kernel_ran": ran})
        missing = sorted(set(predicted or []) - set(real)) if predicted else []
        sec.figures["table_missing_from_build"] = [fmt_cap(c) for c in missing]
        if not verdict_real or not ran:
            sec.error = "torch on this card has no kernels for it, or they did not run"
        elif missing:
            sec.error = (
                f"labctl's table claims {', '.join(fmt_cap(c) for c in missing)} that this build lacks"
            )
        elif verdict_table is not None and verdict_table != verdict_real:
            sec.error = "labctl's table and the real build disagree on this card"
    else:
        sec.skip("get_arch_list() against labctl's table", "CPU torch here (smoke run)")
    return sec
