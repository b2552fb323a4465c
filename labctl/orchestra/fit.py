"""Each model of the library against its engine and the orchestra's GPUs, before a host is touched.

Pure: given the orchestra file, what the storage host read of each model's files
(`modelload.describe`, possibly nothing) and the orchestra's GPUs, `check_models` says on which GPUs
each model may run, what must be refused (a format its engine does not serve, no GPU its engine
runs on) and what is only worth a note (a typed size_gb far from the files). Every refusal names
the way that works: another engine, another format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labctl.orchestra.engines import ENGINES, engine
from labctl.orchestra.engines.base import FORMAT_NAMES, Engine, fmt_cap
from labctl.orchestra.sizes import served_context

if TYPE_CHECKING:
    from labctl.orchestra.place import Gpu, GpuKey
    from labctl.orchestra.spec import ModelEntry, Orchestra

SIZE_TOLERANCE = 0.10  # a typed size_gb further than this from the files' bytes is named


@dataclass
class ModelFit:
    """One model: its format, engine, the GPUs it may run on, and what was found wrong."""

    name: str
    format: str | None
    engine: str
    context: int
    allowed: set[GpuKey] = field(default_factory=set)
    refusal: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "engine": self.engine,
            "context": self.context,
            "refusal": self.refusal,
            "notes": list(self.notes),
        }


def model_format(entry: ModelEntry, files: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(the model's format, a note where the typed `format:` and the files disagree)."""
    found = (files or {}).get("format")
    found = found if found in FORMAT_NAMES and found != "unknown" else None
    if entry.format and found and entry.format != found:
        return found, (
            f"the file says format {entry.format} but its files are {FORMAT_NAMES[found]}; "
            f"labctl goes by the files (write format: {found})"
        )
    return entry.format or found, None


def _engines_for(fmt: str | None, gpu: Gpu | None) -> list[Engine]:
    out = []
    for key in ENGINES:
        e = engine(key)
        if e.name == "command":
            continue
        if (fmt is None or e.serves(fmt)) and (gpu is None or e.runs_on(gpu.cap)):
            out.append(e)
    return out


def _format_refusal(name: str, fmt: str, eng: Engine, gpus: Sequence[Gpu]) -> str:
    fitting = _engines_for(fmt, None)
    way = (
        f"serve it with engine {fitting[0].name} ({fitting[0].title})"
        if fitting
        else "convert it to a format an engine serves"
    )
    if fmt == "gguf" and eng.name in ("labctl", "vllm"):
        way += ", or give it the model's Hugging Face folder"
    return (
        f"{name}: {eng.title} does not serve {FORMAT_NAMES[fmt]} (it serves {', '.join(eng.formats)}); {way}."
    )


def _gpu_refusal(name: str, fmt: str | None, eng: Engine, gpus: Sequence[Gpu]) -> str:
    g = gpus[0]
    need = fmt_cap(eng.min_cap)
    others = _engines_for(None, g)
    if others:
        alt = others[0]
        if fmt is not None and alt.serves(fmt):
            way = f"serve this model with engine {alt.name} ({alt.title})"
        else:
            # The engines that run there serve other formats: say which format to give it.
            pick = next((e for e in others if "gguf" in e.formats), alt)
            as_fmt = "GGUF" if "gguf" in pick.formats else pick.formats[0]
            way = f"serve this model as {as_fmt} with engine {pick.name}"
    else:
        way = "place it on a newer GPU (the orchestra file's gpus:)"
    where = f"{g.host} GPU {g.index} is a {g.model} ({fmt_cap(g.cap)})"
    if len(gpus) > 1:
        where += f", as are the orchestra's {len(gpus) - 1} other GPU(s) or older"
    return f"{name}: {eng.title} needs compute capability {need} or higher; {where}: {way}."


def check_models(
    orch: Orchestra,
    files: Mapping[str, Mapping[str, Any]],
    gpus: Sequence[Gpu],
    names: Sequence[str] | None = None,
) -> dict[str, ModelFit]:
    """{name: ModelFit} for `names` (default the library), in that order."""
    out: dict[str, ModelFit] = {}
    for name in orch.names if names is None else names:
        entry = orch.model(name)
        seen = files.get(name)
        fmt, note = model_format(entry, seen)
        eng = engine(orch.engine_name(name))
        fit = ModelFit(name, fmt, eng.name, served_context(entry.context, orch.context, seen))
        if note:
            fit.notes.append(note)
        for problem in (seen or {}).get("problems") or []:
            fit.notes.append(str(problem))
        typed = entry.weights_gb
        if seen and isinstance(seen.get("weight_bytes"), int) and typed:
            real = seen["weight_bytes"] / 1e9
            if real > 0 and abs(typed - real) / real > SIZE_TOLERANCE:
                fit.notes.append(
                    f"the file types {typed:g} GB of weights but the files hold {real:.2f} GB; "
                    "labctl plans with the files' size"
                )
        if fmt is not None and not eng.serves(fmt):
            fit.refusal = _format_refusal(name, fmt, eng, gpus)
        else:
            fit.allowed = {g.key for g in gpus if eng.runs_on(g.cap)}
            if gpus and not fit.allowed:
                oldest = sorted(gpus, key=lambda g: g.cap or (99, 0))
                fit.refusal = _gpu_refusal(name, fmt, eng, oldest)
        out[name] = fit
    return out


def refusals(fits: Mapping[str, ModelFit]) -> list[str]:
    return [f.refusal for f in fits.values() if f.refusal]
