"""Load safetensors files into torch tensors on a device, as fast as the machine allows.

The header is parsed here (stdlib json + struct); torch is imported inside the functions.
Every file becomes one buffer on its device and every tensor a view into it, so the bytes
are copied exactly once on the way (page cache -> host memory, or page cache -> pinned host
ring -> GPU) and the result is bit-identical to `safetensors.torch.load_file`.

CPU: the data section is read by `readers` threads with `os.preadv` into disjoint slices of
one anonymous private mapping advised for transparent huge pages. On a fresh buffer most of
the cost of a copy is faulting its pages in; with 2 MiB pages there are 512x fewer faults
(on the 2-core dev VM, back to back: about 10 GB/s against 3 GB/s into a plain
`torch.empty`). The reads release the GIL, so the threads copy in parallel. `zero_copy=True`
maps the file instead: nothing copied, tensors share the page cache's pages.

CUDA: one device allocation per file. Reader threads fill the slots of a pinned host ring
(`pread` straight into pinned memory, no staging copy); the calling thread issues each
slot's host-to-device copy on one of `streams` CUDA streams and records an event; a reader
refilling that slot first waits for its event. Reading the next slots thus overlaps the
copies of the previous ones. The pinned ring is kept between calls: pinning is slow.
"""

from __future__ import annotations

import json
import mmap
import os
import queue
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:
    import torch

# safetensors dtype -> (torch attribute, element size). Types this torch lacks are skipped
# when the table is resolved, and a file using them gets a clear error.
DTYPES: Dict[str, Tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
}

MAX_HEADER = 100 << 20  # safetensors' own limit; a larger length means a corrupt or foreign file
HUGE_PAGE = 2 << 20
READ_CHUNK = 256 << 20  # one preadv() at most: Linux caps a read near 2 GiB anyway
INDEX_NAME = "model.safetensors.index.json"


class FormatError(ValueError):
    """The file is not a valid safetensors file (the message names the file and the field)."""


class TensorInfo:
    __slots__ = ("begin", "dtype", "end", "name", "shape")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], begin: int, end: int) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.begin = begin
        self.end = end


class Header:
    """A parsed safetensors header: where the data section starts and each tensor's place in it."""

    def __init__(
        self, path: str, data_start: int, data_bytes: int, tensors: List[TensorInfo], metadata: Dict[str, str]
    ) -> None:
        self.path = path
        self.data_start = data_start
        self.data_bytes = data_bytes
        self.tensors = tensors
        self.metadata = metadata


def read_header(path: str) -> Header:
    """Parse and check the header of the safetensors file at `path` (stdlib only)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FormatError(f"{path}: too short for a safetensors file ({len(raw)} bytes)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise FormatError(f"{path}: header length {length} is over {MAX_HEADER}: not a safetensors file")
        text = f.read(length)
        file_size = os.fstat(f.fileno()).st_size
    if len(text) != length:
        raise FormatError(f"{path}: header cut short ({len(text)} of {length} bytes)")
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{path}: header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    data_start = 8 + length
    data_bytes = file_size - data_start
    metadata = header.pop("__metadata__", None) or {}
    tensors = []
    for name, entry in header.items():
        try:
            dtype = entry["dtype"]
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (TypeError, KeyError, ValueError) as exc:
            raise FormatError(f"{path}: tensor {name!r}: bad entry {entry!r} ({exc})") from None
        if dtype not in DTYPES:
            raise FormatError(f"{path}: tensor {name!r}: unknown dtype {dtype!r}")
        numel = 1
        for s in shape:
            if s < 0:
                raise FormatError(f"{path}: tensor {name!r}: negative dimension in {list(shape)}")
            numel *= s
        if not 0 <= begin <= end <= data_bytes:
            raise FormatError(
                f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] outside the {data_bytes}-byte data section"
            )
        if end - begin != numel * DTYPES[dtype][1]:
            raise FormatError(
                f"{path}: tensor {name!r}: {end - begin} bytes for {dtype} {list(shape)} "
                f"(needs {numel * DTYPES[dtype][1]})"
            )
        tensors.append(TensorInfo(name, dtype, shape, begin, end))
    # Trailing bytes after the last tensor are not ours to read (and not worth a copy).
    used = max((t.end for t in tensors), default=0)
    return Header(path, data_start, used, tensors, metadata)


def _torch_dtype(torch: Any, name: str, path: str) -> Any:
    dtype = getattr(torch, DTYPES[name][0], None)
    if dtype is None:
        raise FormatError(f"{path}: dtype {name} is not supported by torch {torch.__version__}")
    return dtype


def _carve(torch: Any, buf: Any, header: Header) -> Dict[str, Any]:
    """Tensors as views into `buf` (the data section); a misaligned tensor gets its own copy.

    `Tensor.view(dtype)` needs the byte offset to be a multiple of the element size. Files
    written by safetensors are aligned (sorted by alignment, header padded to 8); a hand-made
    file may not be, and copying just those tensors keeps the result correct.
    """
    out: Dict[str, Any] = {}
    for t in header.tensors:
        dtype = _torch_dtype(torch, t.dtype, header.path)
        size = DTYPES[t.dtype][1]
        if t.begin == t.end:
            # An empty tensor at offset 0 still shares the storage (its offset may be misaligned).
            out[t.name] = buf[:0].view(dtype).reshape(t.shape)
        elif t.begin % size == 0:
            out[t.name] = buf[t.begin : t.end].view(dtype).reshape(t.shape)
        else:
            own = torch.empty(t.shape, dtype=dtype, device=buf.device)
            own.reshape(-1).view(torch.uint8).copy_(buf[t.begin : t.end])
            out[t.name] = own
    return out


def _host_buffer(torch: Any, nbytes: int) -> Tuple[Any, memoryview]:
    """A writable CPU uint8 tensor of `nbytes` and a memoryview of the same memory.

    An anonymous *private* mapping (a shared one lives in shmem, where THP is usually off)
    advised MADV_HUGEPAGE, started on a 2 MiB boundary so every page can be a huge one. The
    tensor keeps the mapping alive (torch.frombuffer holds a reference to it).
    """
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8), memoryview(bytearray())
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if not flags or not hasattr(mmap.mmap, "madvise"):
        buf = torch.empty(nbytes, dtype=torch.uint8)
        return buf, memoryview(buf.numpy()).cast("B")
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:
            pass  # THP off in this kernel: 4 KiB pages, still correct
    whole = torch.frombuffer(m, dtype=torch.uint8)
    pad = -whole.data_ptr() % HUGE_PAGE
    return whole[pad : pad + nbytes], memoryview(m)[pad : pad + nbytes]


def _pread_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    """Fill `view` from file offset `offset`; a short file is an error, never zeros."""
    done = 0
    total = len(view)
    while done < total:
        n = os.preadv(fd, [view[done : min(total, done + READ_CHUNK)]], offset + done)
        if n == 0:
            raise FormatError(f"{path}: file ends {total - done} bytes early (truncated while loading?)")
        done += n


def _split(total: int, parts: int, align: int) -> List[Tuple[int, int]]:
    """`parts` contiguous ranges covering [0, total), inner boundaries on `align`."""
    step = -(-total // parts)
    step += -step % align
    return [(a, min(total, a + step)) for a in range(0, total, step)]


def _read_parallel(path: str, start: int, view: memoryview, readers: int) -> float:
    """Read len(view) bytes of `path` from `start` into `view` with `readers` threads.

    Returns the seconds spent reading. Each thread fills its own 2 MiB-aligned range, so
    no two threads fault the same huge page.
    """
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        ranges = (
            _split(len(view), max(1, readers), HUGE_PAGE) if len(view) >= 4 * HUGE_PAGE else [(0, len(view))]
        )
        if len(ranges) == 1 or not hasattr(os, "preadv"):
            if hasattr(os, "preadv"):
                _pread_into(fd, view, start, path)
            else:  # no pread (Windows): one sequential read
                with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                    f.seek(start)
                    if f.readinto(view) != len(view):
                        raise FormatError(f"{path}: file ends early (truncated while loading?)")
        else:
            errors: List[BaseException] = []

            def work(a: int, b: int) -> None:
                try:
                    _pread_into(fd, view[a:b], start + a, path)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=r, daemon=True) for r in ranges]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if errors:
                raise errors[0]
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _load_cpu(torch: Any, header: Header, readers: int, stats: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    buf, view = _host_buffer(torch, header.data_bytes)
    try:
        read_s = _read_parallel(header.path, header.data_start, view, readers)
    finally:
        view.release()
    if stats is not None:
        stats["read_seconds"] = stats.get("read_seconds", 0.0) + read_s
    return _carve(torch, buf, header)


def _load_mmap(torch: Any, header: Header) -> Dict[str, Any]:
    """Zero-copy: tensors are views of a private (copy-on-write) mapping of the file.

    Nothing is copied: the pages are the page cache's own (a tmpfs RAM cache costs no second
    copy of the model), and writing to a tensor copies just that page. The pages are
    mapped up front (MADV_POPULATE_READ where the kernel has it, else one read per page), so
    the load costs what it costs and the first forward pass does not pay for it.
    """
    if header.data_bytes == 0:
        return _carve(torch, torch.empty(0, dtype=torch.uint8), header)
    with open(header.path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    populated = False
    try:
        m.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))  # 22: Linux >= 5.14, absent from older Pythons
        populated = True
    except (OSError, ValueError, AttributeError):
        pass
    whole = torch.frombuffer(m, dtype=torch.uint8)
    buf = whole[header.data_start : header.data_start + header.data_bytes]
    if not populated:
        buf[:: mmap.PAGESIZE].sum()  # read one byte per page: maps every page without writing
    return _carve(torch, buf, header)


class _Ring:
    """Pinned host memory cut into slots (page-aligned views, memoryviews for preadv)."""

    def __init__(self, torch: Any, nbytes: int, slots: int) -> None:
        self.nbytes = nbytes
        # 64 KiB multiples keep every slot page-aligned (O_DIRECT-friendly, fast DMA).
        self.slot_bytes = max(1 << 16, (nbytes // slots) & ~0xFFFF)
        self.buf = torch.empty(self.slot_bytes * slots, dtype=torch.uint8, pin_memory=True)
        self.slots = [self.buf[i * self.slot_bytes : (i + 1) * self.slot_bytes] for i in range(slots)]
        self.views = [memoryview(s.numpy()).cast("B") for s in self.slots]


_RINGS: Dict[Tuple[int, int], List[_Ring]] = {}
_RINGS_LOCK = threading.Lock()


def _take_ring(torch: Any, nbytes: int, slots: int) -> _Ring:
    """A cached ring of this size, or a new one (two loads at once each get their own)."""
    with _RINGS_LOCK:
        free = _RINGS.get((nbytes, slots))
        if free:
            return free.pop()
    return _Ring(torch, nbytes, slots)


def _give_ring(ring: _Ring) -> None:
    with _RINGS_LOCK:
        _RINGS.setdefault((ring.nbytes, len(ring.slots)), []).append(ring)


def release_pinned() -> None:
    """Drop the cached pinned rings (their memory returns to torch's pinned-memory cache)."""
    with _RINGS_LOCK:
        _RINGS.clear()


def pipeline(
    path: str,
    data_start: int,
    total: int,
    slots: List[memoryview],
    readers: int,
    submit: Callable[[int, int, int, int], None],
    wait: Callable[[int], None],
) -> float:
    """Stream bytes [0, total) of the data section at `data_start` through the ring `slots`.

    Reader threads take the next chunk (one slot long), wait until the slot they get is free
    again (`wait(slot)`: its last asynchronous copy has finished), pread into it and hand it
    to this thread, which calls `submit(a, b, slot, k)` to start copying slot[:b-a] to
    destination [a, b) (chunk number k) and puts the slot back for reuse. The copy itself is
    the caller's (CUDA: an async host-to-device copy); after this returns every copy has been
    submitted, and the caller waits for them. Returns the seconds readers spent in pread,
    summed over threads.
    """
    slot_bytes = len(slots[0])
    chunks = [(a, min(total, a + slot_bytes)) for a in range(0, total, slot_bytes)]
    free: queue.Queue = queue.Queue()
    for i in range(len(slots)):
        free.put(i)
    ready: queue.Queue = queue.Queue()
    used = [False] * len(slots)
    next_chunk = [0]
    read_s = [0.0]
    lock = threading.Lock()
    stop = threading.Event()
    fd = os.open(path, os.O_RDONLY)

    def reader() -> None:
        try:
            while not stop.is_set():
                with lock:
                    k = next_chunk[0]
                    next_chunk[0] += 1
                if k >= len(chunks):
                    return
                slot = free.get()
                if stop.is_set():
                    return
                if used[slot]:
                    # The slot's previous copy must have finished before new bytes land there.
                    wait(slot)
                a, b = chunks[k]
                t0 = time.perf_counter()
                _pread_into(fd, slots[slot][: b - a], data_start + a, path)
                with lock:
                    read_s[0] += time.perf_counter() - t0
                ready.put((k, slot, None))
        except BaseException as exc:
            ready.put((-1, -1, exc))

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(min(max(1, readers), len(chunks)))]
    try:
        for th in threads:
            th.start()
        for _ in range(len(chunks)):
            k, slot, exc = ready.get()
            if exc is not None:
                raise exc
            a, b = chunks[k]
            submit(a, b, slot, k)
            used[slot] = True
            free.put(slot)
    finally:
        stop.set()
        # Readers blocked on a free slot (after an error) each need one to notice `stop`.
        for _ in threads:
            free.put(0)
        for th in threads:
            th.join()
        os.close(fd)
    return read_s[0]


def _load_cuda(
    torch: Any,
    header: Header,
    device: Any,
    readers: int,
    ring_bytes: int,
    streams: int,
    stats: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    total = header.data_bytes
    dev_buf = torch.empty(total, dtype=torch.uint8, device=device)
    if total == 0:
        return _carve(torch, dev_buf, header)
    readers = max(1, readers)
    streams = max(1, streams)
    # Enough slots that every reader can be filling one while each stream copies another.
    n_slots = readers + streams
    ring = _take_ring(torch, ring_bytes, n_slots)
    # Events per call, not per ring: an event belongs to the device it was first recorded on.
    events = [torch.cuda.Event() for _ in range(n_slots)]
    cuda_streams = [torch.cuda.Stream(device=device) for _ in range(streams)]
    current = torch.cuda.current_stream(device)
    for s in cuda_streams:
        # dev_buf's memory may have just been freed by work still queued on the current
        # stream (the caching allocator reuses it in that stream's order); copies on other
        # streams must not start before that work is done.
        s.wait_stream(current)
    marks: List[Tuple[Any, Any]] = []

    def submit(a: int, b: int, slot: int, k: int) -> None:
        stream = cuda_streams[k % streams]
        with torch.cuda.stream(stream):
            if stats is not None:
                marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                marks[-1][0].record(stream)
            dev_buf[a:b].copy_(ring.slots[slot][: b - a], non_blocking=True)
            if stats is not None:
                marks[-1][1].record(stream)
            events[slot].record(stream)

    def wait(slot: int) -> None:
        events[slot].synchronize()  # releases the GIL while it waits

    t_start = time.perf_counter()
    try:
        read_s = pipeline(header.path, header.data_start, total, ring.views, readers, submit, wait)
    finally:
        # Whatever happened, no copy may still be reading the ring when it is reused, and the
        # tensors are complete when this returns.
        for s in cuda_streams:
            s.synchronize()
        _give_ring(ring)
    if stats is not None:
        stats["read_seconds"] = stats.get("read_seconds", 0.0) + read_s
        stats["h2d_seconds"] = stats.get("h2d_seconds", 0.0) + sum(b.elapsed_time(e) for b, e in marks) / 1000
        stats["pipeline_seconds"] = stats.get("pipeline_seconds", 0.0) + time.perf_counter() - t_start
    return _carve(torch, dev_buf, header)


def default_readers() -> int:
    """Reader threads for a load: one per CPU, between 4 and 16.

    A read from the page cache is a memory copy that one thread does at a few GB/s; on the
    16-core H100 machine (docs/benchmarks.md, GPU check) 4 readers fed the card 19 GB/s,
    8 gave 31 and 16 gave 36, against a 55 GB/s pinned copy. Past the core count threads
    only contend.
    """
    return max(4, min(16, os.cpu_count() or 4))


def load_file(
    path: Union[str, os.PathLike[str]],
    device: Any = "cpu",
    readers: Optional[int] = None,
    ring_bytes: int = 256 << 20,
    streams: int = 2,
    stats: Optional[Dict[str, Any]] = None,
    zero_copy: bool = False,
) -> Dict[str, torch.Tensor]:
    """Load the safetensors file at `path` onto `device`: name -> tensor, all views of one buffer.

    readers: threads reading the file (CPU: each its own slice; CUDA: each filling ring slots);
    default `default_readers()`.
    ring_bytes, streams: the pinned host ring and the number of CUDA streams copying from it.
    stats: when given, gets bytes, seconds, read_seconds (summed over reader threads) and,
    for CUDA, h2d_seconds (GPU time of the copies) and pipeline_seconds; values accumulate
    over calls.
    zero_copy (CPU only): map the file instead of reading it (see `_load_mmap`); the tensors
    then share memory with the page cache.
    """
    import torch

    t0 = time.perf_counter()
    readers = default_readers() if readers is None else readers
    path = os.fspath(path)
    header = read_header(path)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device} asked for, but torch {torch.__version__} sees no GPU")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(dev):
            out = _load_cuda(torch, header, dev, readers, max(ring_bytes, 1 << 20), streams, stats)
    elif dev.type == "cpu":
        if zero_copy and hasattr(mmap, "MAP_PRIVATE"):
            out = _load_mmap(torch, header)
        else:
            out = _load_cpu(torch, header, readers, stats)
    else:
        # Other devices (mps, xpu): one host read, then each tensor copied over.
        buf = _load_cpu(torch, header, readers, stats)
        out = {k: v.to(dev) for k, v in buf.items()}
    if stats is not None:
        stats["bytes"] = stats.get("bytes", 0) + header.data_bytes
        stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
        stats["files"] = stats.get("files", 0) + 1
    return out


def model_files(path: str) -> List[str]:
    """The safetensors files of a model: a file itself, the shards an index names, or all in the folder."""
    if os.path.isfile(path):
        return [path]
    index = os.path.join(path, INDEX_NAME)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
    files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    return files


def load_model_dir(
    path: Union[str, os.PathLike[str]], device: Any = "cpu", **kwargs: Any
) -> Dict[str, torch.Tensor]:
    """Load every shard of the model at `path` (a folder, or one file); kwargs go to load_file."""
    out: Dict[str, Any] = {}
    for f in model_files(os.fspath(path)):
        part = load_file(f, device=device, **kwargs)
        clash = out.keys() & part.keys()
        if clash:
            raise FormatError(f"{f}: tensor {sorted(clash)[0]!r} is also in an earlier shard")
        out.update(part)
    return out
