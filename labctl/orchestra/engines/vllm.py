"""vLLM for Hugging Face folders on newer cards: its documentation asks for compute capability
7.5 or higher, so it fits neither a Pascal P40 (6.1) nor a V100 (7.0)."""

from labctl.orchestra.engines.base import Engine

ENGINE = Engine(
    name="vllm",
    title="vLLM",
    formats=("hf",),
    min_cap=(7, 5),
    command=(
        "{{binary}} serve {path} --host 0.0.0.0 --port {port} --served-model-name {name} "
        "--max-model-len {context}"
    ),
    binary="vllm",
    cuda_check=None,
    health="/health",
)
