"""GPU and torch facts: NVML when the bindings are installed, else nvidia-smi, else none."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple, TypedDict

from .parsers import NVIDIA_SMI_FIELDS, cuda_version_string, nccl_version_string, parse_nvidia_smi_csv
from .spec import Cap, Num


class GPU(TypedDict, total=False):
    """One GPU as this module reports it (a type, so that the orchestra's typed answers hold it;
    facts, monitor.status and train declare their answers with it)."""

    index: int
    name: Optional[str]
    uuid: Optional[str]
    memory_total_bytes: Optional[int]
    memory_used_bytes: Optional[int]
    compute_capability: Optional[Cap]
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]
    utilization_pct: Optional[Num]
    temperature_c: Optional[Num]
    power_w: Optional[Num]
    pci_bus_id: Optional[str]


NVIDIA_SMI_TIMEOUT_S = 5.0


def arch_caps(arch_list: List[str]) -> Tuple[List[Tuple[int, int]], bool]:
    """torch.cuda.get_arch_list() -> (its architectures, whether any PTX is embedded)."""
    caps: List[Tuple[int, int]] = []
    ptx = False
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_([0-9]+)([0-9])[a-z]?", a)
        if not m:
            continue
        if m.group(1) == "compute":
            ptx = True
        caps.append((int(m.group(2)), int(m.group(3))))
    return caps, ptx


def supports(archs: List[Tuple[int, int]], ptx: bool, cap: Tuple[int, int]) -> bool:
    """A cubin sm_XY runs on X.Z with Z >= Y; PTX is compiled for anything newer."""
    if any(a[0] == cap[0] and a[1] <= cap[1] for a in archs):
        return True
    return ptx and any(a <= cap for a in archs)


def runs_on(arch_list: List[str], cap: Tuple[int, int]) -> bool:
    """Whether an installed torch (its get_arch_list()) has kernels for a GPU of `cap`; a build
    that lists nothing is taken at its word (its first kernel will say)."""
    if not arch_list:
        return True
    caps, ptx = arch_caps(arch_list)
    return supports(caps, ptx, cap)


class GpuQueryError(RuntimeError):
    """NVIDIA tooling is present but did not answer: a GPU host with a broken driver must
    not look like a host with no GPUs."""


def _text(value: Any) -> str:
    # Older nvidia-ml-py returns bytes, newer returns str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _nvml_call(fn: Any, *args: Any) -> Any:
    """One NVML query; None when this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: one field, not the whole GPU
        return None


def cuda_driver_version() -> Optional[str]:
    """The CUDA version the driver supports ("12.2"), asked of libcuda without initialising it."""
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
        return cuda_version_string(version.value)
    except Exception:  # no driver, not Linux, or a stub library
        return None


def gpus_from_pynvml() -> Optional[List[Dict[str, Any]]]:
    """GPUs via NVML; None when the bindings or the NVML library are not installed."""
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        if "LibraryNotFound" in type(exc).__name__:
            return None
        raise GpuQueryError(f"NVML init failed: {exc}") from None
    try:
        driver = _nvml_call(pynvml.nvmlSystemGetDriverVersion)
        cuda_fn = getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None) or getattr(
            pynvml, "nvmlSystemGetCudaDriverVersion", None
        )
        cuda = cuda_version_string(_nvml_call(cuda_fn)) if cuda_fn else None
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = _nvml_call(pynvml.nvmlDeviceGetMemoryInfo, handle)
            capability = _nvml_call(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
            utilization = _nvml_call(pynvml.nvmlDeviceGetUtilizationRates, handle)
            pci = _nvml_call(pynvml.nvmlDeviceGetPciInfo, handle)
            name = _nvml_call(pynvml.nvmlDeviceGetName, handle)
            uuid = _nvml_call(pynvml.nvmlDeviceGetUUID, handle)
            power_fn = getattr(pynvml, "nvmlDeviceGetPowerUsage", None)  # milliwatts
            power_mw = _nvml_call(power_fn, handle) if power_fn else None
            gpus.append(
                {
                    "index": index,
                    "name": _text(name) if name is not None else None,
                    "uuid": _text(uuid) if uuid is not None else None,
                    "memory_total_bytes": int(memory.total) if memory is not None else None,
                    "memory_used_bytes": int(memory.used) if memory is not None else None,
                    "compute_capability": "{}.{}".format(*capability) if capability else None,
                    "driver_version": _text(driver) if driver is not None else None,
                    "cuda_driver_version": cuda,
                    "utilization_pct": int(utilization.gpu) if utilization is not None else None,
                    "temperature_c": _nvml_call(
                        pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
                    ),
                    "pci_bus_id": _text(pci.busId) if pci is not None else None,
                    "power_w": round(power_mw / 1000.0, 1) if power_mw is not None else None,
                }
            )
        return gpus
    finally:
        _nvml_call(pynvml.nvmlShutdown)


def _run_nvidia_smi(exe: str, fields: Tuple[str, ...]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [exe, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def gpus_from_nvidia_smi() -> Optional[List[Dict[str, Any]]]:
    """GPUs via nvidia-smi; None when it is not on PATH."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields: Tuple[str, ...] = NVIDIA_SMI_FIELDS
    try:
        proc = _run_nvidia_smi(exe, fields)
        if proc.returncode != 0 and "compute_cap" in (proc.stdout + proc.stderr):
            # Drivers before 510 do not know the compute_cap field; ask without it.
            fields = tuple(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")
            proc = _run_nvidia_smi(exe, fields)
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"nvidia-smi did not answer in {NVIDIA_SMI_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        message = (proc.stdout + proc.stderr).strip().splitlines()
        raise GpuQueryError("nvidia-smi exited {}: {}".format(proc.returncode, " ".join(message)[:300]))
    gpus = parse_nvidia_smi_csv(proc.stdout, fields)
    cuda = cuda_driver_version()
    for gpu in gpus:
        gpu["cuda_driver_version"] = cuda
    return gpus


def gather_gpus() -> Tuple[str, List[Dict[str, Any]]]:
    """(source, gpus) where source is "pynvml", "nvidia-smi" or "none".

    A failing source falls through to the next; if none answers but one of them failed, the
    failure is raised so the section records an error instead of an empty GPU list.
    """
    failures: List[str] = []
    for source, query in (("pynvml", gpus_from_pynvml), ("nvidia-smi", gpus_from_nvidia_smi)):
        try:
            gpus = query()
        except GpuQueryError as exc:
            failures.append(str(exc))
            continue
        if gpus is not None:
            return source, gpus
    if failures:
        raise GpuQueryError("; ".join(failures))
    return "none", []


def torch_facts() -> Dict[str, Any]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return {"installed": False}
    facts: Dict[str, Any] = {
        "installed": True,
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cuda_available": False,
        "device_count": 0,
        "arch_list": [],
        "nccl": None,
        "cudnn": None,
    }
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = int(torch.cuda.device_count()) if facts["cuda_available"] else 0
        facts["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception as exc:  # a CUDA build on a host whose driver is too old
        facts["cuda_error"] = f"{type(exc).__name__}: {exc}"
    try:
        if torch.version.cuda and hasattr(torch.cuda, "nccl"):
            facts["nccl"] = nccl_version_string(torch.cuda.nccl.version())
    except Exception:  # CPU-only builds have no NCCL to report
        facts["nccl"] = None
    try:
        cudnn = torch.backends.cudnn.version()
        facts["cudnn"] = int(cudnn) if cudnn else None
    except Exception:  # cudnn absent from the build
        facts["cudnn"] = None
    return facts
