"""Reaching the lab's hosts: what a command holds while it runs (`context`), every per-host
action in parallel (`fanout`), the agent shipped and called on a host (`agent_ship`), the
per-host recap of what changed (`recap`), waiting for a host-side listener (`listening`) and
the controller's side of a host lock (`hostlock`). Below this sits `labctl.transport` (one
connection to one host); above it, every feature."""
