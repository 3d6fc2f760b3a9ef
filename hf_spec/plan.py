"""Will target, draft (or Medusa heads) and their KV caches fit on one GPU? Arithmetic from configs only.

``hf_spec.plan(target=..., draft=..., gpu_memory="24GB", max_model_len=4096)`` reads ``config.json`` files
(Hub ids through huggingface_hub, or local paths, or config objects), counts parameters without loading
weights, and returns a :class:`Plan` whose ``table()`` and ``verdict`` say what fits:
"fits", "fits with a 4-bit draft", "use Medusa instead" or "does not fit".

Bytes per parameter: float32 4, float16/bfloat16 2, 8bit 1 (bitsandbytes int8; embeddings and lm_head stay
16-bit), 4bit 0.5 plus NF4's scales (one per 64 weights; double quantization stores them in 8 bits with one
float32 per 256 of them: 0.5 + 1/64 + 4/(64*256) bytes), embeddings and lm_head 16-bit.
KV cache: 2 (keys, values) x layers x kv_heads x head_dim x tokens x batch x bytes per element.

Where the pair does not fit with room to speculate, the plan says how to load the target with accelerate
(``device_map="auto"`` with a ``max_memory`` that leaves the GPU room for the draft, or the heads, and both KV
caches) and where transformers would then put each of its layers: computed as ``from_pretrained`` computes it
(transformers' balanced memory and placement) on an empty model built from the config, so still no weights.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

GiB = 1024**3
BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "8bit": 1.0, "4bit": 0.5 + 1 / 64 + 4 / (64 * 256)}
# what a CUDA context, allocator fragmentation and activations take beyond weights and KV cache
RUNTIME_OVERHEAD_BYTES = 1.0 * GiB
ACTIVATION_SHARE = 0.05


def parse_memory(text: str | int | float) -> int:
    """'24GB' (GPU marketing sizes are GiB), '24GiB', '80 GB', '24000MB', '16g' -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(g|gb|gib|m|mb|mib|t|tb|tib)\s*", str(text).lower())
    if not match:
        raise ValueError(f"GPU memory {text!r} is not a size: write it like '24GB', '80GiB' or '24000MB'.")
    value, unit = float(match.group(1)), match.group(2)[0]
    return int(value * {"m": 1024**2, "g": GiB, "t": 1024**4}[unit])


def load_config(model) -> PretrainedConfig:
    """A config object from a config, a Hub id or a local path (config.json only: no weights)."""
    if isinstance(model, PretrainedConfig):
        return model
    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as error:
        raise ValueError(f"Could not read the config of {model!r} ({error}). Pass a Hub id, a folder with "
                         "config.json, or a transformers config.") from error


def _text(config: PretrainedConfig) -> PretrainedConfig:
    return config.get_text_config()


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _kv_heads(config) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def count_parameters(config: PretrainedConfig) -> dict[str, int]:
    """Parameters of a Llama/Qwen2/Mistral-style decoder from its config: {"embeddings", "lm_head", "layers"}.

    e.g. Llama-2-7B: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms) + 2 x 32000 x 4096
    + 4096 = 6.74 B.
    """
    c = _text(config)
    experts = [name for name in ("num_experts", "num_local_experts", "n_routed_experts") if getattr(c, name, None)]
    if experts or not getattr(c, "intermediate_size", None) or getattr(c, "kv_lora_rank", None):
        raise ValueError(f"The planner counts dense decoders (Llama, Qwen2, Mistral style); {c.model_type!r} has "
                         f"{', '.join(experts) or 'another layout'}, so its count would be wrong. Pass a dense model.")
    hidden, head_dim, heads, kv_heads = c.hidden_size, _head_dim(c), c.num_attention_heads, _kv_heads(c)
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if getattr(c, "attention_bias", False) or c.model_type in ("qwen2",):  # Qwen2 has q/k/v biases
        attention += heads * head_dim + 2 * kv_heads * head_dim
    mlp = 3 * hidden * c.intermediate_size
    layers = c.num_hidden_layers * (attention + mlp + 2 * hidden) + hidden  # + the final norm
    embeddings = c.vocab_size * hidden
    lm_head = 0 if getattr(c, "tie_word_embeddings", False) else c.vocab_size * hidden
    return {"embeddings": embeddings, "lm_head": lm_head, "layers": layers}


def weight_bytes(config: PretrainedConfig, precision: str) -> int:
    """Weights at ``precision``; quantized precisions keep embeddings and lm_head in 16 bits."""
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"Unknown precision {precision!r}; choose from {', '.join(BYTES_PER_PARAM)}.")
    counts = count_parameters(config)
    if precision in ("8bit", "4bit"):
        return int(counts["layers"] * BYTES_PER_PARAM[precision] + (counts["embeddings"] + counts["lm_head"]) * 2)
    return int(sum(counts.values()) * BYTES_PER_PARAM[precision])


def kv_cache_bytes(config: PretrainedConfig, tokens: int, batch_size: int = 1, dtype_bytes: int = 2) -> int:
    c = _text(config)
    return 2 * c.num_hidden_layers * _kv_heads(c) * _head_dim(c) * tokens * batch_size * dtype_bytes


def medusa_parameters(hidden_size: int, vocab_size: int, num_heads: int, num_layers: int,
                      shared_lm_head: bool = False) -> int:
    """Each head: ``num_layers`` ResBlocks (hidden x hidden + bias) and, unless it shares the base model's
    lm_head, its own hidden x vocab output layer."""
    output = 0 if shared_lm_head else hidden_size * vocab_size
    return num_heads * (num_layers * (hidden_size * hidden_size + hidden_size) + output)


def load_medusa_config(heads) -> dict:
    """The settings of Medusa heads: a dict, a config object, or a Hub id / folder whose ``config.json`` holds
    ``medusa_num_heads`` (and ``medusa_num_layers``, ``hidden_size``, ``vocab_size``, ``medusa_shared_lm_head``
    as ``MedusaHeads.save_pretrained`` writes them). Only ``config.json`` is read: no weights."""
    if isinstance(heads, dict):
        return dict(heads)
    if isinstance(heads, PretrainedConfig):
        return heads.to_dict()
    from huggingface_hub import hf_hub_download

    from .medusa.heads import CONFIG_NAME

    try:
        folder = Path(heads)
        path = folder / CONFIG_NAME if folder.is_dir() else Path(hf_hub_download(str(heads), CONFIG_NAME))
        if not path.is_file():
            raise FileNotFoundError(f"{heads} has no {CONFIG_NAME}")
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # no such folder or repo, offline, no config.json, not JSON
        raise ValueError(f"Could not read the Medusa heads' config of {str(heads)!r} ({error}). Pass a Hub id or a "
                         f"folder with {CONFIG_NAME}, as hf-spec train-medusa writes it.") from error
    if not isinstance(config, dict) or "medusa_num_heads" not in config:
        raise ValueError(f"{str(heads)!r}: {CONFIG_NAME} does not say medusa_num_heads, so these are not Medusa "
                         "heads (or not in the Medusa-1 layout).")
    return config


def format_count(count: int) -> str:
    """A parameter count in billions or millions: 6.74 B, 135.0 M, 0.05 M."""
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.{1 if count >= 1e7 else 2}f} M"


@dataclass
class Plan:
    gpu_bytes: int
    rows: list[tuple[str, int]] = field(default_factory=list)  # (what, bytes)
    parameters: list[tuple[str, int]] = field(default_factory=list)  # (model, parameter count)
    options: dict[str, int] = field(default_factory=dict)  # configuration -> total bytes
    verdict: str = ""
    margin_bytes: int = 0
    offload: "Offload | None" = None  # how to load the target where the pair does not fit with room to speculate

    def table(self) -> str:
        lines = [f"{what + ' parameters':<44} {format_count(count):>8}" for what, count in self.parameters]
        lines.append(f"{'component':<44} {'GiB':>8}")
        lines += [f"{what:<44} {size / GiB:>8.2f}" for what, size in self.rows]
        lines.append(f"{'GPU memory':<44} {self.gpu_bytes / GiB:>8.2f}")
        lines += [f"{'total, ' + name:<44} {size / GiB:>8.2f}" for name, size in self.options.items()]
        sign = "+" if self.margin_bytes >= 0 else "-"
        lines.append(f"verdict: {self.verdict} (margin {sign}{abs(self.margin_bytes) / GiB:.2f} GiB)")
        if self.offload is not None:
            lines += self.offload.lines()
        return "\n".join(lines)


@dataclass
class Offload:
    """Loading the target with ``from_pretrained(..., device_map="auto", max_memory=max_memory)`` (and an
    ``offload_folder`` where ``placement`` puts modules on "disk"), beside ``beside`` on the GPU."""

    max_memory: dict  # {0: bytes, "cpu": bytes}
    placement: dict  # module name -> 0, "cpu" or "disk", as transformers would place it
    beside: str  # what else the GPU holds, e.g. "the 4bit draft and both KV caches"

    @property
    def needs_disk(self) -> bool:
        return "disk" in self.placement.values()

    def layers_on(self, device) -> int:
        return sum(1 for name in _layer_names(self.placement) if self.placement[name] == device)

    def lines(self) -> list[str]:
        memory = ", ".join(f"{key!r}: '{size / GiB:.2f}GiB'" for key, size in self.max_memory.items())
        folder = ', offload_folder="offload"' if self.needs_disk else ""
        lines = [f"offload: load the target with device_map=\"auto\", max_memory={{{memory}}}{folder}",
                 f"  to leave GPU 0 room for {self.beside}; transformers would place:"]
        for device in dict.fromkeys(self.placement.values()):
            layers = self.layers_on(device)
            others = [name for name, where in self.placement.items()
                      if where == device and name not in _layer_names(self.placement)]
            what = ", ".join(([f"{layers} decoder layers"] if layers else []) + others)
            lines.append(f"  {'GPU 0' if device == 0 else device}: {what}")
        lines.append("  each step reads the offloaded layers once, however many tokens it verifies: speculation "
                     "pays more here")
        return lines


def _layer_names(placement: dict) -> list[str]:
    """The decoder layers among a device map's module names (e.g. "model.layers.7")."""
    return [name for name in placement if re.fullmatch(r"(.+\.)?layers\.\d+", name)]


def offload_placement(config: PretrainedConfig, dtype: str, max_memory: dict) -> dict:
    """Where ``from_pretrained(device_map="auto", max_memory=max_memory)`` would put each module of a model with
    ``config`` in ``dtype``: transformers' own balanced memory and placement, on an empty model (no weights).
    ``max_memory``: {device: bytes}, devices as accelerate names them (0 for the first GPU, "cpu", "disk")."""
    from transformers.integrations.accelerate import get_balanced_memory, infer_auto_device_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    no_split = model._no_split_modules
    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 0 is not available" where planning elsewhere
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        budgets = get_balanced_memory(model, max_memory=dict(max_memory), no_split_module_classes=no_split)
        return infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=no_split)
    finally:
        quiet.setLevel(level)


def plan(target, draft=None, *, gpu_memory="24GB", max_model_len: int = 4096, batch_size: int = 1,
         dtype: str = "float16", draft_quantization: str | None = None, medusa_heads=None,
         cpu_memory=None) -> Plan:
    """Estimate memory for target + draft (full precision and 4-bit) or target + Medusa heads, with KV caches
    for ``max_model_len`` tokens of ``batch_size`` rows, against ``gpu_memory``; the first that fits wins. Where
    none leaves room to speculate, ``offload`` says how to load the target with part of it in CPU memory (at most
    ``cpu_memory``; None: as much as it needs) and the rest on disk."""
    gpu = parse_memory(gpu_memory)
    target_config = load_config(target)
    element = int(BYTES_PER_PARAM[dtype])
    overhead = lambda weights_and_cache: int(RUNTIME_OVERHEAD_BYTES + ACTIVATION_SHARE * weights_and_cache)  # noqa: E731
    target_weights = weight_bytes(target_config, dtype)
    target_kv = kv_cache_bytes(target_config, max_model_len, batch_size, element)
    result = Plan(gpu_bytes=gpu)
    result.parameters.append(("target", sum(count_parameters(target_config).values())))
    result.rows += [(f"target weights ({dtype})", target_weights), (f"target KV cache ({max_model_len} tokens)", target_kv)]
    base = target_weights + target_kv
    beside = {}  # what else the GPU must hold, by what speculates -> (bytes, words)
    if draft is not None:
        draft_config = load_config(draft)
        result.parameters.append(("draft", sum(count_parameters(draft_config).values())))
        draft_kv = kv_cache_bytes(draft_config, max_model_len, batch_size, element)
        result.rows.append((f"draft KV cache ({max_model_len} tokens)", draft_kv))
        precisions = [draft_quantization] if draft_quantization else [dtype, "8bit", "4bit"]
        for precision in precisions:
            weights = weight_bytes(draft_config, precision)
            result.rows.append((f"draft weights ({precision})", weights))
            total = base + weights + draft_kv
            result.options[f"with {precision} draft"] = total + overhead(total)
            beside["draft"] = (weights + draft_kv, f"the {precision} draft and both KV caches")
    if medusa_heads is not None:
        heads_config = load_medusa_config(medusa_heads)
        t = _text(target_config)
        hidden_size = heads_config.get("hidden_size") or t.hidden_size
        if hidden_size != t.hidden_size:
            raise ValueError(f"The Medusa heads expect hidden size {hidden_size}; the target has {t.hidden_size}. "
                             "Plan with heads trained for this target.")
        heads = medusa_parameters(hidden_size, heads_config.get("vocab_size") or t.vocab_size,
                                  heads_config.get("medusa_num_heads", 5), heads_config.get("medusa_num_layers", 1),
                                  bool(heads_config.get("medusa_shared_lm_head", False)))
        result.parameters.append(("Medusa heads", heads))
        result.rows.append((f"Medusa heads ({dtype})", heads * element))
        total = base + heads * element
        result.options["with Medusa heads"] = total + overhead(total)
        beside.setdefault("heads", (heads * element, "the Medusa heads and the KV cache"))
    result.options["target alone"] = base + overhead(base)
    result.verdict, result.margin_bytes = _verdict(result.options, gpu)
    if beside and result.verdict in ("does not fit", "only the target fits: no room for speculation"):
        result.offload = _offload(target_config, dtype, gpu, target_weights, target_kv, *min(beside.values()),
                                  parse_memory(cpu_memory) if cpu_memory is not None else None)
    return result


def _offload(config, dtype: str, gpu: int, target_weights: int, target_kv: int, beside_bytes: int, beside: str,
             cpu: int | None) -> Offload | None:
    """The target offloaded so that the GPU keeps room for what speculates beside it (the smallest form: e.g. the
    4-bit draft) and both KV caches, with the planner's runtime allowance; None where not even that fits."""
    room = gpu - target_kv - beside_bytes
    room -= int(RUNTIME_OVERHEAD_BYTES + ACTIVATION_SHARE * (room + target_kv + beside_bytes))
    if room <= 0:
        return None
    max_memory = {0: room, "cpu": cpu if cpu is not None else target_weights + GiB}
    return Offload(max_memory, offload_placement(config, dtype, max_memory), beside)


def _verdict(options: dict[str, int], gpu: int) -> tuple[str, int]:
    fitting = {name: gpu - size for name, size in options.items() if size <= gpu}
    for name, verdict in (("with float16 draft", "fits"), ("with bfloat16 draft", "fits"),
                          ("with float32 draft", "fits"), ("with 8bit draft", "fits with an 8-bit draft"),
                          ("with 4bit draft", "fits with a 4-bit draft"), ("with Medusa heads", "use Medusa instead")):
        if name in fitting:
            return verdict, fitting[name]
    if "target alone" in fitting:
        return "only the target fits: no room for speculation", fitting["target alone"]
    return "does not fit", gpu - options["target alone"]
