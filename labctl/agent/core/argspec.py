"""What each agent command takes, declared next to its handler and checked once on dispatch.

    @takes(cache=str, models=Or(list, []), force=Opt(bool, False))
    def evict_command(args): ...

Each keyword names one argument; its value says what the argument must be:

- a type (or a tuple of types): required, of that type;
- `Opt(type, default)`: may be left out, and then is `default`;
- `Or(type, default)`: may be left out, null or empty (0, "", [], {}, false), and then is
  `default`: the old `args.get(name) or default`.

Types are JSON's: str, int, float (an int is taken and made a float), bool, list, dict;
`None` in a tuple allows null, and `object` takes anything (where the handler checks the value
itself with a more precise message). An argument the spec does not name is refused.

`commands.call` checks the args once, with the command's name in the message, and calls the
handler with every default applied: the handler reads `args["name"]`. A refusal is
AgentError(kind="bad_args"), never a KeyError or TypeError deep in the handler. A handler
called directly (in-process, in tests) applies its spec itself.

Standard library only (Python 3.8).
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Dict, Optional, Tuple, Union

from .errors import AgentError

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]
TypeSpec = Union[type, None, Tuple[Any, ...]]

_REQUIRED = object()

# A number passed on as sent (an int stays an int); `float` alone makes an int a float.
NUMBER = (int, float)
NUMBER_OR_NULL = (int, float, None)

_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


class Opt:
    """An argument that may be left out: then it is `default` (an explicit null is a value)."""

    falsy = False

    def __init__(self, types: TypeSpec, default: Any) -> None:
        self.types = types
        self.default = default


class Or(Opt):
    """An argument that may be left out, null or empty: then it is `default`."""

    falsy = True


def _types(types: TypeSpec) -> Tuple[Any, ...]:
    found = types if isinstance(types, tuple) else (types,)
    return tuple(type(None) if t is None else t for t in found)


def _describe(types: Tuple[Any, ...]) -> str:
    return " or ".join(_NAMES.get(t, t.__name__) for t in types)


def _convert(value: Any, types: Tuple[Any, ...]) -> Tuple[bool, Any]:
    """(fits, value as the handler gets it)."""
    if object in types:
        return True, value
    if isinstance(value, bool):  # JSON's true is not a number, though Python's bool is an int
        return bool in types, value
    if isinstance(value, int) and int not in types and float in types:
        return True, float(value)
    return isinstance(value, types), value


class Spec:
    """A command's arguments: name -> (types, default or required, whether empty means default)."""

    def __init__(self, **arguments: Any) -> None:
        self.arguments: Dict[str, Tuple[Tuple[Any, ...], Any, bool]] = {}
        for name, declared in arguments.items():
            if isinstance(declared, Opt):
                self.arguments[name] = (_types(declared.types), declared.default, declared.falsy)
            else:
                self.arguments[name] = (_types(declared), _REQUIRED, False)

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
        for name, (types, default, falsy) in self.arguments.items():
            if name not in args or (falsy and not args[name]):
                if default is _REQUIRED:
                    raise AgentError(f"{where}argument {name!r} is required", "bad_args")
                # a copy: a handler that appends to its list must not change the next call's
                out[name] = copy.copy(default)
                continue
            fits, value = _convert(args[name], types)
            if not fits:
                raise AgentError(
                    f"{where}argument {name!r} must be {_describe(types)}, got {args[name]!r}",
                    "bad_args",
                )
            out[name] = value
        return out


def takes(**arguments: Any) -> Callable[[Handler], Handler]:
    """Declare a handler's arguments (see the module's docstring)."""
    spec = Spec(**arguments)

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def checked(args: Dict[str, Any]) -> Dict[str, Any]:
            return handler(spec.apply(args))

        checked.argspec = spec  # type: ignore[attr-defined]
        return checked

    return decorate


def spec_of(handler: Handler) -> Optional[Spec]:
    """The spec `handler` was declared with, or None for one declared without (not checked)."""
    spec = getattr(handler, "argspec", None)
    return spec if isinstance(spec, Spec) else None


def call(command: str, handler: Handler, args: Dict[str, Any]) -> Dict[str, Any]:
    """Run `handler` for `command`, its args checked once against its spec."""
    spec = spec_of(handler)
    if spec is None:
        return handler(args)
    return handler.__wrapped__(spec.apply(args, command))  # type: ignore[attr-defined]
