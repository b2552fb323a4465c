"""Choosing hosts with --limit: names, comma lists, `role:NAME`, globs, and `!` to exclude."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from labctl.documents.suggest import did_you_mean
from labctl.inventory.model import Host, Inventory
from labctl.output.errors import InputError

# Roles labctl itself gives a meaning to: its shipped playbooks, phase and orchestra files
# select hosts by them, and its commands look for them. Any lab may lack any of them, so a
# file naming one selects no host there rather than being a typo.
KNOWN_ROLES = ("train", "inference", "cache", "storage", "sandbox", "orchestrator", "edge")


@dataclass
class Selection:
    """What a selector written in a file (a play's or phase's `hosts:`) picks in this lab.

    `absent` are the roles it names that labctl knows but no host of this lab has; when they
    leave it no host, `why_empty` says so ("no host has role train").
    """

    hosts: list[Host]
    absent: list[str] = field(default_factory=list)

    @property
    def why_empty(self) -> str | None:
        if self.hosts or not self.absent:
            return None
        return f"no host has role {' or '.join(self.absent)}"


def select_hosts(inv: Inventory, limit: str | None, label: str = "--limit") -> list[Host]:
    """Hosts matching `limit`, in inventory order. No limit (None), or `all`, means every host.

    Each comma-separated term is a host name, a glob (`node*`), `role:NAME` or `all`; a term
    starting with `!` removes what it matches. A term that matches nothing is an error, so a
    typo never silently shrinks the run; so is an empty term (`--limit ''`, `m5,,irina`) and
    an expression that leaves no host (`!*`). `label` names where the expression was written
    (`--limit`, `--host`; "" where the error is shown after its file, line and field).
    """
    return _select(inv, limit, label, absent_ok=False).hosts


def select_in_lab(inv: Inventory, expr: str, label: str = "") -> Selection:
    """`select_hosts` for a selector that a file ships for any lab (`hosts: role:train`).

    A `role:NAME` term naming one of KNOWN_ROLES that no host here has matches nothing
    instead of being an error, and an expression it leaves without a host is an empty
    Selection saying why: a lab without a trainer has nothing to train, it has no typo.
    Host names, globs and other roles that match nothing stay errors (with did-you-mean).
    """
    return _select(inv, expr, label, absent_ok=True)


def require_role_hosts(inv: Inventory, expr: str, what: str, label: str = "", hint: str = "") -> list[Host]:
    """The hosts `expr` picks for `what` ("phase 1 trains"); when the lab has no host of its
    role, an InputError naming that precondition (exit 2) instead of a selector error."""
    chosen = select_in_lab(inv, expr, label)
    if chosen.why_empty:
        role = chosen.absent[0]
        raise InputError(
            f"{what} on {expr!r}, and {chosen.why_empty} in {inv.path}.",
            hint or f"Give a host the role in the inventory (roles: [{role}]), or name hosts with --limit.",
        )
    return chosen.hosts


def _select(inv: Inventory, limit: str | None, label: str, absent_ok: bool) -> Selection:
    if limit is None:
        return Selection(list(inv.hosts.values()))
    where = f"{label} " if label else ""
    hint = f"Hosts: {', '.join(inv.hosts)}. Roles (use role:NAME): {', '.join(inv.roles()) or 'none'}."
    terms = [t.strip() for t in limit.split(",")]
    if not all(terms):
        raise InputError(
            f"{where}{limit!r} has an empty host term, so it would not say which hosts to use.",
            f"Name hosts separated by single commas, or `all` for every host. {hint}",
        )
    include: set[str] = set()
    exclude: set[str] = set()
    absent: list[str] = []
    any_include = False
    for term in terms:
        negate = term.startswith("!")
        pattern = term[1:] if negate else term
        matched = _match(inv, pattern)
        if not matched:
            role = pattern[5:] if pattern.startswith("role:") else ""
            if not (absent_ok and role in KNOWN_ROLES):
                raise InputError(
                    f"{where}{term!r} matches no host in {inv.path}.{_did_you_mean(inv, pattern)}", hint
                )
            if not negate and role not in absent:
                absent.append(role)
        if negate:
            exclude |= matched
        else:
            any_include = True
            include |= matched
    chosen = (include if any_include else set(inv.hosts)) - exclude
    if not chosen and not absent:
        raise InputError(f"{where}{limit!r} leaves no host to act on in {inv.path}.", hint)
    return Selection([h for name, h in inv.hosts.items() if name in chosen], absent)


def _did_you_mean(inv: Inventory, pattern: str) -> str:
    # Roles are compared without their shared `role:`, which would make any two look alike.
    role = pattern.startswith("role:")
    word, known = (pattern[5:], [*inv.roles(), *KNOWN_ROLES]) if role else (pattern, list(inv.hosts))
    return did_you_mean(word, known, prefix="role:" if role else "")


def _match(inv: Inventory, pattern: str) -> set[str]:
    if pattern == "all":  # `all,!m6` reads as every host but m6
        return set(inv.hosts)
    if pattern.startswith("role:"):
        role = pattern[5:]
        return {n for n, h in inv.hosts.items() if role in h.roles}
    if any(c in pattern for c in "*?["):
        return {n for n in inv.hosts if fnmatch.fnmatchcase(n, pattern)}
    return {pattern} if pattern in inv.hosts else set()
