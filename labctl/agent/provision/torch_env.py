"""Host side of the `torch_env` resource: build the virtualenv under a temporary name, check it
holds the torch build the controller chose, and only then give it its name.

A CPU wheel once reached a CUDA env through the host's pip configuration (a find-links folder),
and the half-made env stayed under the final name. So pip runs isolated from that configuration
(only its network settings carry over: cert, proxy, trusted hosts, timeout, retries), the env is
built as `.NAME.partial-PID` beside its final place and renamed when verified, and a partial left
by a killed run is removed by the next one. While a step runs, progress lines go to stderr
(`{"event": "progress", "step", "elapsed", "step_elapsed", "detail"}`); what the tools printed goes
to `NAME.log` beside the env, which a failure names after its cause.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..cache.manifest import emit
from ..core import procs
from ..core.errors import AgentError
from ..core.fsutil import write_atomic, write_json

HEARTBEAT_S = 10.0  # a long step (pip downloading 2 GB) reports this often
STEP_WORDS = {
    "venv": "creating the virtualenv",
    "pip": "installing torch",
    "verify": "verifying torch",
    "done": "done",
}
# pip settings that only say how to reach an index: kept when pip is isolated from the rest.
NETWORK_FLAGS = {
    "cert": "--cert",
    "client-cert": "--client-cert",
    "proxy": "--proxy",
    "trusted-host": "--trusted-host",
    "timeout": "--timeout",
    "default-timeout": "--timeout",
    "retries": "--retries",
}
# ... and those that say where packages come from: the ones that let a stray wheel in.
SOURCE_KEYS = ("index-url", "extra-index-url", "find-links", "no-index", "constraint", "requirement")

VERIFY = r"""
import json
import torch
info = {"version": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available())}
info["arch_list"] = list(torch.cuda.get_arch_list()) if info["cuda_available"] else []
try:
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if info["cuda_available"] else None
except Exception:
    info["nccl"] = None
print("LABCTL_TORCH " + json.dumps(info))
"""

# Lines that are never the reason a step failed: warnings, traceback frames, and the text NumPy 2
# prints (with a stack) when a module built for NumPy 1.x is imported, which torch survives.
_NOISE = [
    re.compile(p)
    for p in (
        r"^\s",
        r"^Traceback \(most recent call last\)",
        r"^(\S+:\d+: )?[A-Z]\w*Warning\b",
        r"^(WARNING|DEPRECATION)\b",
        r"^\[notice\]",
        r"^A module that was compiled using NumPy 1\.x",
        r"^NumPy \S+ as it may crash",
        r"^versions of NumPy, modules must be compiled",
        r"^Some module may need to rebuild instead",
        r"^If you are a user of the module, the easiest",
        r"^downgrade to 'numpy<2'",
        r"^We expect that some modules will need time to support NumPy",
    )
]
_ERROR = re.compile(r"^(ERROR:|error:|fatal:|[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b)")


def cuda_of(build: str) -> Optional[str]:
    """torch.version.cuda of a build: None for cpu, "12.6" for cu126."""
    digits = build[2:] if build.startswith("cu") else ""
    ok = digits.isascii() and digits.isdigit() and len(digits) >= 2
    return f"{int(digits[:-1])}.{digits[-1]}" if ok else None


def _kind(cuda: Optional[str]) -> str:
    return "a CPU-only build" if cuda is None else f"built for CUDA {cuda}"


def wrong_build(info: Dict[str, Any], version: str, build: str) -> Optional[str]:
    """Why the torch `info` describes (torch.__version__ as "version", torch.version.cuda as
    "cuda" when known) is not torch `version` built for `build`; None when it is."""
    got = str(info.get("version") or "")
    public, _, local = got.partition("+")
    if not (public == version or public.startswith(version + ".")):
        return f"the env holds torch {got or 'of no version'}, not {version}"
    want = cuda_of(build)
    if (local and local != build) or ("cuda" in info and info["cuda"] != want):
        have = info["cuda"] if "cuda" in info else cuda_of(local)
        return f"the wheel pip installed is torch {got} ({_kind(have)}), not the {build} build chosen ({_kind(want)})"
    return None


def main_error(output: str) -> str:
    """The line of a tool's output that says why it failed: the last error line once warnings,
    traceback frames and NumPy's 1.x/2.x notice are left out, else the last line left."""
    lines = [
        line.rstrip()
        for line in output.splitlines()
        if line.strip() and not any(p.search(line) for p in _NOISE)
    ]
    for line in reversed(lines):
        if _ERROR.search(line):
            return re.sub(r"^(ERROR|error):\s*", "", line)[:500]
    return lines[-1][:500] if lines else "it printed nothing"


class Failed(Exception):
    def __init__(self, cause: str, hint: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint


def remove_stale_partials(parent: str, base: str) -> List[str]:
    """Partial envs of `base` (and old ones being replaced) whose builder is gone: killed, or
    its host rebooted."""
    removed = []
    # ASCII digits to the very end: what is removed must be a name this builder gave.
    pattern = re.compile(re.escape("." + base) + r"\.(partial|old)-([0-9]+)\Z")
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        m = pattern.match(name)
        if m and (int(m.group(2)) == os.getpid() or not procs.alive(int(m.group(2)))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


def pip_network_flags(settings: str) -> Tuple[List[str], List[str]]:
    """From `pip config list`'s output: the flags that carry its network settings over to an
    isolated pip, and the names of the source settings that isolation leaves out."""
    chosen: Dict[str, Tuple[bool, str]] = {}  # option -> (from the environment, value)
    ignored: List[str] = []
    for line in settings.splitlines():
        m = re.match(r"^([^.\s]+)\.([\w-]+)\s*=\s*'?(.*?)'?$", line.strip())
        if not m:
            continue
        where, key, value = m.groups()
        if key in SOURCE_KEYS and key not in ignored:
            ignored.append(key)
        flag = NETWORK_FLAGS.get(key)
        # The environment wins over files, as it does for pip itself.
        if flag and (flag not in chosen or (where == ":env:" and not chosen[flag][0])):
            chosen[flag] = (where == ":env:", value)
    flags: List[str] = []
    for flag, (_, value) in sorted(chosen.items()):
        values = value.split() if flag == "--trusted-host" else [value]
        for v in values:
            flags += [flag, v]
    return flags, ignored


class Build:
    """One build of a torch env (see the module's docstring); `run` returns what it did."""

    def __init__(self, op: Dict[str, Any]) -> None:
        self.op = op
        self.final = os.path.abspath(op["path"])
        self.parent, self.base = os.path.split(self.final)
        self.partial = os.path.join(self.parent, f".{self.base}.partial-{os.getpid()}")
        self.log_path = os.path.join(self.parent, self.base + ".log")
        self.want = f"torch {op['version']}+{op['build']}"
        self.start = time.monotonic()
        self.step = ""
        self.step_start = self.start
        self.detail = ""
        self.log: Any = None

    # -- progress ------------------------------------------------------------------------------

    def progress(self, step: Optional[str] = None, detail: str = "") -> None:
        now = time.monotonic()
        if step is not None:
            self.step, self.step_start = step, now
        self.detail = detail
        emit(
            {
                "event": "progress",
                "step": self.step,
                "what": STEP_WORDS.get(self.step, self.step),
                "elapsed": round(now - self.start, 1),
                "step_elapsed": round(now - self.step_start, 1),
                "detail": detail[:300],
            }
        )

    def run_tool(
        self, argv: List[str], timeout: float, env: Optional[Dict[str, str]] = None
    ) -> Tuple[int, str]:
        """Run `argv` (stdout and stderr together into the log), reporting every HEARTBEAT_S;
        (rc, its output). Its process stays in the agent's group: Ctrl-C on the controller
        ends it with the agent."""
        shown = " ".join("<script>" if "\n" in a else a for a in argv)
        self.log.write(f"\n$ {shown}\n")
        self.log.flush()
        out: List[str] = []
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        assert proc.stdout is not None
        stream = proc.stdout

        def read() -> None:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace")
                out.append(line)
                self.log.write(line)
                self.log.flush()
                if line.strip():
                    self.detail = line.strip()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        beat = float(self.op.get("heartbeat_s") or HEARTBEAT_S)
        finished = procs.wait_beating(proc, timeout, beat, lambda: self.progress(detail=self.detail))
        reader.join(5)
        if not finished:
            raise Failed(
                f"{STEP_WORDS[self.step]} ran past {timeout:.0f} s", "Look at the log for where it stalled."
            )
        return proc.returncode, "".join(out)

    # -- steps ---------------------------------------------------------------------------------

    def make_venv(self) -> None:
        python = self.op["python"]
        self.progress("venv", f"{python} -m venv")
        # --prompt: activate's prompt is the env's name, not the temporary one it is built under.
        rc, out = self.run_tool([python, "-m", "venv", "--prompt", self.base, self.partial], 300)
        if rc != 0:
            raise Failed(
                f"{python} -m venv failed: {main_error(out)}",
                "Install the host's venv module (apt-get install python3-venv) or set python: to an "
                "interpreter that has it.",
            )

    def pip_install(self) -> str:
        """Install torch; where pip took its wheel from (a URL or a file), as far as it said."""
        py = os.path.join(self.partial, "bin", "python")
        index = self.op.get("index_url") or ""
        env = dict(os.environ)
        argv = [py, "-m", "pip", *self.op["pip"]]
        if self.op.get("isolated"):
            self.progress("pip", f"from {index}")
            _, settings = self.run_tool([py, "-m", "pip", "config", "list"], 60)
            flags, ignored = pip_network_flags(settings)
            argv += flags
            # --isolated leaves out PIP_* variables and the user's file, PIP_CONFIG_FILE=/dev/null
            # the global and site files as well (pip still reads those under --isolated).
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
            if ignored:
                self.progress(
                    detail=f"from {index}, leaving out the host's pip settings {', '.join(ignored)}"
                )
        else:
            self.progress("pip", "with the host's pip configuration (index_url: '')")
        rc, out = self.run_tool(argv, float(self.op.get("timeout", 3600)), env)
        source = wheel_source(out)
        if rc != 0:
            where = f"from {index} (the host's pip configuration left out)" if self.op.get("isolated") else ""
            raise Failed(
                f"pip could not install {self.want}{' ' + where if where else ''}: {main_error(out)}",
                f"Check that the host reaches {index or 'its index'} and that it has torch {self.op['version']} "
                f"for this Python, or set index_url: to a mirror that does.",
            )
        return source

    def verify(self, source: str) -> Dict[str, Any]:
        op = self.op
        self.progress("verify", "importing torch")
        rc, out = self.run_tool([os.path.join(self.partial, "bin", "python"), "-c", VERIFY], 300)
        marked = [line for line in out.splitlines() if line.startswith("LABCTL_TORCH ")]
        if rc != 0 or not marked:
            raise Failed(
                f"torch does not import in the new env: {main_error(out)}",
                "A torch that does not import usually lacks a system library (the NVIDIA driver, "
                "libgomp) or clashes with one of packages:.",
            )
        info: Dict[str, Any] = json.loads(marked[-1][len("LABCTL_TORCH ") :])
        wrong = wrong_build(info, op["version"], op["build"])
        if wrong:
            came = f"; pip took it from {source}" if source else ""
            if op.get("isolated"):
                hint = (
                    f"The index {op.get('index_url')} serves the wrong build: leave index_url: unset "
                    f"to install from download.pytorch.org/whl/{op['build']}, or point it at a mirror "
                    f"of that index."
                )
            else:
                hint = (
                    "index_url: '' lets the host's pip configuration (pip.conf, PIP_FIND_LINKS, "
                    "PIP_INDEX_URL) choose the wheel: leave index_url: unset, so that labctl installs "
                    f"from download.pytorch.org/whl/{op['build']} and ignores that configuration."
                )
            raise Failed(f"{wrong}{came}", hint)
        if int(op.get("gpus") or 0) and not info.get("cuda_available"):
            raise Failed(
                f"torch {info['version']} cannot use this host's GPUs (torch.cuda.is_available() is False)",
                f"Check the NVIDIA driver with nvidia-smi: CUDA {info.get('cuda')} needs a driver that "
                "supports it; else pin an older cuda: build.",
            )
        return info

    def put_in_place(self) -> None:
        """Rename the verified env to its name (replacing an older env there), then point the
        paths it holds (script shebangs, activate) at that name."""
        old = os.path.join(self.parent, f".{self.base}.old-{os.getpid()}")
        if os.path.lexists(self.final):
            os.rename(self.final, old)
        os.rename(self.partial, self.final)
        shutil.rmtree(old, ignore_errors=True)
        was, now = self.partial.encode(), self.final.encode()
        bindir = os.path.join(self.final, "bin")
        names = [os.path.join(bindir, n) for n in sorted(os.listdir(bindir))]
        for path in [*names, os.path.join(self.final, "pyvenv.cfg")]:
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > (1 << 20):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if was in data and b"\0" not in data:
                write_atomic(path, data.replace(was, now))

    def run(self) -> str:
        op = self.op
        if os.path.lexists(self.final) and not os.path.isfile(os.path.join(self.final, "pyvenv.cfg")):
            raise Failed(
                f"{self.final} exists and is not a virtualenv; labctl does not replace it",
                "Move it away, or give the resource another path:.",
            )
        os.makedirs(self.parent, mode=0o755, exist_ok=True)
        stale = remove_stale_partials(self.parent, self.base)
        with open(self.log_path, "w") as self.log:
            if stale:
                self.log.write(f"removed partial envs a stopped run left: {', '.join(stale)}\n")
            try:
                self.make_venv()
                source = self.pip_install()
                info = self.verify(source)
                self.put_in_place()
            except BaseException:
                shutil.rmtree(self.partial, ignore_errors=True)
                raise
        python = os.path.join(self.final, "bin", "python")
        record = {**info, "python": python, "build": op["build"], "source": source}
        write_json(op["record"], record, mode=0o644)
        self.progress("done", f"{info['version']} in {self.final}")
        return f"built {self.final} with torch {info['version']}"


def wheel_source(pip_output: str) -> str:
    """Where pip took torch's wheel from, as its output says (a URL, a file, its cache)."""
    for line in pip_output.splitlines():
        m = re.match(r"^\s*(Processing|Downloading|Using cached)\s+(\S+)", line)
        if m and re.match(r"torch-\d", os.path.basename(m.group(2).split("#")[0])):
            return m.group(2) if m.group(1) != "Using cached" else "pip's cache: " + m.group(2)
    return ""


def build_op(op: Dict[str, Any]) -> str:
    """The `torch_env` apply op: build, verify and name the env. A failure says its cause first,
    then the log; progress and the failure also go out as events (see the module's docstring)."""
    build = Build(op)
    try:
        return build.run()
    except Failed as e:
        log = build.log_path if build.log is not None else ""
        emit({"event": "failed", "step": build.step, "error": e.cause, "hint": e.hint, "log": log})
        raise AgentError(f"{e.cause}." + (f" Full log: {log}" if log else ""), "torch_env") from None
