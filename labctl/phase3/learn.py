"""`labctl bench phase3 --learn`: does phase 3 learn? The reward per step of a short run against
a warm set that rewards what the CET writes.

A coder model made with `labctl bench make-model --kind coder --hint-matters` writes a task's
solution only when the hint (the CET's context) holds the task's tag, one letter, and a program
that passes nothing otherwise. With such models warm, the reward is what the CET's contexts
earn: a CET that learns to write the tags earns more. The run asks only the tasks the models
were trained on (their labctl_coder.json, read from the storage host), a group of contexts per
task (the group baseline), at a learning rate and RL weight that let 100 steps show it on two
CPU cores; every `--set` given wins over these.

Reported: the reward of every step, its mean over the first and the last `window` steps, the
ratio of the two, and the first step at which the moving mean of `window` steps reached twice
the first mean. Nothing here is timed against a clock: the figure is rewards per step.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from labctl.output.errors import InputError
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.orchestra.spec import Orchestra

WINDOW = 10  # steps averaged at the start, at the end, and in the moving mean
# What the run needs to show learning in a hundred steps (about 80 s on two cores); --set wins.
# rl.weight 50: at 1 the language-modelling loss, which pulls the CET towards its corpus, washes
# the policy gradient out (measured: no rise in 150 steps; docs/benchmarks.md).
LEARN_SETTINGS = (
    "lr=1e-2",
    "warmup_steps=0",
    "log_every=1",
    "checkpoint_every=100000",
    "rl.group_size=8",
    "rl.tasks_per_step=1",
    "rl.answer_temperature=0",
    "rl.weight=50",
)


def hint_coders(ctx: Context, orch: Orchestra) -> tuple[list[str], list[str], list[str]]:
    """(warm models whose hint matters, the other warm models, the tasks all of the first were
    trained on, in their order)."""
    from labctl.orchestra.files import read_files
    from labctl.orchestra.rotate import serving_hosts
    from labctl.phase3.bench import _warm_endpoints

    warm = [e.name for e in _warm_endpoints(ctx, orch)]
    files, _ = read_files(ctx, orch, serving_hosts(ctx, orch))
    coders = [n for n in warm if ((files.get(n) or {}).get("coder") or {}).get("hint_matters")]
    others = [n for n in warm if n not in coders]
    if not coders:
        raise InputError(
            "No warm model is a coder model whose hint matters, so the reward would not follow what "
            f"the CET writes (warm: {', '.join(warm)}).",
            "Make one and serve it: `labctl bench make-model --kind coder --hint-matters --host STORAGE "
            "--name learn-coder`, then `labctl orchestra start -f FILE` with a file whose warm set is it "
            "(inventory/examples/orchestra-learn.yaml, which `labctl init` writes).",
        )
    trained: list[str] = list(files[coders[0]]["coder"]["trained"])
    for n in coders[1:]:
        theirs = set(files[n]["coder"]["trained"])
        trained = [t for t in trained if t in theirs]
    if not trained:
        raise InputError(
            f"The warm coder models ({', '.join(coders)}) share no trained task.",
            "Serve coder models made with the same --tasks.",
        )
    return coders, others, trained


def learn_args(train_args: list[str], tasks: list[str], steps: int) -> list[str]:
    """`labctl train` arguments: the learning settings, then the caller's (a later --set wins)."""
    own = [f"steps={steps}", f"rl.tasks=[{','.join(tasks)}]", *LEARN_SETTINGS]
    out: list[str] = []
    for item in own:
        out += ["--set", item]
    return out + train_args


def learning_curve(rewards: list[float | None], window: int = WINDOW) -> dict[str, Any]:
    """The figure from the rewards of the steps in order (None: a step that judged nothing)."""
    judged = [r for r in rewards if r is not None]
    w = max(1, min(window, len(judged) // 2))
    first = statistics.fmean(judged[:w]) if judged else None
    last = statistics.fmean(judged[-w:]) if judged else None
    doubled_at = None
    if first is not None:
        seen: list[tuple[int, float]] = [(i + 1, r) for i, r in enumerate(rewards) if r is not None]
        for k in range(w, len(seen) + 1):
            if statistics.fmean(r for _, r in seen[k - w : k]) >= 2 * first and first > 0:
                doubled_at = seen[k - 1][0]
                break
    return {
        "window": w,
        "first_mean": None if first is None else round(first, 4),
        "last_mean": None if last is None else round(last, 4),
        "ratio": round(last / first, 3) if first and last is not None else None,
        "doubled_at_step": doubled_at,
    }


def learning_figure(
    ctx: Context, orch: Orchestra, train_args: list[str], steps: int, progress: Progress = QUIET
) -> dict[str, Any]:
    from labctl.phase3.bench import run_phase3

    coders, others, tasks = hint_coders(ctx, orch)
    progress.event("learning", tasks=tasks, coders=coders, others=others)
    events = run_phase3(ctx, learn_args(train_args, tasks, steps), "learn", progress=progress)
    rewards = [None if e.get("reward") is None else float(e["reward"]) for e in events]
    return {
        "models": coders,
        "other_models": others,
        "tasks": tasks,
        "steps": len(events),
        "rewards": rewards,
        "policy_loss_steps": sum(1 for e in events if e.get("policy_loss") is not None),
        **learning_curve(rewards),
    }
