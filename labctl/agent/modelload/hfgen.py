"""A tiny Hugging Face causal LM of a real architecture, made here from a seed (no download).

    python -m labctl.agent.modelload.hfgen --out DIR [--seed 0] [--arch llama] [--vocab 1024]
        [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2] [--context 512] [--dtype float32]

DIR gets what a model from the Hub holds: config.json (`model_type: llama`), model.safetensors,
generation_config.json, tokenizer.json (a byte-level BPE trained here with `tokenizers` on the
phase-3 tasks' text, so code and prose split into real subwords), tokenizer_config.json
holding a ChatML chat template, and special_tokens_map.json. The weights are a fresh random
initialisation from `--seed`: the same arguments write the same bytes, so a test can compare
two engines' greedy tokens on one model. It runs where torch, transformers and tokenizers are
installed (a host's torch_env, or the controller's venv); the agent's stdlib code only starts it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

ARCHS = ("llama", "qwen2", "mistral")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML: what Qwen's and many other instruct models' templates write; llama.cpp knows it too.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def training_text() -> Iterator[str]:
    """Local text for the tokenizer: every phase-3 task's prompt and reference solution."""
    from ..models.tasks import TASKS, prompt_text

    for task in TASKS:
        yield prompt_text(task)
        yield task.solution


def make_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # GPT-2's byte-level split: every byte sequence round-trips, and llama.cpp's "gpt-2"
    # pre-tokenizer is the same rule, so a GGUF of this model tokenizes alike.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(training_text()), trainer=trainer)
    return tok


def model_config(
    arch: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, context: int
) -> Any:
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[arch]
    return cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=SPECIALS.index("<|im_end|>"),
        pad_token_id=SPECIALS.index("<|endoftext|>"),
    )


def new_model(
    seed: int,
    arch: str = "llama",
    vocab: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 512,
    dtype: str = "float32",
    tok: Any = None,
) -> Tuple[Any, Any]:
    """(model, tokenizer): a fresh model initialised from `seed`, and its fast tokenizer trained
    here with `vocab` entries at most (the model's vocabulary is the tokenizer's real size);
    `tok`: that `tokenizers` tokenizer when the caller has made it already."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if tok is None:
        tok = make_tokenizer(vocab)
    config = model_config(arch, tok.get_vocab_size(), hidden, layers, heads, kv_heads, context)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    # A random model's text ends at once or never; a fixed generation config makes both engines
    # stop at the same token.
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        model_max_length=context,
    )
    fast.chat_template = CHAT_TEMPLATE
    return model, fast


def save_model(out: str, model: Any, tokenizer: Any, extra: Optional[Dict[str, Any]] = None) -> None:
    """Write the model folder `out`, replaced whole (written beside it, then renamed), so a reader
    never sees half a model. `extra`: more JSON files for the folder, by file name."""
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".hfgen-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, obj in (extra or {}).items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        # mkdtemp's 0700 and safetensors' 0600 would keep the cache's sync and other users out.
        os.chmod(tmp, 0o755)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_hf_model(
    out: str,
    seed: int = 0,
    arch: str = "llama",
    vocab: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    context: int = 512,
    dtype: str = "float32",
) -> Dict[str, Any]:
    """Write the model folder `out` (replaced whole: written beside it, then renamed)."""
    model, fast = new_model(seed, arch, vocab, hidden, layers, heads, kv_heads, context, dtype)
    save_model(out, model, fast)
    params = sum(p.numel() for p in model.parameters())
    n_vocab = model.config.vocab_size
    return {"path": out, "arch": arch, "params": params, "vocab": n_vocab, "context": context, "seed": seed}


def make_on_host(
    path: str,
    fmt: str,
    seed: int,
    python: Optional[str],
    ftype: str = "f16",
    kind: str = "random",
    hint_matters: bool = False,
    tasks: int = 8,
) -> Dict[str, Any]:
    """`bench make-model --format hf|gguf [--kind coder]` on a host: this module (codergen for a
    coder, and ggufgen for GGUF) run with the host's torch python, as the server does; the agent
    itself stays stdlib-only. A GGUF model is written as a folder holding one model.gguf (the RAM
    cache holds folders)."""
    import subprocess
    import time

    from ..core.errors import AgentError
    from ..core.launch import IMPORT_ROOT, torch_python

    py, _ = torch_python(python)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    start = time.monotonic()

    def run(argv: List[str]) -> str:
        try:
            done = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=1800)
        except OSError as exc:
            raise AgentError(f"make_model: cannot run {py}: {exc.strerror or exc}", "io") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise AgentError(
                f"make_model: {' '.join(argv[1:3])} failed: {' | '.join(tail)}; the {fmt} format needs "
                f"torch, transformers and tokenizers for {py} (the `hf` extra)",
                "io",
            )
        return done.stdout

    def generate(out: str) -> Dict[str, Any]:
        module = "codergen" if kind == "coder" else "hfgen"
        argv = [py, "-m", f"labctl.agent.modelload.{module}", "--out", out, "--seed", str(seed)]
        if kind == "coder":
            argv += ["--tasks", str(tasks)] + (["--hint-matters"] if hint_matters else [])
        return dict(json.loads(run(argv)))

    if fmt == "hf":
        info = generate(path)
    else:
        parent = os.path.dirname(os.path.abspath(path)) or "."
        os.makedirs(parent, exist_ok=True)
        hf = tempfile.mkdtemp(prefix=".hf-for-gguf-", dir=parent)
        out = tempfile.mkdtemp(prefix=".gguf-", dir=parent)
        try:
            info = generate(hf + "/m")
            run(
                [py, "-m", "labctl.agent.modelload.ggufgen", "--hf", hf + "/m", "--out", out + "/model.gguf",
                 "--ftype", ftype]
            )  # fmt: skip
            if kind == "coder":  # the trained tasks travel with the model, whatever its format
                from .formats import CODER_RECORD

                shutil.copyfile(os.path.join(hf, "m", CODER_RECORD), os.path.join(out, CODER_RECORD))
            os.chmod(out, 0o755)
            if os.path.isdir(path):
                shutil.rmtree(path)
            os.rename(out, path)
        finally:
            shutil.rmtree(hf, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    files: List[Dict[str, Any]] = [
        {"name": n, "bytes": os.path.getsize(os.path.join(path, n))} for n in sorted(os.listdir(path))
    ]
    return dict(
        info,
        path=path,
        format=fmt,
        files=files,
        bytes=sum(f["bytes"] for f in files),
        seconds=round(time.monotonic() - start, 3),
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labctl.agent.modelload.hfgen", description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", default="llama", choices=ARCHS)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    a = parser.parse_args(argv)
    try:
        info = make_hf_model(
            a.out, a.seed, a.arch, a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.context, a.dtype
        )
    except (ImportError, ValueError, OSError) as exc:
        sys.stderr.write(f"hfgen: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
