"""The orchestra commands' answers as types (the handlers in host.py declare them; the controller
reads its answers as them). Standard library only, Python 3.8."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

from ..core.spec import Time
from ..facts.collect import GPU

# What the orchestra commands answer, as types the controller's code can read them as (a TypedDict
# is a shape in labctl/agent/core/spec.py's language): a total=False class adds the keys an
# answer may lack to its base's, which every answer has (Python 3.8 has no NotRequired).


class _Server(TypedDict):
    model: str
    pid: int


class Server(_Server, total=False):
    """A model server this host runs, as state_command finds it."""

    pgid: int
    port: Optional[int]
    gpu: Optional[int]
    started: Optional[Time]


class WarmFile(TypedDict, total=False):
    """warm.json as the host holds it, damage and all: the rotation repairs what it finds."""

    models: List[Any]


class _StateAnswer(TypedDict):
    servers: List[Server]


class StateAnswer(_StateAnswer, total=False):
    warm: Optional[WarmFile]
    warm_error: Optional[str]
    history: List[Dict[str, Any]]
    others: List[Dict[str, Any]]
    gpu_source: str
    gpus: List[GPU]
    gpu_error: str


class _StartAnswer(TypedDict):
    pid: int
    port: int


class StartAnswer(_StartAnswer, total=False):
    model: str
    gpu: Optional[int]
    log: str


class _Health(TypedDict):
    model: str
    healthy: bool


class Health(_Health, total=False):
    """One server's health, in the order the servers were asked."""

    port: int
    pid: Optional[int]
    state: str
    error: Optional[str]
    log_tail: str
    seconds: float
    health: Any


class HealthAnswer(TypedDict):
    results: List[Health]


class _Stopped(TypedDict):
    model: str
    pid: int


class Stopped(_Stopped, total=False):
    killed: bool


class Remaining(TypedDict, total=False):
    model: str
    pid: int


class _StopAnswer(TypedDict):
    stopped: List[Stopped]
    remaining: List[Remaining]


class StopAnswer(_StopAnswer, total=False):
    absent: List[str]
