"""What each agent command takes and what it answers, declared next to its handler in one
language, plain data:

    @command(
        takes={"cache": "str", "models": Or(["any"], []), "force": Opt("bool", False)},
        answers={"evicted": [EVICTED_ENTRY], "not_cached": ["str"]},
    )
    def evict_command(args): ...

The agent checks the args once on dispatch (`call`): a missing, unknown or wrongly typed
argument is refused as AgentError(bad_args) naming the command and the argument, never a
KeyError deep in the handler, and the handler gets every default applied. The controller checks
every answer against the declared shape before any of its code reads it
(labctl/hosts/agent_ship.py, call_agent, through `commands.answer_problem`), so a host that
answers otherwise (a `python:` that is not a plain Python, a replaced agent, a broken disk
under the agent's files) is named as answering wrongly instead of labctl failing later on a
missing key.

The shape language:
  "str", "bool", "null", "any"   a JSON value of that kind ("any": whatever it is)
  "int"                          a whole number (never true/false), within 64 bits
  "num"                          an int or a float, finite; an argument of this shape alone
                                 reaches the handler as a float
  "time"                         a number of seconds since 1970, before the year 10000
  "cap"                          a CUDA compute capability as text: "8.6", "7.0", "9"
  "X?"                           X, or null
  [S]                            a list whose every item is S
  {"key": S, "key?": S}          an object with these keys ("key?": may be absent), each S;
                                 keys not named are allowed (an agent may add keys)
  {"*": S}                       an object whose other keys (a map by name) each hold S
  (S1, S2, ...)                  any one of these shapes (an argument is taken as the first
                                 that fits: ("int", "num") passes an int on as an int)
  a typing.TypedDict class       an object of its keys (the optional ones of a total=False
                                 class: "key?"), each of its annotation read as a shape: str,
                                 bool, int, float ("num"), Num, Time, Cap (the markers below),
                                 Any, None, Optional[T], Union[...], List[T], Dict[str, T], and
                                 TypedDicts; the controller (Python 3.9+) reads it, the agent
                                 never does, so an answer the controller's code reads as a type
                                 is declared once, as that type
An argument's shape may be wrapped:
  Opt(S, default)                may be left out, and then is `default` (null is a value)
  Or(S, default)                 may be left out, null or empty (0, "", [], {}, false), and
                                 then is `default`: the old `args.get(name) or default`
An argument `takes` does not name is refused. Only what the controller relies on is declared
in an answer: a value some consumer only shows may be "any", and what a run's own script
logged stays "any" (its readers check each value).

Standard library only, Python 3.8 syntax: the agent imports this module on the host.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import typing
from typing import Any, Callable, Dict, List, NewType, Optional, Tuple

from .errors import AgentError

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]

INT_LIMIT = 2**63
TIME_LIMIT = 253402300800.0  # 10000-01-01: time.localtime() and strftime take anything before it
CAP_RE = re.compile(r"[ \t]*[0-9]+(\.[0-9]+)?[ \t]*")
SCALARS = ("str", "bool", "null", "any", "int", "num", "time", "cap")

# A number passed on as sent (an int stays an int): "int" is tried first.
NUMBER = ("int", "num")
NUMBER_OR_NULL = ("int", "num", "null")

# What the controller says an answer lacked.
_WANTED = {
    "str": "a string",
    "bool": "true or false",
    "null": "null",
    "int": "a whole number",
    "num": "a number",
    "time": "a time (seconds since 1970)",
    "cap": "a compute capability such as '8.6'",
    "list": "a list",
    "dict": "an object",
}
# What the agent says a caller's argument must be (the wording bad_args has always had).
_ARG_WANTED = dict(_WANTED, int="an integer")

_REQUIRED = object()

# The scalar kinds a type cannot say, for TypedDict answers: Num is "num" (as float is), Time "time",
# Cap "cap".
Num = NewType("Num", float)
Time = NewType("Time", float)
Cap = NewType("Cap", str)
_TYPE_SHAPES: Tuple[Tuple[Any, str], ...] = (
    (str, "str"),
    (bool, "bool"),
    (int, "int"),
    (float, "num"),
    (type(None), "null"),
    (Num, "num"),
    (Time, "time"),
    (Cap, "cap"),
    (Any, "any"),
)


# -- checking a value against a shape ---------------------------------------------------------


def kind_of(value: Any) -> str:
    """A JSON value's kind, as a problem names what it got."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, str)):
        return type(value).__name__
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _scalar_ok(name: str, value: Any, bounded: bool = True) -> bool:
    if name == "any":
        return True
    if name == "null":
        return value is None
    if name == "str":
        return isinstance(value, str)
    if name == "bool":
        return isinstance(value, bool)
    if name == "cap":
        return isinstance(value, str) and CAP_RE.fullmatch(value) is not None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not bounded and name in ("int", "num"):
        return name == "num" or isinstance(value, int)
    if isinstance(value, int):
        if name == "time":
            return 0 <= value < TIME_LIMIT
        return -INT_LIMIT <= value < INT_LIMIT
    if name == "int" or not math.isfinite(value):
        return False
    return name == "num" or 0 <= value < TIME_LIMIT


def _wanted(shape: Any, names: Dict[str, str] = _WANTED) -> str:
    if isinstance(shape, str):
        base = shape[:-1] if shape.endswith("?") else shape
        text = "anything" if base == "any" else names[base]
        return text + " or null" if shape.endswith("?") and base not in ("null", "any") else text
    if isinstance(shape, list):
        return names["list"]
    if isinstance(shape, dict):
        return names["dict"]
    return " or ".join(_wanted(s, names) for s in shape)


def _got(value: Any) -> str:
    kind = kind_of(value)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        shown = repr(value)
        return f"{kind} {shown[:40] + '...' if len(shown) > 40 else shown}"
    return kind


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def problem(shape: Any, value: Any, path: str = "", bounded: bool = True) -> Optional[str]:
    """The first place where `value` does not have `shape` ("at PATH: expected X, got Y"), or None.
    `bounded=False` (arguments, as the agent has always taken them): an int of any size and any
    float (inf, nan) are numbers; the bounds are what the controller's readers of answers need."""
    # Most values fit: `fits` says so without naming a place for every key and item on the way
    # (a status answer's hour of history is tens of thousands of them: twice as fast; a
    # command's answer is checked by its checker(), about ten times as fast as the walk).
    if fits(shape, value, bounded):
        return None
    return _problem(shape, value, path, bounded)


def fits(shape: Any, value: Any, bounded: bool = True) -> bool:
    """Whether `value` has `shape`: problem(shape, value) is None, found without its message."""
    if isinstance(shape, str):
        if shape.endswith("?"):
            return value is None or _scalar_ok(shape[:-1], value, bounded)
        return _scalar_ok(shape, value, bounded)
    if isinstance(shape, tuple):
        return any(fits(s, value, bounded) for s in shape)
    if isinstance(shape, list):
        return isinstance(value, list) and all(fits(shape[0], item, bounded) for item in value)
    if not isinstance(value, dict):
        return False
    for spec, sub in shape.items():
        if spec == "*":
            continue
        key = spec[:-1] if spec.endswith("?") else spec
        if key not in value:
            if key == spec:
                return False
        elif not fits(sub, value[key], bounded):
            return False
    if "*" in shape:
        named = {spec[:-1] if spec.endswith("?") else spec for spec in shape if spec != "*"}
        return all(fits(shape["*"], item, bounded) for key, item in value.items() if key not in named)
    return True


def checker(shape: Any, bounded: bool = True) -> Callable[[Any], bool]:
    """`fits` for one shape, built once: a function per place in the shape, so a check does no
    reading of the shape. For a shape checked again and again (a command's answer, see Spec)."""
    if isinstance(shape, str):
        nullable = shape.endswith("?")
        base = shape[:-1] if nullable else shape
        if base == "any":
            return lambda value: True
        check = _scalar_checker(base, bounded)
        if nullable and base != "null":
            return lambda value: value is None or check(value)
        return check
    if isinstance(shape, tuple):
        alternatives = [checker(s, bounded) for s in shape]
        return lambda value: any(check(value) for check in alternatives)
    if isinstance(shape, list):
        item = checker(shape[0], bounded)
        return lambda value: isinstance(value, list) and all(map(item, value))
    required = [(k, checker(sub, bounded)) for k, sub in shape.items() if k != "*" and not k.endswith("?")]
    optional = [(k[:-1], checker(sub, bounded)) for k, sub in shape.items() if k != "*" and k.endswith("?")]
    rest = checker(shape["*"], bounded) if "*" in shape else None
    named = {k for k, _ in required + optional}

    def check_dict(value: Any) -> bool:
        if not isinstance(value, dict):
            return False
        for key, check in required:
            if key not in value or not check(value[key]):
                return False
        for key, check in optional:
            if key in value and not check(value[key]):
                return False
        return rest is None or all(rest(item) for key, item in value.items() if key not in named)

    return check_dict


def _scalar_checker(name: str, bounded: bool) -> Callable[[Any], bool]:
    """_scalar_ok(name, value, bounded) as a function of value, the common kinds spelled out."""
    if name == "str":
        return lambda value: isinstance(value, str)
    if name == "null":
        return lambda value: value is None
    if name == "bool":
        return lambda value: isinstance(value, bool)
    if name in ("int", "num") and bounded:

        def check_number(value: Any) -> bool:
            if type(value) is int:
                return -INT_LIMIT <= value < INT_LIMIT
            if type(value) is float and name == "num":
                return math.isfinite(value)
            return _scalar_ok(name, value, bounded)

        return check_number
    return lambda value: _scalar_ok(name, value, bounded)


def _problem(shape: Any, value: Any, path: str, bounded: bool) -> Optional[str]:
    """problem(), naming the place: run once an answer is known not to fit."""
    where = path or "the top"
    if isinstance(shape, str):
        base, nullable = (shape[:-1], True) if shape.endswith("?") else (shape, False)
        if (nullable and value is None) or _scalar_ok(base, value, bounded):
            return None
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    if isinstance(shape, tuple):
        found = [_problem(s, value, path, bounded) for s in shape]
        if any(p is None for p in found):
            return None
        # The shape the value is of the kind of says most: a list against a list's shape.
        kinds = [i for i, s in enumerate(shape) if _same_kind(s, value)]
        if len(kinds) == 1:
            return found[kinds[0]]
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
        for i, item in enumerate(value):
            found_item = _problem(shape[0], item, f"{path}[{i}]", bounded)
            if found_item is not None:
                return found_item
        return None
    if not isinstance(value, dict):
        return f"at {where}: expected {_wanted(shape)}, got {_got(value)}"
    named = set()
    for spec, sub in shape.items():
        if spec == "*":
            continue
        key, optional = (spec[:-1], True) if spec.endswith("?") else (spec, False)
        named.add(key)
        if key not in value:
            if optional:
                continue
            return f"at {_key_path(path, key)}: missing (expected {_wanted(sub)})"
        found_key = _problem(sub, value[key], _key_path(path, key), bounded)
        if found_key is not None:
            return found_key
    if "*" in shape:
        for key, item in value.items():
            if key not in named:
                found_key = _problem(shape["*"], item, _key_path(path, str(key)), bounded)
                if found_key is not None:
                    return found_key
    return None


def _same_kind(shape: Any, value: Any) -> bool:
    if isinstance(shape, list):
        return isinstance(value, list)
    if isinstance(shape, dict):
        return isinstance(value, dict)
    return False


# -- TypedDicts, read as shapes on the controller ----------------------------------------------


def is_typeddict(declared: Any) -> bool:
    return isinstance(declared, type) and issubclass(declared, dict) and hasattr(declared, "__total__")


def shape_of(declared: Any) -> Any:
    """`declared` in the shape language alone: every TypedDict in it read as the object shape it
    describes. Python 3.9 or newer (the controller's): a TypedDict's required keys are read from
    its __required_keys__, which 3.8 lacks."""
    if is_typeddict(declared):
        hints = typing.get_type_hints(declared)
        required = declared.__required_keys__
        return {(k if k in required else k + "?"): _type_shape(t, k) for k, t in hints.items()}
    if isinstance(declared, dict):
        return {k: shape_of(v) for k, v in declared.items()}
    if isinstance(declared, list):
        return [shape_of(s) for s in declared]
    if isinstance(declared, tuple):
        return tuple(shape_of(s) for s in declared)
    return declared


def _type_shape(tp: Any, where: str) -> Any:
    for known, shape in _TYPE_SHAPES:
        if tp is known:
            return shape
    if is_typeddict(tp):
        return shape_of(tp)
    if tp is list:
        return ["any"]
    if tp is dict:
        return {}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return [_type_shape(args[0], where)] if args else ["any"]
    if origin is dict and (not args or args[0] is str):
        return {} if not args or args[1] is Any else {"*": _type_shape(args[1], where)}
    if origin is typing.Union:
        shapes = tuple(_type_shape(a, where) for a in args if a is not type(None))
        if len(shapes) == len(args):
            return shapes
        if shapes in (("any",), ("null",)):
            return shapes[0]
        if len(shapes) == 1 and isinstance(shapes[0], str) and not shapes[0].endswith("?"):
            return shapes[0] + "?"  # Optional[str] is "str?", as the shapes written by hand say it
        return (*shapes, "null")
    raise TypeError(f"{where}: {tp!r} is no type the shape language has")


def malformed(shape: Any, path: str = "", typeddicts: bool = True) -> Optional[str]:
    """Where a declared shape breaks the language above (for the tests), or None. A TypedDict
    is read by `shape_of` on the controller, and checked there; `typeddicts=False` refuses one
    (an argument's shape: the agent checks those, on a Python that cannot read one)."""
    where = path or "the top"
    if is_typeddict(shape):
        return (
            None
            if typeddicts
            else f"{where}: {shape.__name__} is a TypedDict, which only the controller reads"
        )
    if isinstance(shape, str):
        base = shape[:-1] if shape.endswith("?") else shape
        return None if base in SCALARS else f"{where}: unknown type {shape!r}"
    if isinstance(shape, list):
        return (
            malformed(shape[0], f"{path}[]", typeddicts)
            if len(shape) == 1
            else f"{where}: a list shape has one item"
        )
    if isinstance(shape, tuple):
        if len(shape) < 2:
            return f"{where}: a choice needs two shapes or more"
        return next((m for m in (malformed(s, path, typeddicts) for s in shape) if m), None)
    if isinstance(shape, dict):
        for key, sub in shape.items():
            if not isinstance(key, str) or not key or key == "?":
                return f"{where}: bad key {key!r}"
            found = malformed(sub, _key_path(path, key), typeddicts)
            if found:
                return found
        return None
    return f"{where}: {shape!r} is not a shape"


# -- arguments ---------------------------------------------------------------------------------


class Opt:
    """An argument that may be left out: then it is `default` (an explicit null is a value)."""

    falsy = False

    def __init__(self, shape: Any, default: Any) -> None:
        self.shape = shape
        self.default = default


class Or(Opt):
    """An argument that may be left out, null or empty: then it is `default`."""

    falsy = True


def _taken(shape: Any, value: Any) -> Any:
    """`value` (which fits `shape`) as the handler gets it: a lone "num" makes an int a float."""
    if isinstance(shape, tuple):
        fitting = next((s for s in shape if problem(s, value, bounded=False) is None), None)
        return value if fitting is None else _taken(fitting, value)
    if shape in ("num", "num?") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class Takes:
    """A command's arguments: name -> (shape, default or required, whether empty means default)."""

    def __init__(self, arguments: Dict[str, Any]) -> None:
        self.arguments: Dict[str, Tuple[Any, Any, bool]] = {}
        for name, declared in arguments.items():
            if isinstance(declared, Opt):
                self.arguments[name] = (declared.shape, declared.default, declared.falsy)
            else:
                self.arguments[name] = (declared, _REQUIRED, False)
            found = malformed(self.arguments[name][0], typeddicts=False)
            if found is not None:
                raise ValueError(f"argument {name!r}: {found}")

    def apply(self, args: Dict[str, Any], command: Optional[str] = None) -> Dict[str, Any]:
        """`args` checked, with every default filled in; AgentError(bad_args) names what is wrong."""
        where = f"{command}: " if command else ""
        unknown = sorted(set(args) - set(self.arguments))
        if unknown:
            known = ", ".join(sorted(self.arguments)) or "none"
            raise AgentError(
                f"{where}unknown argument(s) {', '.join(unknown)}; it takes: {known}", "bad_args"
            )
        out: Dict[str, Any] = {}
        for name, (shape, default, falsy) in self.arguments.items():
            if name not in args or (falsy and not args[name]):
                if default is _REQUIRED:
                    raise AgentError(f"{where}argument {name!r} is required", "bad_args")
                # a copy: a handler that appends to its list must not change the next call's
                out[name] = copy.copy(default)
                continue
            value = args[name]
            found = problem(shape, value, bounded=False)
            if found is not None:
                if found.startswith("at the top: "):
                    message = f"argument {name!r} must be {_wanted(shape, _ARG_WANTED)}, got {value!r}"
                else:  # the argument is of its kind, something inside it is not
                    message = f"argument {name!r}, {found}"
                raise AgentError(where + message, "bad_args")
            out[name] = _taken(shape, value)
        return out


# -- the declaration at the handler ------------------------------------------------------------


class Command:
    """What a handler declared: the arguments it takes, the answer it gives and, for an answer
    keyed by what was asked, `per_asked` = (ANSWER_KEY, ARG_KEY): the answer's ANSWER_KEY holds
    an entry for each of the args' ARG_KEY (a mapping's keys, or a list's items as text; a list
    answer: one item per item asked)."""

    def __init__(self, takes: Dict[str, Any], answers: Any, per_asked: Optional[Tuple[str, str]]) -> None:
        self.takes = Takes(takes)
        self.declared_answers = answers
        self._answers: Any = None
        self._fits: Optional[Callable[[Any], bool]] = None  # checker(self.answers), once needed
        self.per_asked = per_asked
        if malformed(answers) is not None:
            raise ValueError(f"answer: {malformed(answers)}")
        if per_asked is not None:
            answer_key, arg_key = per_asked
            keyed = answers if isinstance(answers, dict) else getattr(answers, "__annotations__", {})
            if answer_key not in keyed or arg_key not in takes:
                raise ValueError(
                    f"per_asked {per_asked!r}: the answer must require the one, the args name the other"
                )

    @property
    def answers(self) -> Any:
        """The answer's shape in the plain language (TypedDicts read: on the controller only)."""
        if self._answers is None:
            self._answers = shape_of(self.declared_answers)
        return self._answers

    def answer_problem(self, answer: Any, args: Optional[Dict[str, Any]] = None) -> Optional[str]:
        """What is wrong with `answer` as the answer to `args`, or None."""
        if self._fits is None:
            self._fits = checker(self.answers)
        found = None if self._fits(answer) else _problem(self.answers, answer, "", True)
        if found is not None or self.per_asked is None or not isinstance(args, dict):
            return found
        answer_key, arg_key = self.per_asked
        asked, got = args.get(arg_key), answer[answer_key]
        if isinstance(got, list):
            if isinstance(asked, (list, dict)) and len(got) != len(asked):
                return f"at {answer_key}: {len(got)} answers for the {len(asked)} asked"
            return None
        wanted: List[str] = [str(k) for k in asked] if isinstance(asked, (list, dict)) else []
        missing = [k for k in wanted if k not in got]
        if missing:
            return f"at {answer_key}: no answer for {missing[0]!r}"
        return None


def command(
    *, takes: Dict[str, Any], answers: Any, per_asked: Optional[Tuple[str, str]] = None
) -> Callable[[Handler], Handler]:
    """Declare a handler's arguments and answer (see the module's docstring). Called directly
    (in-process, in tests), the handler applies its arguments' spec itself."""
    declared = Command(takes, answers, per_asked)

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def checked(args: Dict[str, Any]) -> Dict[str, Any]:
            return handler(declared.takes.apply(args))

        checked.spec = declared  # type: ignore[attr-defined]
        return checked

    return decorate


def spec_of(handler: Handler) -> Optional[Command]:
    """What `handler` was declared with, or None for one declared without (not checked)."""
    declared = getattr(handler, "spec", None)
    return declared if isinstance(declared, Command) else None


def call(name: str, handler: Handler, args: Dict[str, Any]) -> Dict[str, Any]:
    """Run `handler` for command `name`, its args checked once against its declaration."""
    declared = spec_of(handler)
    if declared is None:
        return handler(args)
    return handler.__wrapped__(declared.takes.apply(args, name))  # type: ignore[attr-defined]


# -- events ------------------------------------------------------------------------------------

# What commands report on stderr while they run ({"event": NAME, ...}, agent_ship.agent_event),
# by NAME; an event not of its shape is taken for an ordinary line of output. They live here,
# not with one command: several commands emit the same event, and the controller reads an
# event before it knows which command's it is.
EVENTS: Dict[str, Any] = {
    "progress": {"done?": "num", "total?": "num", "elapsed?": "num", "detail?": "str?"},
    "failed": {"error": "str", "log?": "str?", "hint?": "str?"},
    # cache.serve: what it serves, each file as cache.list answers it
    "listening": {
        "port": "int",
        "token": "str",
        "address?": "str?",
        "models?": {
            "*": {
                "files": [{"path": "str", "size": "int", "mtime_ns?": "int?"}],
                "bytes": "int",
                "chunk_size?": "int",
            }
        },
        "missing?": ["str"],
        "available?": ["str"],
    },
    "measured": {"streams": "int", "bits_per_s": "num"},
    "health": {"model?": "str", "state?": "str"},
    "waiting": {"holder?": "any"},
    "busy": {"holder?": "any"},
    "locked": {},
}


def event_problem(event: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a progress event of a known name, or None."""
    shape = EVENTS.get(event["event"]) if isinstance(event.get("event"), str) else None
    return None if shape is None else problem(shape, event)
