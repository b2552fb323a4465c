"""Carrying out a rotation plan, one module per step, each drivable alone on a `state.Rotation`.

`labctl/orchestra/rotate.py` decides (through `decide.py`) and runs these in the plan's order:
- `lock`: every serving host's rotation lock, and the hosts that left the orchestra;
- `repair`: what a killed rotation left, and hosts that no longer serve (`retire`);
- `cache`: joining models missing from a host's RAM cache synced in;
- `start`: a batch of joiners started and their health awaited (a failed one stopped);
- `stop`: leavers stopped, and `orchestra stop`'s sweep of whatever else runs;
- `commit`: a host's warm.json (and history entry) written;
- `publish`: the trainers' endpoints.json rewritten;
- `verify`: the hosts read again and compared with the plan.
`state` holds what they share: the options, the result, each host's warm list and the one
call that reaches a host's agent.
"""
