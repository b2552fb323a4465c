"""llama.cpp's `llama-server` for GGUF files: the engine that fits Pascal P40s (it has CUDA
kernels for sm_61 when built with a toolkit that still compiles it; see the llama_cpp
provision resource). Bound to every interface (trainers use the inventory address), serving the
orchestra's name as its alias. Its /health answers 503 "Loading model" while it loads."""

from labctl.orchestra.engines.base import Engine

ENGINE = Engine(
    name="llama.cpp",
    title="llama.cpp's llama-server",
    formats=("gguf",),
    min_cap=(5, 0),
    command=(
        "{{binary}} -m {file} --host 0.0.0.0 --port {port} --alias {name} -c {context} "
        "--n-gpu-layers {gpu_layers} --no-webui"
    ),
    binary="llama-server",
    cuda_check="build.json",
    health="/health",
    loading_words=("loading model", "loading"),
)
