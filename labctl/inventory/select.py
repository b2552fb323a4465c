"""Choosing hosts with --limit: names, comma lists, `role:NAME`, globs, and `!` to exclude."""

from __future__ import annotations

import fnmatch

from labctl.errors import InputError
from labctl.inventory.model import Host, Inventory


def select_hosts(inv: Inventory, limit: str | None, label: str = "--limit") -> list[Host]:
    """Hosts matching `limit`, in inventory order. No limit (None), or `all`, means every host.

    Each comma-separated term is a host name, a glob (`node*`), `role:NAME` or `all`; a term
    starting with `!` removes what it matches. A term that matches nothing is an error, so a
    typo never silently shrinks the run; so is an empty term (`--limit ''`, `m5,,irina`) and
    an expression that leaves no host (`!*`). `label` names where the expression was written
    (`--limit`, `--host`; "" where the error is shown after its file, line and field).
    """
    if limit is None:
        return list(inv.hosts.values())
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
    any_include = False
    for term in terms:
        negate = term.startswith("!")
        pattern = term[1:] if negate else term
        matched = _match(inv, pattern)
        if not matched:
            raise InputError(f"{where}{term!r} matches no host in {inv.path}.", hint)
        if negate:
            exclude |= matched
        else:
            any_include = True
            include |= matched
    chosen = (include if any_include else set(inv.hosts)) - exclude
    if not chosen:
        raise InputError(f"{where}{limit!r} leaves no host to act on in {inv.path}.", hint)
    return [h for name, h in inv.hosts.items() if name in chosen]


def _match(inv: Inventory, pattern: str) -> set[str]:
    if pattern == "all":  # `all,!m6` reads as every host but m6
        return set(inv.hosts)
    if pattern.startswith("role:"):
        role = pattern[5:]
        return {n for n, h in inv.hosts.items() if role in h.roles}
    if any(c in pattern for c in "*?["):
        return {n for n in inv.hosts if fnmatch.fnmatchcase(n, pattern)}
    return {pattern} if pattern in inv.hosts else set()
