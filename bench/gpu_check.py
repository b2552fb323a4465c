"""One command that runs every GPU claim labctl makes on a real card (`make gpu-check`).

    python bench/gpu_check.py OUT_DIR                 # on a GPU machine: every section, ~5 minutes
    python bench/gpu_check.py OUT_DIR --only loader   # some sections
    python bench/gpu_check.py OUT_DIR                 # without a GPU: prints the plan, exits 0
    python bench/gpu_check.py OUT_DIR --smoke         # without a GPU: the same code paths on the CPU, small
    python bench/gpu_check.py --record docs/benchmarks.md OUT_DIR/gpu_check.json

It writes OUT_DIR/gpu_check.json (every figure, after each section, so a run cut short still
leaves what it measured), OUT_DIR/gpu_check.md (the tables) and OUT_DIR/gpu_check.log (every
command it ran, with its output). No SSH: the lab is one `connection: local` host, and the
agent runs from its zipapp as on any host. `--record` copies a GPU run's tables into
docs/benchmarks.md under a heading naming the card and the date; figures there come only
from this script.

Exit code: 0 every section ran and met its goals (or the plan was printed); 1 a section
failed or missed a goal (the JSON and the table say which, and by how much).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpucheck.base import CheckEnv, Section, write_inventory

# Order: the headline claim first, so a run cut short still has it.
SECTIONS = ["loader", "trainer", "orchestra", "orchestra_hf", "nvml", "torch_choice"]
BUDGET_S = 480  # the 8 minutes on one card
# Rough seconds each section takes on an H100; a section is skipped (and said) when less is left.
EXPECTED_S = {
    "loader": 90,
    "trainer": 150,
    "orchestra": 110,
    "orchestra_hf": 60,
    "nvml": 60,
    "torch_choice": 15,
}
BEGIN = "<!-- gpu-check {card} begin -->"
END = "<!-- gpu-check {card} end -->"


def gpu() -> tuple[dict[str, Any], str]:
    """(the card as torch sees it, or {}), and why there is none."""
    try:
        import torch
    except ImportError:
        return {}, "torch is not installed in this Python"
    if not torch.cuda.is_available():
        return {}, f"torch {torch.__version__} sees no GPU"
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 1e9, 1),
        "cc": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "count": torch.cuda.device_count(),
    }, ""


def plan_text(names: list[str]) -> str:
    lines = []
    for n in names:
        mod = importlib.import_module(f"bench.gpucheck.{n}")
        lines.append(f"{mod.TITLE}:")
        lines += [f"  - {p}" for p in mod.PLAN]
    return "\n".join(lines)


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def only(doc: dict[str, Any]) -> list[str]:
    """The sections a run of some (--only) ran; [] for a run of all."""
    if "only" in doc:
        return list(doc["only"] or [])
    ran = [s["key"] for s in doc["sections"]]
    return [] if len(ran) == len(SECTIONS) else ran


def markdown(doc: dict[str, Any]) -> str:
    card = doc.get("gpu") or {}
    some = f" (only {', '.join(only(doc))})" if only(doc) else ""
    title = f"## GPU check on {card.get('name', 'no GPU (CPU smoke run)')}, {doc['date']}{some}"
    out = [
        title,
        "",
        f"`make gpu-check` (bench/gpu_check.py), {doc['machine']}; torch {card.get('torch')}, CUDA "
        f"{card.get('cuda')}, driver {doc.get('driver')}, compute capability {card.get('cc')}. "
        f"{doc['seconds']:.0f} s in all.",
    ]
    if doc.get("smoke"):
        out.append("CPU smoke run: the code paths only; none of these figures is a GPU figure.")
    for s in doc["sections"]:
        out += ["", f"### {s['title']}" + ("" if s["ok"] else " (FAILED)"), ""]
        out += ["| check | figure | against |", "| --- | --- | --- |"]
        out += [
            f"| {a} | {b} | {c} |"
            for a, b, c in (tuple(str(x).replace("|", "/") for x in r) for r in s["rows"])
        ]
        for g in s["goals"]:
            verdict = "met" if g["met"] else "MISSED"
            if g["unit"] == "bool":  # a yes/no goal: the verdict is the figure
                out.append(f"\nGoal, {g['why'] or g['name']}: **{verdict}**.")
                continue
            value = "n/a" if g["value"] is None else f"{g['value']:.2f}{g['unit']}"
            out.append(
                f"\nGoal, {g['why'] or g['name']}: {value} against {g['target']}{g['unit']}: **{verdict}**."
            )
        for k in s["skipped"]:
            out.append(f"\nSkipped: {k['what']}: {k['why']}")
        if s["error"]:
            out.append(f"\nError: `{s['error'].strip().splitlines()[0][:300]}`")
    return "\n".join(out) + "\n"


def record(benchmarks: Path, result: Path) -> int:
    doc = json.loads(result.read_text())
    if doc.get("dry_run") or doc.get("smoke") or not doc.get("gpu"):
        print(f"{result} is not a GPU run: nothing recorded", file=sys.stderr)
        return 2
    from bench.common import update_section

    card = re.sub(r"[^a-z0-9]+", "-", doc["gpu"]["name"].lower()).strip("-")
    if only(doc):  # a run of some sections has its own place beside the card's full run
        card += "-only-" + "-".join(only(doc))
    begin, end = BEGIN.format(card=card), END.format(card=card)
    update_section(benchmarks, f"{begin}\n{markdown(doc)}{end}", begin, end)
    print(f"recorded {doc['gpu']['name']} ({doc['date']}) in {benchmarks}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "out", type=Path, help="folder for gpu_check.json/.md/.log (with --record: the JSON to copy)"
    )
    ap.add_argument("--only", help=f"comma-separated sections, of {', '.join(SECTIONS)}")
    ap.add_argument(
        "--smoke", action="store_true", help="no GPU: run the code paths on the CPU at small sizes"
    )
    ap.add_argument(
        "--work", type=Path, help="scratch folder for the checkpoint and models (default: a temp dir)"
    )
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    ap.add_argument(
        "--record", type=Path, metavar="BENCHMARKS_MD", help="copy a GPU run's tables into this file"
    )
    args = ap.parse_args()
    if args.record:
        return record(args.record, args.out)

    names = SECTIONS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SECTIONS]
        if unknown:
            ap.error(f"unknown section {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    card, why = gpu()
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        "gpu": card or None,
        "smoke": bool(args.smoke and not card),
        "only": names if args.only else None,
        "sections": [],
        "seconds": 0.0,
    }
    if not card and not args.smoke:
        print(f"No GPU here ({why}): this is what `make gpu-check` checks on one:\n")
        print(plan_text(names))
        print(f"\nNothing was run. On a GPU machine: python bench/gpu_check.py {args.out}")
        doc.update(
            dry_run=True,
            reason=why,
            plan={n: importlib.import_module(f"bench.gpucheck.{n}").PLAN for n in names},
        )
        (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1))
        return 0

    work = args.work or Path(tempfile.mkdtemp(prefix="labctl-gpucheck-"))
    work.mkdir(parents=True, exist_ok=True)
    env = CheckEnv(
        out=args.out,
        work=work,
        device="cuda" if card else "cpu",
        smoke=not card,
        gpu=card,
        log_file=args.out / "gpu_check.log",
    )
    env.log_file.write_text("")  # type: ignore[union-attr]
    doc["driver"] = driver_version()
    write_inventory(env)
    start = time.monotonic()
    for name in names:
        left = args.budget - (time.monotonic() - start)
        if left < EXPECTED_S[name] * 0.5:
            sec = Section(name, name)
            sec.error = f"not run: {left:.0f} s of the {args.budget:.0f} s budget left, it needs about {EXPECTED_S[name]} s"
            doc["sections"].append(sec.to_json())
            continue
        mod = importlib.import_module(f"bench.gpucheck.{name}")
        env.log(f"== {mod.TITLE}")
        t0 = time.monotonic()
        try:
            sec = mod.run(env)
        except Exception as exc:
            sec = Section(name, mod.TITLE)
            sec.error = f"{type(exc).__name__}: {exc}"
            env.log(traceback.format_exc())
        sec.seconds = time.monotonic() - t0
        result = sec.to_json()
        if env.smoke:
            result["ok"] = sec.error is None  # CPU figures against GPU goals mean nothing
        env.log(
            f"== {name}: {'ok' if result['ok'] else 'FAILED'} in {sec.seconds:.0f} s"
            + (f": {sec.error}" if sec.error else "")
        )
        doc["sections"].append(result)
        doc["seconds"] = time.monotonic() - start
        (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
    doc["seconds"] = time.monotonic() - start
    doc["ok"] = all(s["ok"] for s in doc["sections"])
    (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
    md = markdown(doc)
    (args.out / "gpu_check.md").write_text(md)
    print(md)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
