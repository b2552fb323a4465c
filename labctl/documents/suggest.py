"""The one "Did you mean ...?" of labctl: the known name closest to a misspelt one.

Every place that refuses a name it does not know (an inventory key, a host or role in
--limit, a resource type, an orchestra model, a --set setting) words its hint with this, so
the cutoff and the sentence are the same everywhere; a site whose message puts the hint
first, or quotes the name with its path, says so through `form` and `prefix`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's default, the one every site used
TRAILING = " Did you mean '{}'?"  # after a sentence: "unknown key 'rolez'. Did you mean 'roles'?"
LEADING = "Did you mean '{}'? "  # before one: "Did you mean 'qwen-7b'? Name one of: ..."


def did_you_mean(word: object, known: Iterable[str], *, prefix: str = "", form: str = TRAILING) -> str:
    """`form` with the known name closest to `word` (after `prefix`, inside the quotes), or ""
    when none is close enough. `known` may repeat names and come in any order."""
    close = difflib.get_close_matches(str(word), list(dict.fromkeys(known)), n=1, cutoff=CUTOFF)
    return form.format(prefix + close[0]) if close else ""
