"""The kinds of probe `provision.probe` reads and of op `provision.apply` runs, declared by the
feature that owns them.

Each feature's host package lists its own in its `__init__.py`:

    PROBES = (ProbeKind("bond", ".bondcheck:bond_probe", "a bond's driver, members and netplan"),)
    OPS = (OpKind("dockerd", ".daemon:dockerd_op", "Docker's daemon settings, restarted"),)

and `merge` builds one table of each from the packages given to it, so a new resource adds its
probe or op next to its own code instead of in the provision package. An entry is a
"module:function" string relative to the declaring package, imported through registry.load only
when a probe or op of that kind runs: a heavy module costs only the kinds that name it.

The names are what the controller sends ({"kind": "bond"}, {"op": "sandbox_image"}), flat and
without the feature's prefix; two features declaring one name is refused when the table is
built, before any probe runs.

Standard library only (Python 3.8); it imports no feature: the dispatch passes the packages in.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, Set, Union

from . import registry


@dataclass(frozen=True)
class ProbeKind:
    """A probe: {"kind": name, ...} -> a dict of what it found (read only)."""

    name: str
    entry: str  # ".module:function" relative to the declaring package
    doc: str = ""


@dataclass(frozen=True)
class OpKind:
    """An op: {"op": name, ...} -> one line saying what it did; raises AgentError or OSError."""

    name: str
    entry: str  # ".module:function" relative to the declaring package
    doc: str = ""


Kind = Union[ProbeKind, OpKind]


@dataclass(frozen=True)
class Declared:
    """A kind with the package that declared it: where its entry is resolved."""

    kind: Kind
    package: str

    @property
    def module(self) -> str:
        """The absolute name of the module the entry names (agent_blob ships it)."""
        return importlib.util.resolve_name(self.kind.entry.partition(":")[0], self.package)

    def load(self) -> Callable[[Dict[str, Any]], Any]:
        fn: Callable[[Dict[str, Any]], Any] = registry.load(self.kind.entry, self.package)
        return fn


class Table(Dict[str, Declared]):
    """A merged table: name -> Declared. Its own type so that agent_blob, which follows imports
    in the source and so cannot see lazy entries, finds the modules a handler's tables name."""

    def modules(self) -> Set[str]:
        return {d.module for d in self.values()}


def merge(features: Iterable[ModuleType], attr: str) -> Table:
    """One table of the `attr` ("PROBES" or "OPS") every package in `features` declares.

    Raises ValueError for a name declared twice, a kind of the wrong type (an OpKind among
    PROBES), or an entry that is not ".module:function": at import, not when that kind runs.
    """
    want = {"PROBES": ProbeKind, "OPS": OpKind}[attr]
    table = Table()
    for feature in features:
        for kind in getattr(feature, attr, ()):
            where = f"{feature.__name__}.{attr}"
            if not isinstance(kind, (ProbeKind, OpKind)) or not isinstance(kind, want):
                raise ValueError(f"{where} holds {kind!r}, not a {want.__name__}")
            module, sep, function = kind.entry.partition(":")
            if not module or not sep or not function:
                raise ValueError(f"{where}: {kind.name!r} has entry {kind.entry!r}, not 'module:function'")
            if kind.name in table:
                first = table[kind.name].package
                raise ValueError(
                    f"{attr[:-1].lower()} {kind.name!r} is declared by both {first} and {feature.__name__}"
                )
            table[kind.name] = Declared(kind, feature.__name__)
    return table
