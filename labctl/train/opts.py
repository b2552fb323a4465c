"""The request options train backends declare: one `Option` per setting a job file reads.

Each backend declares the options it reads next to its code (`options`, as torchx schedulers
declare their run_opts); options several backends read are declared once in a module they
share (jobs.CLUSTER_OPTIONS, k8s_pod.POD_OPTIONS) and named by each. Everything else is built
from the declarations: `request.JobOptions` takes their names, `labctl train` offers their
flags, `labctl train backends` lists them. A new option is one `Option` in its backend's module.

Standard library only, and no backend imported until `declared()` is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from labctl.agent.core.registry import load


@dataclass(frozen=True)
class Bound:
    """The least a count option takes, and what `JobOptions` says when it is given less."""

    least: int
    why: str  # "a job runs on one node at least"
    hint: str  # what to give instead, after "Give "


@dataclass(frozen=True)
class Option:
    """One request option a backend reads, as torchx schedulers declare run_opts.

    `help` and `default` are what the option means to the declaring backend (`labctl train
    backends`); the rest describe its flag and are the same for every backend that declares it,
    so a backend naming a shared option may leave them out and the first declaration that gives
    one is used (`declared()` refuses two that differ).
    """

    name: str  # the JobOptions attribute
    type: type  # str, int or bool (a bool flag gets its --no- switch)
    help: str  # what it means to this backend
    default: Any = None  # what the backend uses when it is not given (None: nothing)
    flag: str = ""  # "": --name-with-dashes
    flag_help: str = ""  # the flag's text in `labctl train --help`
    bound: Bound | None = None  # checked by JobOptions, whichever backend is chosen
    check: Callable[[Any, str], object] | None = None  # check(value, flag) raises InputError on bad input
    cli_min: int | None = None  # the least the command line takes (a usage error, before labctl runs)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


# The attributes that describe the flag rather than the option's meaning to one backend.
_FLAG_ATTRS = ("type", "flag", "flag_help", "bound", "check", "cli_min")


def merge(declarations: list[Option]) -> Option:
    """One option's declarations by several backends, as the flag they share."""
    merged = declarations[0]
    for other in declarations[1:]:
        for attr in _FLAG_ATTRS:
            mine, theirs = getattr(merged, attr), getattr(other, attr)
            if theirs in (None, "") or theirs == mine:
                continue
            if mine in (None, ""):
                merged = replace(merged, **{attr: theirs})
                continue
            raise ValueError(f"option {merged.name!r} is declared with two {attr}s: {mine!r} and {theirs!r}")
    return merged


def declared() -> dict[str, Option]:
    """Every backend's options by name, merged into their flags, in the order backends are offered."""
    # Read through the registry, as backends themselves are: the backends import request.py,
    # which reads this, so a plain import would close a circle.
    found: dict[str, Option] = load("labctl.train.backends:declared_options")()
    return found


def describe(option: Option) -> dict[str, Any]:
    """An option as `labctl train backends --json` shows it."""
    return {
        "name": option.name,
        "flag": option.cli_flag,
        "type": option.type.__name__,
        "default": option.default,
        "help": option.help,
    }
