"""What a host that trains spends on remote tiers, a month at a time, kept across runs.

Phase 3 asks a remote tier for its `share` of the tries only (`chosen`), adds the cost of each
answer it gave (client.Answer.cost_usd: the usage the provider reported times the tier's
price_per_mtok) to this host's ledger as it comes back, and asks a tier no more once its month
reached its `budget_per_month` (`RemoteUse`). The ledger is one small JSON file per month and tier:

    DIR/2026-11/gpt-4o.json   {"tier", "month", "usd", "prompt_tokens", "completion_tokens",
                               "answers", "budget_per_month", "updated"}

DIR is $LABCTL_REMOTE_SPEND, else paths.remote_spend_dir(); a month is a UTC calendar month.
Every rank and every run on the host adds to the same files: a writer holds DIR/spend.lock (flock)
while it reads, adds and replaces a file (atomically, mode 0644: dollars and token counts, never a
key), so adds at once are never lost; a reader needs no lock. A file that is not its month's and
tier's record is damaged: it is reported (SpendError, and in `monitor.status`), never overwritten nor read
as zero, so a tier with a budget is not asked until someone has looked at it.

The ledger is the host's own: where several hosts train, each counts what its ranks spent and
holds the budget alone (`labctl status` and `labctl metrics` show every host's figures).

Standard library only, Python 3.8, like the rest of the agent.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..core import paths
from ..core.fsutil import write_json

SPEND_ENV = "LABCTL_REMOTE_SPEND"
LOCK_NAME = "spend.lock"
COUNTS = ("prompt_tokens", "completion_tokens", "answers")


class SpendError(Exception):
    """A ledger file that cannot be read as a record (damaged), or cannot be written."""


def month_of(t: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(t))


def chosen(tier: str, key: str, share: float) -> bool:
    """Whether `tier` is asked for the try named `key`. A hash, not a draw: the same key gets the
    same answer in every process and run (a resumed step asks what it asked before), about `share`
    of all keys get yes, and each tier falls on tries of its own (two tiers at 0.05 are not asked
    for the same twentieth)."""
    if share >= 1.0:
        return True
    digest = hashlib.sha256(f"{tier}\0{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < share * 2.0**64


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _empty(tier: str, month: str) -> Dict[str, Any]:
    return {
        "tier": tier,
        "month": month,
        "usd": 0.0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "answers": 0,
        "budget_per_month": None,
        "updated": None,
    }


def _damage(doc: Any, tier: str, month: str) -> Optional[str]:
    """What makes `doc` no record of `tier`'s spend in `month`, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("tier") != tier or doc.get("month") != month:
        return f"it names tier {doc.get('tier')!r} and month {doc.get('month')!r}"
    if not _number(doc.get("usd")) or doc["usd"] < 0:
        return f"usd is {doc.get('usd')!r}, not a number of dollars"
    for key in COUNTS:
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{key} is {value!r}, not a count"
    budget = doc.get("budget_per_month")
    if budget is not None and not (_number(budget) and budget > 0):
        return f"budget_per_month is {budget!r}"
    return None


class Ledger:
    """The host's spend per remote tier and month (see the module's docstring)."""

    def __init__(self, root: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        self.root = root or env.get(SPEND_ENV) or paths.remote_spend_dir()

    def path(self, tier: str, month: str) -> str:
        """DIR/MONTH/TIER.json; ValueError for a name that is not one path component."""
        return paths.child(paths.child(self.root, month, "the month"), tier + ".json", "the remote tier")

    def read(self, tier: str, month: str) -> Dict[str, Any]:
        """`tier`'s record of `month` (zeros where nothing was spent yet); SpendError when the file
        is damaged or cannot be read."""
        path = self.path(tier, month)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return _empty(tier, month)
        except OSError as exc:
            raise SpendError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            doc: Any = json.loads(raw.decode("utf-8"))
        except ValueError:
            doc = None
            why: Optional[str] = "not JSON"
        else:
            why = _damage(doc, tier, month)
        if why:
            raise SpendError(
                f"{path} is damaged ({why}), so {tier}'s spend in {month} is not known: look at it, "
                f"then fix or remove it (removed, {month} counts from 0)"
            )
        return dict(_empty(tier, month), **doc)

    def spent(self, tier: str, month: str) -> float:
        return float(self.read(tier, month)["usd"])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor releases the lock

    def add(
        self,
        tier: str,
        month: str,
        usd: float,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        budget: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Count one answer of `tier` in `month`; the record as it now stands. SpendError when the
        file is damaged (it is left as it is) or cannot be written."""
        if not (_number(usd) and usd >= 0):
            raise ValueError(f"{tier}: a cost of {usd!r} dollars cannot be counted")
        path = self.path(tier, month)
        try:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            with self._locked():
                record = self.read(tier, month)
                record["usd"] = float(record["usd"]) + float(usd)
                record["prompt_tokens"] += max(0, int(prompt_tokens))
                record["completion_tokens"] += max(0, int(completion_tokens))
                record["answers"] += 1
                record["budget_per_month"] = budget
                record["updated"] = round(time.time(), 3)
                write_json(path, record, mode=0o644)
        except OSError as exc:
            raise SpendError(f"cannot write {path}: {exc.strerror or exc}") from None
        return record

    def month_records(self, month: str) -> Tuple[List[Dict[str, Any]], List[str]]:
        """Every tier's record of `month`, by name, and what could not be read (damaged files)."""
        folder = os.path.join(self.root, month)
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            return [], [f"cannot read {folder}: {exc.strerror or exc}"]
        records: List[Dict[str, Any]] = []
        errors: List[str] = []
        for name in names:
            # ".gpt-4o.json.XXXX.tmp": write_atomic's file before its rename.
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                records.append(self.read(name[: -len(".json")], month))
            except (SpendError, ValueError) as exc:
                errors.append(str(exc))
        return records, errors


def _budgets(endpoints_path: str) -> Dict[str, Optional[float]]:
    """{tier: budget_per_month} of the remote tiers the endpoints file lists; {} without one."""
    try:
        with open(endpoints_path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    out: Dict[str, Optional[float]] = {}
    for r in (doc.get("remote") if isinstance(doc, dict) else None) or []:
        if isinstance(r, dict) and isinstance(r.get("name"), str):
            budget: Any = r.get("budget_per_month")
            out[r["name"]] = float(budget) if _number(budget) and budget > 0 else None
    return out


def status(
    ledger: Optional[Ledger] = None, endpoints_path: Optional[str] = None, now: Optional[float] = None
) -> Optional[Dict[str, Any]]:
    """This month's spend on this host for `monitor.status`: {month, tiers: [{tier, usd, prompt_tokens,
    completion_tokens, answers, budget_per_month}], errors}, or None where there is nothing to
    say (a host that does not train). A tier is listed when the ledger holds it or the endpoints
    file gives it a budget (0 spent so far); its budget is the endpoints file's, which the next
    ask goes by, else the one its last answer was counted against."""
    ledger = ledger or Ledger()
    month = month_of(time.time() if now is None else now)
    path = endpoints_path or os.environ.get("LABCTL_ORCHESTRA_ENDPOINTS") or paths.ORCHESTRA_ENDPOINTS
    budgets = _budgets(path)
    records, errors = ledger.month_records(month)
    by_tier = {r["tier"]: r for r in records}
    for tier, budget in budgets.items():
        if budget is not None and tier not in by_tier:
            by_tier[tier] = _empty(tier, month)
    if not by_tier and not errors:
        return None
    tiers = []
    for tier in sorted(by_tier):
        r = by_tier[tier]
        budget = budgets.get(tier, r.get("budget_per_month"))
        tiers.append(
            {
                "tier": tier,
                "usd": round(float(r["usd"]), 6),
                "prompt_tokens": r["prompt_tokens"],
                "completion_tokens": r["completion_tokens"],
                "answers": r["answers"],
                "budget_per_month": budget,
            }
        )
    return {"month": month, "dir": ledger.root, "tiers": tiers, "errors": errors}


class RemoteUse:
    """Which remote tiers each try of one trainer process asks, and what they cost. An endpoint
    marked `remote` is asked for the tries `chosen` gives it at its `share`, and for none once
    this host's spend on it this month reached its `budget_per_month`; any other (the warm set, a
    test's stand-ins) is always asked. `flush` gives what happened since the last flush, for the
    step event. Thread-safe: a step asks its tries from a pool."""

    def __init__(self, ledger: Optional[Ledger] = None, clock: Callable[[], float] = time.time) -> None:
        self._ledger = ledger
        self.clock = clock
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.asked: Dict[str, int] = {}  # tier -> tries it was asked for
        self.spend: Dict[str, float] = {}  # tier -> dollars its answers cost
        self.skipped: Dict[str, str] = {}  # tier -> why it was not asked (its budget)
        self.errors: Dict[str, str] = {}  # tier -> why its spend could not be counted

    @property
    def ledger(self) -> Ledger:
        # Made on first use: a run without remote tiers never looks for the folder.
        if self._ledger is None:
            self._ledger = Ledger()
        return self._ledger

    def endpoints_for(self, endpoints: Sequence[Any], key: str) -> List[Any]:
        """The endpoints the try named `key` asks, in their order."""
        out = []
        for ep in endpoints:
            if not getattr(ep, "remote", False):
                out.append(ep)
                continue
            if not chosen(ep.name, key, float(getattr(ep, "share", 1.0))):
                continue
            why = self.over_budget(ep)
            with self._lock:
                if why:
                    self.skipped[ep.name] = why
                else:
                    self.asked[ep.name] = self.asked.get(ep.name, 0) + 1
            if not why:
                out.append(ep)
        return out

    def over_budget(self, ep: Any) -> Optional[str]:
        """Why `ep` is not asked now for its budget, or None. A ledger that cannot be read leaves
        the spend unknown, and an unknown spend is not taken as room to spend more."""
        budget = getattr(ep, "budget_per_month", None)
        if budget is None:
            return None
        month = month_of(self.clock())
        try:
            spent = self.ledger.spent(ep.name, month)
        except (SpendError, ValueError) as exc:
            return f"budget {budget:g} not checkable: {exc}"
        if spent >= budget:
            return f"budget {budget:g} reached ({spent:.2f} spent in {month})"
        return None

    def record(self, endpoints: Sequence[Any], answers: Sequence[Any]) -> None:
        """Count each answer a remote tier of `endpoints` gave: the answering tier's (a request
        retried after a rotation may have been answered by a tier it was not sent to). A request
        that failed spent nothing."""
        remote = {ep.name: ep for ep in endpoints if getattr(ep, "remote", False)}
        if not remote:
            return
        month = month_of(self.clock())
        for a in answers:
            ep = remote.get(getattr(a, "answered_by", a.name))
            if ep is None or not a.ok:
                continue
            cost = float(getattr(a, "cost_usd", 0.0) or 0.0)
            with self._lock:
                self.spend[ep.name] = self.spend.get(ep.name, 0.0) + cost
            try:
                self.ledger.add(
                    ep.name,
                    month,
                    cost,
                    int(getattr(a, "prompt_tokens", 0) or 0),
                    int(getattr(a, "completion_tokens", 0) or 0),
                    getattr(ep, "budget_per_month", None),
                )
            except (SpendError, ValueError) as exc:
                with self._lock:
                    self.errors[ep.name] = str(exc)[:300]

    def flush(self) -> Dict[str, Any]:
        """{asked, spend_usd, skipped, errors} per tier since the last flush, and start afresh."""
        with self._lock:
            out = {
                "asked": dict(sorted(self.asked.items())),
                "spend_usd": dict(sorted(self.spend.items())),
                "skipped": dict(sorted(self.skipped.items())),
                "errors": dict(sorted(self.errors.items())),
            }
            self._reset()
        return out
