"""labctl's own server (labctl/agent/orchestra/server.py): Hugging Face causal LMs through
`transformers` and labctl's tinylm checkpoints, loaded from the RAM cache by labctl's loader.
It runs wherever the host's torch build has kernels for the card (the server checks torch's
arch list as it loads), Pascal P40s included: there it computes in fp32 (their fp16 runs at
1/64 rate), so 16-bit weights take twice their bytes, which the plan counts."""

from labctl.orchestra.engines.base import Engine

ENGINE = Engine(
    name="labctl",
    title="labctl's server",
    formats=("hf", "tinylm"),
    min_cap=None,
    command=None,
    cuda_check="torch",
    health="/health",
    max_tokens=256,
    fp32_below=(7, 0),
)
