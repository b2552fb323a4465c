"""Run one program against all its tests in one fresh container: the sandbox service's unit.

A program never shares a container with another program (each comes from the pool, is used
once and killed), but its tests share its container, so a program with ten tests costs one
container and one exec, not ten of each: container churn is what bounds the pool's throughput
on a small machine. Between two tests the runner kills every process the previous test left
(setsid or not: it sweeps the container's whole pid namespace but its init, the init's idle
child and itself) and empties /tmp, so one test's leftovers never see the next test's input.

Each test's stdout and stderr go to files, and the runner writes them to the exec's stdout
framed by their lengths once the test and its leftovers are gone; the host reads the frames
strictly, and output that does not parse is the program's failure, never a wrong pass.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from ..core.errors import AgentError
from .docker import Client, DockerError
from .pool import Pool
from .runner import (
    GONE_STATUSES,
    INLINE_MAX,
    INLINE_SCRIPT,
    _exec,
    _Gone,
    _oom_killed,
    _outcome,
    _output,
    _payload,
    _prepare,
    _put,
    _text,
    run_one,
)

MAX_TESTS = 64
SLACK_S = 10.0  # the exec's own limit on top of its tests' time limits
DIR = "/work/.labctl"  # the tests' stdins and each test's output, beside the program's files
FRAME = b"LABCTL-TEST "
SETUP_FAILED = 125  # the runner's own exit when it cannot write the inputs: not the program's doing
WRITE_FAILED = "could not write into the sandbox container"

# $1 timeout  $2 output cap  $3 tests  $4 "1" when the stdins follow as arguments; then the
# stdins, "--", and the program's command. Sweeps before the first test too: nothing but the
# container's init and its idle child may run when a test starts.
RUNNER = r"""
t=$1 cap=$2 n=$3 inline=$4; shift 4
d=/work/.labctl
mkdir -p $d || exit 125
i=0
if [ "$inline" = 1 ]; then
  while [ $i -lt $n ]; do printf '%s' "$1" > $d/in.$i || exit 125; shift; i=$((i+1)); done
fi
[ "$1" = -- ] || exit 125
shift
keep=" 1 $$ "
for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || keep="$keep$p "; done
sweep() {
  r=0
  while [ $r -lt 100 ]; do
    hit=0
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      case "$keep" in *" $p "*) continue;; esac
      kill -9 "$p" 2>/dev/null && hit=1
    done
    [ $hit = 0 ] && break
    r=$((r+1))
  done
  for f in /tmp/* /tmp/.[!.]* /tmp/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null
    break
  done
}
i=0
while [ $i -lt $n ]; do
  read s _ < /proc/uptime
  timeout -s KILL "$t" "$@" < $d/in.$i > $d/out 2> $d/err
  c=$?
  read e _ < /proc/uptime
  sweep
  [ -f $d/out ] && [ ! -L $d/out ] || { rm -rf $d/out; : > $d/out; }
  [ -f $d/err ] && [ ! -L $d/err ] || { rm -rf $d/err; : > $d/err; }
  printf 'LABCTL-TEST %s %s %s %s %s\n' $i $c $(( (${e%.*}${e#*.} - ${s%.*}${s#*.}) * 10 )) $(stat -c %s $d/out $d/err)
  head -q -c $cap $d/out $d/err
  i=$((i+1))
done
"""


def _inline(data: bytes) -> Optional[str]:
    """`data` as an argument Docker carries unchanged (UTF-8 text without NUL), else None."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_frames(raw: bytes, n: int, cap: int) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """The tests' outcomes from the runner's stdout, in order: (outcomes, problem). Stops at
    the first frame out of place (the problem says where); the caller marks the rest unrun."""
    found: List[Dict[str, Any]] = []
    pos = 0
    for i in range(n):
        if pos == len(raw):
            return found, None  # the exec ended early (killed at its deadline)
        end = raw.find(b"\n", pos)
        head = raw[pos:end].split(b" ") if raw.startswith(FRAME, pos) and end > 0 else []
        if len(head) != 6 or head[1] != str(i).encode() or not all(f.isdigit() for f in head[2:]):
            return found, f"test {i}'s result frame is garbled"
        code, ms, out_n, err_n = (int(f) for f in head[2:])
        take_out, take_err = min(out_n, cap), min(err_n, cap)
        body = raw[end + 1 : end + 1 + take_out + take_err]
        if len(body) != take_out + take_err:
            return found, f"test {i}'s output is cut short"
        pos = end + 1 + take_out + take_err
        found.append(
            {
                "code": code,
                "wall_ms": ms,
                "stdout": body[:take_out],
                "stderr": body[take_out:],
                "truncated": out_n > cap or err_n > cap,
            }
        )
    if pos != len(raw):
        return found, "the runner wrote more than its tests' results"
    return found, None


def matches(stdout: str, expect: str) -> bool:
    """Judge-style comparison: lines equal once trailing spaces and trailing blank lines go."""

    def norm(text: str) -> List[str]:
        lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return norm(stdout) == norm(expect)


def run_tests(
    client: Client, pool: Pool, spec: Dict[str, Any], prog: Dict[str, Any], limits: Dict[str, Any]
) -> Dict[str, Any]:
    """{lang, stage, compile, tests: [{ok, exit_code, stdout, stderr, timed_out, truncated,
    wall_ms}], passed, total, oom_killed, latency_ms} for `prog` = {lang, source, tests:
    [{stdin, expect}], timeout}: one claimed container, every test in it."""
    return run_one(client, pool, spec, prog, limits, _run_claimed)


def _run_claimed(
    client: Client, pool: Pool, spec: Dict[str, Any], prog: Dict[str, Any], limits: Dict[str, Any]
) -> Dict[str, Any]:
    tests = prog.get("tests") or []
    timeout = float(prog.get("timeout") or limits["timeout_s"])
    cap = int(limits["output_bytes"])
    env = [f"{k}={v}" for k, v in sorted((spec.get("env") or {}).items())]
    result: Dict[str, Any] = {
        "lang": prog["lang"],
        "stage": "run",
        "tests": [],
        "passed": 0,
        "total": len(tests),
        "oom_killed": False,
    }
    name, warm = pool.claim()
    try:
        source = _payload(prog, "source") or b""
        path = "/work/" + spec["file"]
        stdins = [_payload(t, "stdin") or b"" for t in tests]
        texts = [_inline(s) for s in stdins]
        inline = all(t is not None for t in texts) and sum(len(s) for s in stdins) <= INLINE_MAX
        src_text = _inline(source) if len(source) <= INLINE_MAX else None
        prefix: List[str] = []  # the source written by the exec that first needs it
        if src_text is not None:
            prefix = ["sh", "-c", INLINE_SCRIPT, src_text, path]
        else:
            _put(client, name, path, source, env, WRITE_FAILED)
        if spec.get("compile"):
            t0 = time.monotonic()
            cmd = [*prefix, *spec["compile"]]
            code, out, err, trunc, late = _exec(client, name, cmd, env, None, cap, t0 + timeout)
            if late or code != 0:
                result.update(stage="compile", compile=_outcome(code, out, err, trunc, late, t0))
                return result
            prefix = []
        if not inline:
            _prepare(client, name, ["mkdir", "-p", DIR], env, None, "could not prepare the sandbox container")
            for i, data in enumerate(stdins):
                _put(client, name, f"{DIR}/in.{i}", data, env, WRITE_FAILED)
        args = [str(timeout), str(cap), str(len(tests)), "1" if inline else "0"]
        if inline:
            args += [t or "" for t in texts]
        cmd = [*prefix, "sh", "-c", RUNNER, "sh", *args, "--", *spec["run"]]
        t0 = time.monotonic()
        budget = len(tests) * (timeout + 1.0) + SLACK_S
        code, out, err, _, late = _exec(
            client, name, cmd, env, None, len(tests) * (2 * cap + 128) + 4096, t0 + budget
        )
        frames, problem = parse_frames(out, len(tests), cap)
        if code == SETUP_FAILED and not frames:
            raise AgentError(
                f"the sandbox's test runner failed (exit {code}): {_text(err).strip()[:300]}",
                "sandbox_failed",
            )
        for i, test in enumerate(tests):
            if i < len(frames):
                f = frames[i]
                timed_out = f["code"] == 137 and f["wall_ms"] >= timeout * 1000 - 50
                one: Dict[str, Any] = {"exit_code": f["code"]}
                one.update(_output("stdout", f["stdout"]))
                one.update(_output("stderr", f["stderr"]))
                one.update(truncated=f["truncated"], timed_out=timed_out, wall_ms=f["wall_ms"])
            else:
                why = problem or (
                    "not run: the program's time ran out"
                    if late
                    else "not run: the test runner ended early (a test may have killed it)"
                )
                one = {
                    "exit_code": None,
                    "stdout": "",
                    "stderr": why,
                    "truncated": False,
                    "timed_out": bool(late),
                    "wall_ms": 0,
                }
            expect = test.get("expect")
            one["ok"] = (
                one["exit_code"] == 0
                and not one["truncated"]
                and (expect is None or matches(one["stdout"], str(expect)))
            )
            result["tests"].append(one)
        result["passed"] = sum(1 for t in result["tests"] if t["ok"])
        killed = [t for t in result["tests"] if t["exit_code"] == 137 and not t["timed_out"]]
        if killed and not late:
            result["oom_killed"] = _oom_killed(client, name)
        return result
    except DockerError as e:
        if e.status in GONE_STATUSES:
            raise _Gone(str(e)) from None
        raise
    finally:
        pool.release(name)
        result["warm"] = warm
