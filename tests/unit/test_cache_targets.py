"""Who holds a cache and where its models come from: the one resolver `labctl cache` and
`labctl bench` share, and its one-paragraph errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from labctl.cache.targets import cache_hosts, in_folder, library_root, load_host, resolve_target, storage_host
from labctl.inventory.model import Host, Inventory, ModelCache, Storage
from labctl.output.errors import InputError


def inventory(**hosts: Host) -> Inventory:
    return Inventory(lab="t", path=Path("/tmp/inv.yaml"), hosts=hosts)


M5 = Host(name="m5", address="10.0.0.1", model_cache=ModelCache(path="/mnt/c", size_gb=2, source="irina"))
IRINA = Host(name="irina", address="10.0.0.2", storage=Storage(models="/srv/models/"))
BARE = Host(name="pharaoh", address="10.0.0.3")


def errors(fn: Callable[..., object], *args: object) -> str:
    with pytest.raises(InputError) as e:
        fn(*args)
    assert "\n" not in e.value.message
    return f"{e.value.message} {e.value.hint}"


def test_target_resolution_errors_are_one_paragraph_input_errors() -> None:
    t = resolve_target(inventory(m5=M5, irina=IRINA, pharaoh=BARE), "m5")
    assert (t.source.name, t.root, t.cache.path) == ("irina", "/srv/models", "/mnt/c")
    cases = {
        "pharaoh has no model_cache": (inventory(m5=M5, irina=IRINA, pharaoh=BARE), "pharaoh"),
        "which declares no storage": (
            inventory(m5=M5, irina=BARE.model_copy(update={"name": "irina"})),
            "m5",
        ),
        "'irina', which is not a host": (inventory(m5=M5), "m5"),
        "No host 'nope'": (inventory(m5=M5), "nope"),
    }
    for text, (inv, name) in cases.items():
        assert text in errors(resolve_target, inv, name)


def test_a_cache_without_a_source_and_a_windows_host_are_refused() -> None:
    sourceless = M5.model_copy(update={"model_cache": ModelCache(path="/mnt/c", size_gb=2)})
    msg = errors(resolve_target, inventory(m5=sourceless, irina=IRINA), "m5")
    assert "m5's model_cache has no source" in msg and "hosts with storage: irina" in msg
    windows = M5.model_copy(update={"os": "windows"})
    assert "runs Windows" in errors(resolve_target, inventory(m5=windows, irina=IRINA), "m5")
    assert "Hosts with one: m5" in errors(resolve_target, inventory(m5=M5, irina=IRINA), "irina")


def test_paths_of_a_model_on_both_sides() -> None:
    t = resolve_target(inventory(m5=M5, irina=IRINA), "m5")
    assert (t.stored("tiny"), t.cached("tiny")) == ("/srv/models/tiny", "/mnt/c/tiny")
    root = Host(name="r", address="10.0.0.4", storage=Storage(models="/"))
    assert library_root(root) == "/" and in_folder(library_root(root), "x") == "/x"


def test_cache_hosts_are_the_selected_hosts_with_a_cache() -> None:
    inv = inventory(m5=M5, irina=IRINA, pharaoh=BARE)
    assert [h.name for h in cache_hosts(inv, None)] == ["m5"]
    assert [h.name for h in cache_hosts(inv, "m5,irina")] == ["m5"]
    assert "None of irina, pharaoh has a model_cache" in errors(cache_hosts, inv, "irina,pharaoh")


def test_the_model_load_host_is_the_named_one_else_the_first_with_a_cache() -> None:
    windows = M5.model_copy(update={"name": "win", "os": "windows"})
    inv = inventory(pharaoh=BARE, win=windows, irina=IRINA, m5=M5)
    assert load_host(inv, None).name == "m5"  # not pharaoh (no cache), not win (Windows)
    assert load_host(inv, "pharaoh").name == "pharaoh"  # named: --file needs no cache
    assert "No host 'nope'" in errors(load_host, inv, "nope")
    assert "No host has a model_cache" in errors(load_host, inventory(pharaoh=BARE), None)


def test_the_make_model_host_is_the_first_with_storage() -> None:
    other = IRINA.model_copy(update={"name": "store2"})
    assert storage_host(inventory(m5=M5, irina=IRINA, store2=other), None).name == "irina"
    assert storage_host(inventory(m5=M5, irina=IRINA, store2=other), "store2").name == "store2"
    msg = errors(storage_host, inventory(m5=M5, irina=IRINA), "m5")
    assert "No storage host to write the model on (m5 has no storage section)" in msg
    assert "No storage host to write the model on." in errors(storage_host, inventory(m5=M5), None)
