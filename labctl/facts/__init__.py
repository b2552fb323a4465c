"""`labctl facts`: each host's hardware and software as the agent reports it (`collect`), the
inventory's claims compared with it (`compare`), and what labctl knows about GPUs and torch
builds (`gpus`)."""
