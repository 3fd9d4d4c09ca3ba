"""Checkpoint folders in the published layout <-> a Qwen2 model.

A folder holds config.json, the weights as `model.safetensors` or as shards
`model-00001-of-0000N.safetensors` listed in `model.safetensors.index.json`, the tokenizer files, and
optionally generation_config.json. Loading checks every tensor's name and shape against the model
from the safetensors headers alone, before any weight is read, so a bad checkpoint fails with a
message naming the file and key and leaves nothing half-loaded. Weights are then read one tensor at a
time from the memory-mapped files and cast into a model allocated once in the requested dtype: a 7B
load never holds two copies.
"""

import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import Qwen2Config
from .files import atomic_write, write_json
from .finite import check_weights
from .model import Qwen2
from .tokenizer import Tokenizer

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


class CheckpointError(ValueError):
    """A checkpoint folder whose weights do not fit the model its config.json describes."""


def weight_files(folder: str) -> list[str]:
    """The safetensors files of a checkpoint folder: the shards named by the index, or the single file."""
    index_path = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise CheckpointError(
                f"{index_path}: not valid JSON ({type(e).__name__}: {e})"
            ) from None
        except (KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"{index_path}: not a safetensors index with a 'weight_map' ({e!r})"
            ) from None
        for name in names:  # a shard is a file of this folder, never a path that leads elsewhere
            if (
                not isinstance(name, str)
                or os.path.basename(name) != name
                or name in ("", ".", "..")
            ):
                raise CheckpointError(
                    f"{index_path}: shard {name!r} is not a file name in the checkpoint folder"
                )
        files = [os.path.join(folder, name) for name in names]
        absent = [f for f in files if not os.path.isfile(f)]
        if absent:
            raise CheckpointError(f"{index_path} lists shard {absent[0]}, which does not exist")
        return files
    single = os.path.join(folder, WEIGHTS_NAME)
    if os.path.isfile(single):
        return [single]
    raise CheckpointError(
        f"{folder}: no {WEIGHTS_NAME} and no {INDEX_NAME}; is this a checkpoint folder?"
    )


def check_index(folder: str, found: dict[str, tuple[tuple[int, ...], str]]) -> None:
    """Every tensor the index names lies in the shard it names (weight_files read the index)."""
    index_path = os.path.join(folder, INDEX_NAME)
    if not os.path.isfile(index_path):
        return
    with open(index_path, encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    for name, shard in weight_map.items():
        if name not in found:
            raise CheckpointError(f"{index_path}: names tensor {name} in {shard}, which lacks it")
        if os.path.basename(found[name][1]) != shard:
            raise CheckpointError(
                f"{index_path}: names tensor {name} in {shard}, but it lies in "
                f"{os.path.basename(found[name][1])}"
            )


def as_dtype(dtype) -> torch.dtype:
    """A torch dtype, or its name ("float32", "bfloat16", "float16"), as a torch dtype."""
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in names:
        return names[dtype.removeprefix("torch.")]
    if dtype not in names.values():
        raise ValueError(f"dtype must be one of {', '.join(names)} (or torch's), got {dtype!r}")
    return dtype


def as_device(device) -> torch.device:
    """A torch device, refused when it names CUDA on a machine without one (before any allocation)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a device torch knows ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r}, but this machine has no CUDA device; use 'cpu'")
    return device


def read_shapes(files: list[str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, file)} from the safetensors headers, reading no tensor data."""
    shapes = {}
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    if name in shapes:
                        raise CheckpointError(
                            f"tensor {name} appears in both {shapes[name][1]} and {path}"
                        )
                    shapes[name] = (tuple(f.get_slice(name).get_shape()), path)
        except CheckpointError:
            raise
        # safetensors raises its own error types for a truncated or garbled file
        except Exception as e:
            raise CheckpointError(
                f"{path}: cannot read it as safetensors ({e}); the file may be truncated "
                "or corrupt, download it again"
            ) from None
    return shapes


def expected_shapes(model: Qwen2) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        # the same tensor as model.embed_tokens.weight; not stored on disk
        shapes.pop("lm_head.weight")
    return shapes


def check_tensors(model: Qwen2, found: dict[str, tuple[tuple[int, ...], str]], folder: str):
    """The strict part of a strict load_state_dict: name every missing, unexpected and mis-shaped tensor."""
    expected = expected_shapes(model)
    problems = []
    missing = [k for k in expected if k not in found]
    if missing:
        problems.append(
            f"missing tensor(s): {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
        )
    for name in (k for k in found if k not in expected):
        hint = " (config.json says tie_word_embeddings=true)" if name == "lm_head.weight" else ""
        problems.append(f"unexpected tensor {name} in {os.path.basename(found[name][1])}{hint}")
    for name in (k for k in expected if k in found and found[k][0] != expected[k]):
        problems.append(
            f"tensor {name} in {os.path.basename(found[name][1])} has shape {list(found[name][0])}, "
            f"config.json implies {list(expected[name])}"
        )
    if problems:
        raise CheckpointError(
            f"{folder}: weights do not match config.json:\n  " + "\n  ".join(problems[:12])
        )


def eos_token_ids(folder: str, config: Qwen2Config) -> list[int]:
    """Stop ids for sampling: generation_config.json's eos_token_id (Instruct models list both
    <|im_end|> and <|endoftext|>), else config.json's."""
    ids = list(config.eos_token_ids)
    path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            extra = json.load(f).get("eos_token_id")
        extra = [] if extra is None else [extra] if isinstance(extra, int) else extra
        ids = list(dict.fromkeys(extra + ids))
    return ids


# transformers' GenerationConfig defaults, which its generate uses where generation_config.json is silent
GENERATION_DEFAULTS = dict(
    do_sample=False, temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0
)
# settings transformers applies that minirl's sampler has not: a folder that sets one is refused
# rather than sampled otherwise without a word (their values that change nothing)
UNAPPLIED = dict(num_beams=1, min_p=None, typical_p=1.0, no_repeat_ngram_size=0)


def generation_settings(folder: str) -> dict:
    """The sampling settings transformers' generate would use for a checkpoint folder, as
    sampling.generate's arguments: temperature, top_k, top_p and repetition_penalty from
    generation_config.json, GENERATION_DEFAULTS where it is silent (so top_k 50 when it samples
    and names none, as in transformers), temperature 0 (greedy) unless do_sample is true. Qwen2.5
    Instruct's give temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.1. A folder without
    the file gives greedy decoding, as transformers does. minirl's samplers never read this by
    themselves: `minirl generate` passes it, under the flags given on its command line."""
    path = os.path.join(folder, "generation_config.json")
    found = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    unapplied = {k: found[k] for k in UNAPPLIED if found.get(k, UNAPPLIED[k]) != UNAPPLIED[k]}
    if unapplied:
        raise ValueError(
            f"{path}: sets {unapplied}, which minirl's sampler does not apply; remove them to "
            "sample with the rest"
        )
    # null is transformers' "not set" too
    settings = {k: v if found.get(k) is None else found[k] for k, v in GENERATION_DEFAULTS.items()}
    return dict(
        temperature=settings["temperature"] if settings["do_sample"] else 0.0,
        top_k=settings["top_k"],
        top_p=settings["top_p"],
        repetition_penalty=settings["repetition_penalty"],
    )


def load_model(folder: str, dtype=torch.float32, device="cpu") -> Qwen2:
    """Build the model a checkpoint folder describes and fill it with the folder's weights. dtype:
    a torch dtype or its name; device: anything torch.device takes."""
    dtype, device = as_dtype(dtype), as_device(device)
    config = Qwen2Config.from_json(folder)
    files = weight_files(folder)
    found = read_shapes(files)
    check_index(folder, found)
    with torch.device("meta"):
        model = Qwen2(config)  # shapes only: nothing allocated until every check has passed
    check_tensors(model, found, folder)
    model = model.to(dtype).to_empty(device=device)  # one allocation, already in the final dtype
    model.tie_weights()
    params = model.state_dict()
    with torch.no_grad():
        for path in files:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    # one tensor in flight; copy_ casts bf16 -> dtype
                    params[name].copy_(f.get_tensor(name))
                    check_weights(params[name], f"{path}: tensor {name}")
    model.eos_token_ids = eos_token_ids(folder, config)
    model.name_or_path = os.path.abspath(folder)
    return model.eval()


def run_dtype(name: str, device, full: bool) -> torch.dtype:
    """The weights' dtype for a training run: --dtype, or "auto" = bfloat16 for LoRA on a GPU, else
    float32. (On a CPU without native bfloat16 products, such as this project's AVX2 machine, they
    ran 6x slower than float32; with AMX they can be faster: --dtype bfloat16.)"""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" and not full else torch.float32
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)


def load_pretrained(path: str, dtype=torch.float32, device="cpu"):
    """(model, tokenizer) from a Qwen2.5 checkpoint folder as published on the model hub."""

    if not os.path.isdir(path):
        raise CheckpointError(
            f"{path}: not a folder; pass the checkpoint folder (config.json, "
            "model*.safetensors, tokenizer.json, tokenizer_config.json)"
        )
    tokenizer = Tokenizer.from_dir(path)  # cheap; fails before the weights are read
    model = load_model(path, dtype, device)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {model.config.vocab_size}"
        )
    return model, tokenizer


def save_pretrained(model: Qwen2, folder: str, tokenizer=None, max_shard_size: int = 5_000_000_000):
    """Write config.json, generation_config.json and the weights in the published layout (sharded when
    they exceed max_shard_size bytes), plus the tokenizer files when a tokenizer is given."""
    os.makedirs(folder, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    shards, size = [{}], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    names = (
        [WEIGHTS_NAME]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards):
        atomic_write(
            os.path.join(folder, name),
            lambda tmp, shard=shard: save_file(shard, tmp, metadata={"format": "pt"}),
        )
    index_path = os.path.join(folder, INDEX_NAME)
    if len(shards) > 1:
        write_json(
            index_path,
            {
                "metadata": {
                    "total_size": sum(t.numel() * t.element_size() for t in tensors.values())
                },
                "weight_map": {k: n for n, shard in zip(names, shards) for k in shard},
            },
        )
    # remove what a previous save with another sharding left behind, so the folder has one layout
    for stale in os.listdir(folder):
        if (stale == WEIGHTS_NAME or SHARD_PATTERN.fullmatch(stale)) and stale not in names:
            os.remove(os.path.join(folder, stale))
    if len(shards) == 1 and os.path.exists(index_path):
        os.remove(index_path)
    config = model.config.to_dict()
    config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    write_json(os.path.join(folder, "config.json"), config)
    write_json(
        os.path.join(folder, "generation_config.json"),
        {"bos_token_id": model.config.bos_token_id, "eos_token_id": list(model.eos_token_ids)},
    )
    if tokenizer is not None:
        tokenizer.save(folder)
