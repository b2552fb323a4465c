"""What labctl says when Ctrl-C stops a command: what was interrupted and how to carry on."""

from __future__ import annotations

from collections.abc import Sequence

# How each command carries on after Ctrl-C, by its command words.
RESUME = {
    "provision": "Run the same `labctl provision` again: it reads every host's state again and changes "
    "only what is still different.",
    "cache sync": "Run the same `labctl cache sync` again: the chunks verified so far are kept and the copy "
    "resumes from them.",
    "cache verify": "Run `labctl cache verify` again; a model taken out for repair is fetched again by "
    "`labctl cache sync`.",
    # Before the run streamed anything (preflight, the launch): what the run wrote is unknown here.
    # A run that was training says what it wrote instead (carry_on, from `labctl train`).
    "train": "What the run had started was stopped on every host. Run the same `labctl train` command "
    "again: it resumes from the newest checkpoint in its checkpoint_dir if one was written, else it "
    "starts from step 1.",
    "facts": "Run `labctl facts` again: it only reads.",
    "status": "Run `labctl status` again: it only reads (and adds one sample to each host's history).",
    "doctor": "Run `labctl doctor` again: it only reads (its network probe stops with its session).",
    "metrics": "Run `labctl metrics` again: a textfile is replaced whole or not at all.",
    "exec": "Nothing resumes by itself: run the command again where it should still happen.",
    "sim up": "Run `labctl sim up` again: it finishes from what was already made.",
}
# How a command that knows what it left behind carries on, set by it before it exits 130.
_CARRY_ON: dict[str, str] = {}
GROUPS = {"cache", "train", "bench", "sim", "inventory"}  # commands with subcommands
VALUED = {"-i", "--inventory"}  # global options that take a value


def command_words(argv: Sequence[str]) -> str:
    """`cache sync` from `-i inv.yaml --json cache sync m --host m5`."""
    words: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--":
            break
        if arg in VALUED:
            skip = True
            continue
        if arg.startswith("-"):
            if words:
                break
            continue
        words.append(arg)
        if words[0] not in GROUPS or len(words) == 2:
            break
    return " ".join(words)


def carry_on(words: str, hint: str) -> None:
    """Say how `labctl WORDS` carries on, from what it knows it left (train: the newest checkpoint
    its run logged), instead of what RESUME says for any run."""
    _CARRY_ON[words] = hint


def message(argv: Sequence[str], may_still_run: Sequence[str] = ()) -> tuple[str, str]:
    """(what was interrupted, how to carry on) for `labctl ARGV` stopped by Ctrl-C."""
    words = command_words(argv)
    what = (
        f"Interrupted (Ctrl-C): `labctl {words}` stopped before it finished."
        if words
        else "Interrupted (Ctrl-C)."
    )
    if may_still_run:
        what += (
            f" On {', '.join(may_still_run)} (Windows, where closing the session does not stop a command) "
            "the command may still be running."
        )
    else:
        what += " What it had started on the hosts was stopped with its SSH sessions."
    hint = (
        _CARRY_ON.get(words)
        or RESUME.get(words)
        or RESUME.get(words.split(" ")[0])
        or "Run the command again."
    )
    if may_still_run:
        from labctl.transport.base import still_running_hint

        hint = still_running_hint(may_still_run[0]) + " " + hint
    return what, hint


def report(argv: Sequence[str], exc: BaseException | None) -> None:
    """Print what was interrupted (stderr); with --json and no answer printed, a JSON error too."""
    import sys

    from labctl.output.console import emit_json

    interrupt = _keyboard_interrupt(exc)
    still = list(getattr(interrupt, "may_still_run", ()) or ())
    what, hint = message(argv, still)
    _CARRY_ON.clear()  # said once: a later command in this process knows its own
    json_mode = "--json" in (argv[: list(argv).index("--")] if "--" in argv else argv)
    # A command that caught Ctrl-C itself (train) has printed its own answer already.
    if json_mode and interrupt is not None:
        emit_json({"error": what, "hint": hint, "exit_code": 130, "may_still_run": still})
    sys.stderr.write(f"\n{what}\n{hint}\n")
    sys.stderr.flush()


def _keyboard_interrupt(exc: BaseException | None) -> KeyboardInterrupt | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
