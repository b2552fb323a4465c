"""`labctl bench model-load`: every stage of loading a model, measured on the lab's hosts.

- `measure`: runs the stages across the storage host and the loading host (the network stage
  is a fresh `cache sync`), renders the table and the plot;
- `stages`: pure arithmetic over what the hosts measured: rates, ceilings, the seed's figures.

The host side is labctl/agent/modelload/stages.py (the agent's `modelload.read_cold` and `modelload.load_stages`). Not
to be confused with bench/, the scripts that compare labctl against other tools.

`seed_of`: `bench make-model`'s seed when --seed is not given.
"""

import zlib


def seed_of(name: str) -> int:
    """The weights' seed of the model folder `name`: two names write two models, the same name
    the same bytes on every machine and run (crc32: Python's hash() of text differs per process)."""
    return zlib.crc32(name.encode("utf-8"))
