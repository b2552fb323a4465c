"""`labctl bench model-load`: every stage of loading a model, measured on the lab's hosts.

- `measure`: runs the stages across the storage host and the loading host (the network stage
  is a fresh `cache sync`), renders the table and the plot;
- `stages`: pure arithmetic over what the hosts measured: rates, ceilings, the seed's figures.

The host side is labctl/agent/modelload/stages.py (the agent's `read_cold` and `load_stages`). Not
to be confused with bench/, the scripts that compare labctl against other tools.
"""
