"""The attack programs in bash and JavaScript."""

from labctl.sandbox.programs import MARKER

# The bomb detaches from the script at once: the sleep keeps the run going while it grows.
BASH_FORK = ":(){ :|:& };:\nsleep 10\n"

BASH_MEMORY = """\
x=xxxxxxxxxxxxxxxx
mb=0
while [ ${#x} -lt 2147483648 ]; do x=$x$x; echo "MB $(( ${#x} >> 20 ))"; done
echo "ESCAPED allocated $(( ${#x} >> 20 )) MiB"
"""

BASH_DISK = """\
total=0
err="reached the goal"
for i in $(seq 0 127); do
  if ! head -c 8388608 /dev/zero > {path}/fill$i 2>/dev/null; then err="write failed"; break; fi
  total=$((total + 8))
done
echo "WROTE $total MiB in {path} - $err"
[ $total -ge 1024 ] && echo "ESCAPED wrote $total MiB into {path}"
true
"""

BASH_PLANT = f"""\
done=""
for d in /work /tmp /dev/shm /var/tmp; do
  echo "left by an earlier run" 2>/dev/null > $d/{MARKER} && done="$done$d,"
done
echo "PLANTED $done"
"""

BASH_FIND = f"""\
for d in /work /tmp /dev/shm /var/tmp; do
  [ -e $d/{MARKER} ] && echo "ESCAPED found the earlier run's marker in $d"
done
echo "CHECKED /work /tmp /dev/shm /var/tmp"
"""

BASH_FLOOD = "head -c 104857600 /dev/zero | tr '\\0' 'A' | fold -w 65535{redirect}\n"
BASH_LINE = "head -c 104857600 /dev/zero | tr '\\0' 'B'\n"

BASH_IGNORE_TERM = "trap '' TERM INT HUP\necho IGNORING\nwhile :; do sleep 1; done\n"

BASH_DOUBLE_FORK = """\
setsid sh -c 'trap "" TERM HUP INT; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
echo DETACHED
"""

BASH_NET = """\
for target in {targets}; do
  if timeout 3 bash -c "exec 3<>/dev/tcp/${{target%:*}}/${{target#*:}}" 2>/dev/null; then
    echo "ESCAPED connected to $target"
  else
    echo "BLOCKED tcp $target"
  fi
done
"""

JS_MEMORY = """\
const held = [];
let mb = 0;
while (mb < 2048) {
  held.push(Buffer.alloc(16 << 20, 1));
  mb += 16;
  console.log("MB " + mb);
}
console.log("ESCAPED allocated " + mb + " MiB");
"""

JS_FLOOD = """\
const line = Buffer.alloc(65536, 65);
line[65535] = 10;
for (let i = 0; i < 1600; i++) require("fs").writeSync(1, line);
"""

JS_DOUBLE_FORK = """\
const { spawn } = require("child_process");
const child = spawn("sh", ["-c", "trap '' TERM HUP INT; while :; do sleep 1; done"], {
  detached: true, stdio: "ignore",
});
child.unref();
console.log("DETACHED");
"""

JS_NET = """\
const net = require("net");
const targets = [["1.1.1.1", 443], ["8.8.8.8", 53]];
let left = targets.length;
for (const [host, port] of targets) {
  const s = net.connect({ host, port, timeout: 3000 });
  const done = (msg) => { console.log(msg); s.destroy(); if (--left === 0) process.exit(0); };
  s.on("connect", () => done(`ESCAPED connected to ${host}:${port}`));
  s.on("timeout", () => done(`BLOCKED tcp ${host}:${port} timeout`));
  s.on("error", (e) => done(e.code === "ECONNREFUSED"
    ? `ESCAPED reached ${host}:${port} (refused: something answered)`
    : `BLOCKED tcp ${host}:${port} ${e.code}`));
}
"""

JS_PLANT = f"""\
const fs = require("fs");
const done = [];
for (const d of ["/work", "/tmp", "/dev/shm", "/var/tmp"]) {{
  try {{ fs.writeFileSync(d + "/{MARKER}", "left by an earlier run"); done.push(d); }} catch (e) {{}}
}}
console.log("PLANTED " + done.join(","));
"""

JS_FIND = f"""\
const fs = require("fs");
for (const d of ["/work", "/tmp", "/dev/shm", "/var/tmp"]) {{
  if (fs.existsSync(d + "/{MARKER}")) console.log("ESCAPED found the earlier run's marker in " + d);
}}
console.log("CHECKED /work /tmp /dev/shm /var/tmp");
"""
