"""labctl.agent.modelload.loader: bit-identical to safetensors.torch.load_file, one buffer per file."""

from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.modelload.loader import FormatError, load_file, load_model_dir, pipeline, read_header

torch = pytest.importorskip("torch", reason="the loader's tensors need torch")
st = pytest.importorskip("safetensors.torch", reason="the reference loader is safetensors")

REPO = Path(__file__).resolve().parents[2]
SAFETENSORS_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _attr, _name in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _attr):
        SAFETENSORS_NAMES[getattr(torch, _attr)] = _name


def raw_bytes(t: Any) -> bytes:
    """A tensor's bytes, whatever its dtype (torch.equal has no float8 kernels, and NaN != NaN)."""
    return bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def write_unaligned(path: Path, tensors: list[tuple[str, Any]]) -> None:
    """A safetensors file with the tensors in exactly this order, no padding between them.

    safetensors' own writer sorts tensors so every offset is aligned; this order puts odd-sized
    ones first, so later tensors start at offsets their element size does not divide.
    """
    header: dict[str, Any] = {"__metadata__": {"written_by": "test"}}
    data = b""
    for name, t in tensors:
        b = raw_bytes(t)
        header[name] = {
            "dtype": SAFETENSORS_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [len(data), len(data) + len(b)],
        }
        data += b
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def many_tensors() -> list[tuple[str, Any]]:
    g = torch.Generator().manual_seed(0)
    out: list[tuple[str, Any]] = [
        ("odd_u8", torch.randint(0, 255, (3,), dtype=torch.uint8, generator=g)),  # shifts all below
        ("scalar_f32", torch.tensor(3.25)),
        ("bool_7", torch.tensor([True, False, True, True, False, False, True])),
        ("empty_f32", torch.empty(0, 3)),
        ("i8_5x3", torch.randint(-128, 127, (5, 3), dtype=torch.int8, generator=g)),
        ("bf16_odd", torch.randn(7, 5, generator=g).bfloat16()),
        ("f16_4d", torch.randn(2, 3, 4, 5, generator=g).half()),
        ("f64_3", torch.randn(3, generator=g, dtype=torch.float64)),
        ("i64_2x2", torch.tensor([[-(2**62), 5], [7, 2**40]], dtype=torch.int64)),
        ("i32_9", torch.arange(-4, 5, dtype=torch.int32)),
        ("i16_3", torch.tensor([-32768, 0, 32767], dtype=torch.int16)),
        ("empty_bf16", torch.empty(4, 0, dtype=torch.bfloat16)),
        ("scalar_i64", torch.tensor(-7, dtype=torch.int64)),
        ("f32_nan_inf", torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])),
        # Large enough (12 MB) for the loader to split the read between reader threads.
        ("big_f32", torch.randn(3_000_001, generator=g)),
        ("tail_u8", torch.tensor([9], dtype=torch.uint8)),
    ]
    if hasattr(torch, "float8_e4m3fn"):
        out.append(("f8_e4m3", torch.randn(11, generator=g).to(torch.float8_e4m3fn)))
        out.append(("f8_e5m2", torch.randn(6, generator=g).to(torch.float8_e5m2)))
    return out


def assert_identical(ours: dict[str, Any], ref: dict[str, Any]) -> None:
    assert sorted(ours) == sorted(ref)
    for name, r in ref.items():
        o = ours[name]
        assert o.dtype == r.dtype, name
        assert o.shape == r.shape, name
        assert o.device == r.device, name
        assert raw_bytes(o) == raw_bytes(r), name
        if r.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) and not r.is_floating_point():
            assert torch.equal(o, r), name


@pytest.fixture(scope="module")
def unaligned_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("loader") / "many.safetensors"
    write_unaligned(path, many_tensors())
    return path


def test_many_dtypes_and_shapes_match_safetensors_bit_for_bit(unaligned_file: Path) -> None:
    ref = st.load_file(str(unaligned_file))
    # The file really is unaligned: some tensors start at offsets their element size does not divide.
    header = read_header(str(unaligned_file))
    from labctl.agent.modelload.loader import DTYPES

    assert any(t.begin % DTYPES[t.dtype][1] for t in header.tensors)
    for readers in (1, 4):
        assert_identical(load_file(unaligned_file, readers=readers), ref)


def test_zero_copy_matches_and_writes_stay_private(unaligned_file: Path) -> None:
    before = unaligned_file.read_bytes()
    ours = load_file(unaligned_file, zero_copy=True)
    assert_identical(ours, st.load_file(str(unaligned_file)))
    ours["big_f32"].fill_(1.0)  # copy-on-write: the file (and the page cache) keep their bytes
    assert unaligned_file.read_bytes() == before


def test_aligned_tensors_are_views_of_one_buffer(tmp_path: Path) -> None:
    tensors = {name: t for name, t in many_tensors()}
    path = tmp_path / "aligned.safetensors"
    st.save_file(tensors, str(path))  # safetensors' writer aligns every tensor
    ours = load_file(path)
    assert_identical(ours, st.load_file(str(path)))
    storages = {t.untyped_storage().data_ptr() for t in ours.values()}
    assert len(storages) == 1, "every tensor should be a view of the file's one buffer"
    # The buffer is ours to write: a tensor changed in place does not change its neighbours.
    ours["i32_9"].fill_(0)
    assert raw_bytes(ours["big_f32"]) == raw_bytes(tensors["big_f32"])


def test_sharded_folder_loads_every_shard(tmp_path: Path) -> None:
    parts = [dict(many_tensors()[i::3]) for i in range(3)]
    names = []
    for i, part in enumerate(parts):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        st.save_file(part, str(tmp_path / name))
        names.append(name)
    weight_map = {k: n for n, part in zip(names, parts, strict=True) for k in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    # A stray file the index does not name is not part of the model.
    st.save_file({"stray": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    ref: dict[str, Any] = {}
    for name in names:
        ref.update(st.load_file(str(tmp_path / name)))
    stats: dict[str, Any] = {}
    ours = load_model_dir(tmp_path, stats=stats)
    assert sorted(ours) == sorted(weight_map)
    assert_identical(ours, ref)
    assert stats["files"] == 3 and stats["bytes"] == sum(
        read_header(str(tmp_path / n)).data_bytes for n in names
    )
    assert stats["seconds"] > 0 and stats["read_seconds"] > 0

    (tmp_path / "model.safetensors.index.json").unlink()  # no index: every .safetensors file
    assert "stray" in load_model_dir(tmp_path)


def test_duplicate_tensor_across_shards_is_an_error(tmp_path: Path) -> None:
    st.save_file({"a": torch.zeros(2)}, str(tmp_path / "model-1.safetensors"))
    st.save_file({"a": torch.ones(2)}, str(tmp_path / "model-2.safetensors"))
    with pytest.raises(FormatError, match="'a' is also in an earlier shard"):
        load_model_dir(tmp_path)


def _file_with_header(path: Path, header: dict[str, Any], data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "outside the 8-byte"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16, "needs 12"),
        ({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "unknown dtype 'Q4'"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "negative dimension"),
        ({"a": {"shape": [1]}}, b"", "bad entry"),
    ],
)
def test_bad_headers_are_named(tmp_path: Path, header: dict[str, Any], data: bytes, message: str) -> None:
    path = _file_with_header(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(FormatError, match=message) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.safetensors"
    text.write_text("hello, this is not a model at all")
    with pytest.raises(FormatError, match="header length"):
        read_header(str(text))
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x10\0")
    with pytest.raises(FormatError, match="too short"):
        read_header(str(short))


def test_module_imports_without_torch() -> None:
    """The agent ships to hosts that may lack torch: importing the loader must not need it."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "from labctl.agent.models import tinylm\n"
        "from labctl.agent.modelload import loader, modelgen\n"
        "print(loader.read_header.__name__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


class SlowCopyEngine:
    """Stands in for a CUDA stream: copies run later, in order, on another thread.

    Each copy first checks that its slot still holds the file's bytes for that chunk: a
    reader that refilled the slot before the copy ran (not waiting for it) is caught.
    """

    def __init__(self, slots: list[memoryview], source: bytes, dest: bytearray) -> None:
        self.slots, self.source, self.dest = slots, source, dest
        self.todo: queue.Queue[tuple[int, int, int] | None] = queue.Queue()
        self.cond = threading.Condition()
        self.submitted = [0] * len(slots)
        self.done = [0] * len(slots)
        self.overwritten = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def submit(self, a: int, b: int, slot: int, k: int) -> None:
        with self.cond:
            self.submitted[slot] += 1
        self.todo.put((a, b, slot))

    def wait(self, slot: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.done[slot] == self.submitted[slot])

    def run(self) -> None:
        while (item := self.todo.get()) is not None:
            a, b, slot = item
            time.sleep(0.002)  # the copy is slow: readers are done long before it starts
            if bytes(self.slots[slot][: b - a]) != self.source[a:b]:
                self.overwritten += 1
            self.dest[a:b] = self.slots[slot][: b - a]
            with self.cond:
                self.done[slot] += 1
                self.cond.notify_all()

    def finish(self) -> None:
        self.todo.put(None)
        self.thread.join()


def test_ring_pipeline_refills_a_slot_only_after_its_copy(tmp_path: Path) -> None:
    """The CUDA path's read/copy overlap, with the GPU replaced by a slow copy thread."""
    data = os.urandom(3 * 65536 * 10 + 12345)  # 30 full slots and a short last one
    path = tmp_path / "blob"
    path.write_bytes(b"H" * 40 + data)  # a 40-byte "header" before the data section
    for readers in (1, 3):
        slots = [memoryview(bytearray(65536)) for _ in range(readers + 2)]
        dest = bytearray(len(data))
        engine = SlowCopyEngine(slots, data, dest)
        read_s = pipeline(str(path), 40, len(data), slots, readers, engine.submit, engine.wait)
        for slot in range(len(slots)):
            engine.wait(slot)  # what the CUDA path's stream.synchronize() does
        engine.finish()
        assert engine.overwritten == 0 and bytes(dest) == data and read_s > 0

    # The check above can fail: a pipeline that did not wait for its copies would be caught.
    slots = [memoryview(bytearray(65536)) for _ in range(3)]
    engine = SlowCopyEngine(slots, data, bytearray(len(data)))
    pipeline(str(path), 40, len(data), slots, 2, engine.submit, lambda slot: None)
    engine.finish()
    assert engine.overwritten > 0


def test_ring_pipeline_reports_a_short_file_and_stops_its_readers(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 100_000)
    slots = [memoryview(bytearray(4096)) for _ in range(4)]
    before = threading.active_count()
    with pytest.raises(FormatError, match=r"file ends \d+ bytes early"):
        pipeline(str(path), 0, 200_000, slots, 3, lambda a, b, slot, k: None, lambda slot: None)
    assert threading.active_count() == before


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")


@needs_gpu
def test_cuda_bit_identical_and_one_storage(tmp_path: Path, unaligned_file: Path) -> None:
    tensors = {name: t for name, t in many_tensors()}
    aligned = tmp_path / "aligned.safetensors"
    st.save_file(tensors, str(aligned))
    # A 1 MiB ring of small slots pushes the 12 MB tensor through many reuses of every slot.
    for ring_bytes, readers, streams in ((1 << 20, 3, 2), (256 << 20, 4, 2), (4 << 20, 1, 1)):
        stats: dict[str, Any] = {}
        ours = load_file(
            aligned, device="cuda:0", readers=readers, ring_bytes=ring_bytes, streams=streams, stats=stats
        )
        assert_identical(ours, st.load_file(str(aligned), device="cuda:0"))
        assert {t.untyped_storage().data_ptr() for t in ours.values()} == {
            ours["big_f32"].untyped_storage().data_ptr()
        }
        assert stats["h2d_seconds"] > 0 and stats["bytes"] == read_header(str(aligned)).data_bytes
    assert_identical(
        load_file(unaligned_file, device="cuda:0", ring_bytes=1 << 20),
        st.load_file(str(unaligned_file), device="cuda:0"),
    )


@needs_gpu
def test_cuda_default_device_and_sharded_folder(tmp_path: Path) -> None:
    parts = [dict(many_tensors()[i::2]) for i in range(2)]
    for i, part in enumerate(parts):
        st.save_file(part, str(tmp_path / f"model-{i + 1:05d}-of-00002.safetensors"))
    ours = load_model_dir(tmp_path, device="cuda")
    ref = {k: v.to("cuda") for part in parts for k, v in part.items()}
    assert_identical(ours, ref)
