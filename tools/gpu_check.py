"""The GPU check's steps; tools/gpu_check.sh runs each in its own process, under its own time limit.

    python tools/gpu_check.py STEP [--rehearse] [--out DIR]
    (STEP: environment, tree-verify, draft, trees, draft_4bit; and, each in a call of its own, compiled, placement)

Each step prints its tables (the shell keeps them as $OUT/<step>.txt) and appends one JSON record to
$OUT/results.jsonl; tools/gpu_check_summary.py reads the records back into one screen. A part of a step that fails
(the 4-bit draft's load, the sync count, the memory reading) is reported and the rest goes on; the step then exits 1.

On the GPU: Llama-2-7B target and TinyLlama-1.1B draft shapes with random weights, built on the GPU in fp16
(``hf-spec bench --synthetic``'s models), random prompts, 64 new tokens, acceptance per proposal set to alpha.
``--rehearse``: the same steps on the CPU at tiny shapes, to prove that each starts and writes its file.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

RESULTS = "results.jsonl"
# bitsandbytes 0.50.2, manylinux_2_24_x86_64, as pip downloaded it on 2026-12-03: 43,139,553 bytes
BITSANDBYTES_WHEEL_MIB = 41.1
CARRY_LIMIT_MIB = 64


@dataclass(frozen=True)
class Settings:
    device: str
    dtype: str
    synthetic: str  # TARGET:DRAFT, shapes of hf_spec.bench.synthetic.SHAPES
    prompts: int  # timed prompts (the first also runs untimed first: the warm-up)
    prompt_length: int
    new_tokens: int
    ks: tuple[int, ...]
    alpha: float
    tree_sizes: tuple[int, ...]  # the tree-verify micro-benchmark's
    vocabs: tuple[int, ...]
    repeats: int
    layers: int
    cache: tuple[int, int, int]  # heads, length, head_dim


GPU = Settings("cuda", "float16", "llama-2-7b:tinyllama-1.1b", 2, 128, 64, (3, 5, 8), 0.8, (16, 64, 128),
               (32000, 128256), 50, 32, (32, 2048, 128))
REHEARSAL = Settings("cpu", "float32", "tiny:tiny", 1, 16, 12, (3, 5, 8), 0.8, (16,), (300,), 2, 2, (2, 80, 8))


def record(out: Path, step: str, **data) -> None:
    """Append one step's record to results.jsonl."""
    with open(out / RESULTS, "a") as f:
        f.write(json.dumps({"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **data}, default=str) + "\n")


def attempt(what: str, function, errors: list[str]):
    """function(), or None with its traceback printed and its error noted: one part failing leaves the others."""
    print(f"[{time.strftime('%H:%M:%S')}] {what} ...", flush=True)
    try:
        return function()
    except Exception as error:  # noqa: BLE001 (a check reports every failure and goes on)
        traceback.print_exc()
        errors.append(f"{what}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
        return None


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def four_bit_status() -> dict:
    """Whether the 4-bit draft can be checked here, and why not where it cannot."""
    if importlib.util.find_spec("bitsandbytes") is not None:
        return {"checked": True, "why": f"bitsandbytes {version('bitsandbytes')} is importable"}
    fits = BITSANDBYTES_WHEEL_MIB < CARRY_LIMIT_MIB
    how = (f"its wheel ({BITSANDBYTES_WHEEL_MIB:.0f} MiB) fits the {CARRY_LIMIT_MIB} MiB the device carries: "
           "download it into .whl/ and carry .whl (docs/benchmarks.md, On a GPU)" if fits else
           f"its wheel ({BITSANDBYTES_WHEEL_MIB:.0f} MiB) is over the {CARRY_LIMIT_MIB} MiB the device carries")
    return {"checked": False, "why": f"bitsandbytes is not installed (the image has none); {how}"}


def environment(settings: Settings, out: Path) -> int:
    info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            **{name: version(name) for name in ("transformers", "triton", "accelerate", "bitsandbytes", "pytest")},
            "device": settings.device, "four_bit": four_bit_status()}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        info.update(gpu=properties.name, capability=f"{properties.major}.{properties.minor}",
                    gpu_memory_gib=round(total / 2**30, 1), gpu_free_gib=round(free / 2**30, 1))
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    for name, value in info.items():
        print(f"{name}: {value}")
    record(out, "environment", **info)
    return 0


def tree_verify(settings: Settings, out: Path) -> int:
    from hf_spec.bench.tree_verify import format_rows, run

    rows = run(settings.device, list(settings.tree_sizes), list(settings.vocabs), settings.repeats, settings.layers,
               settings.cache)
    print(format_rows(rows))
    record(out, "tree_verify", rows=rows)
    return 0 if all(row["equal"] for row in rows) else 1


def build(settings: Settings, modes: list[str]):
    """The synthetic bench's models and prompts: (contenders, prompts, encoded)."""
    from hf_spec.bench import random_prompts, synthetic_contenders

    contenders = synthetic_contenders(settings.synthetic, settings.device, getattr(torch, settings.dtype), modes)
    vocab = contenders.target.get_output_embeddings().weight.shape[0]
    prompts, encoded = random_prompts(settings.prompts, settings.prompt_length, vocab, settings.device)
    print(f"built {settings.synthetic} ({', '.join(modes)}) on {settings.device} in {settings.dtype}", flush=True)
    return contenders, prompts, encoded


def quantize_draft(contenders, errors: list[str]) -> dict:
    """Replace the contenders' draft by the same draft quantized to 4 bits by bitsandbytes (saved, then loaded as a
    user's draft is: hf_spec.draft.loading), where bitsandbytes is importable; the full-precision draft is freed
    first and the peak memory counted afresh. Returns four_bit_status(), or why the load failed."""
    from hf_spec.draft.loading import resolve_draft

    status = four_bit_status()
    if not status["checked"]:
        return status
    folder = tempfile.mkdtemp(prefix="gpu-check-draft-")
    contenders.draft.save_pretrained(folder)
    contenders.draft = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    quantized = attempt("load the draft in 4 bits",
                        lambda: resolve_draft(folder, contenders.target, draft_quantization="4bit"), errors)
    shutil.rmtree(folder, ignore_errors=True)
    if quantized is None:
        return {"checked": False, "why": errors[-1]}
    contenders.draft, contenders.draft_form = quantized, "4bit weights (bitsandbytes)"
    return status


def bench(contenders, prompts, encoded, modes: list[str], settings: Settings, cache: str = "dynamic",
          ks: tuple[int, ...] | None = None) -> dict:
    """run_bench (its table printed), and what it writes as JSON: settings, costs, rows, runs. ``cache``: "static"
    runs every mode on static caches, which compile their steps on CUDA as generate() does (not in a rehearsal)."""
    from hf_spec.bench import run_bench

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench.json")
        ks = list(ks or settings.ks) if "draft" in modes else []  # no chain widths to calibrate for the trees
        run_bench(contenders, None, prompts=prompts, modes=modes, ks=ks, max_new_tokens=settings.new_tokens,
                  encoded=encoded, alphas=[settings.alpha], json_path=path, warmup=1, cache=cache)
        with open(path) as f:
            return json.load(f)


def sync_modes(result: dict | None) -> list[str]:
    """The modes whose syncs are counted: vanilla and one of each strategy (the middle k of a draft's)."""
    names = [row["mode"] for row in (result or {}).get("rows", []) if row["category"] == "all"]
    chains = [name for name in names if name.startswith("draft")]
    trees = [name for name in names if name.startswith(("eagle", "medusa"))]
    return [name for name in names if name == "vanilla"] + chains[len(chains) // 2 :][:1] + trees


def host_syncs(contenders, inputs: dict, modes: list[str], settings: Settings) -> dict:
    """Per mode, one more generate() call with its host syncs counted: per decoding step (a plain token for
    vanilla), and the busiest lines."""
    from hf_spec.bench.host_syncs import count_host_syncs
    from hf_spec.bench.run import generate_once

    generation = dict(max_new_tokens=settings.new_tokens, do_sample=False)
    reference = contenders.target.generate(**inputs, **generation)
    counts = {}
    for mode in modes:
        with count_host_syncs(settings.device) as syncs:
            _, _, stats, _ = generate_once(mode, contenders, inputs, generation, reference)
        counts[mode] = syncs.per_step(stats["steps"] if stats else settings.new_tokens)
        print(f"syncs {mode}: {counts[mode]}", flush=True)
    return counts


def memory(planned: dict[str, int], what: str, settings: Settings) -> dict:
    """The peak memory of the step's process beside the planner's estimate of the same models (``planned``: its
    parts in bytes). Peak on device = torch's peak reserved + what lies outside its allocator (the CUDA context)."""
    from hf_spec.plan import GiB

    row = {"what": what, "planned_gib": sum(planned.values()) / GiB,
           "parts_gib": {name: size / GiB for name, size in planned.items()}}
    if torch.device(settings.device).type == "cuda":
        free, total = torch.cuda.mem_get_info()
        outside = (total - free) - torch.cuda.memory_reserved()
        row.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / GiB,
                   peak_device_gib=(torch.cuda.max_memory_reserved() + outside) / GiB)
        row["device_over_planned"] = row["peak_device_gib"] / row["planned_gib"]
    print(f"memory {what}: {json.dumps(row, default=float)}", flush=True)
    return row


def draft_memory_plan(contenders, settings: Settings) -> dict[str, int]:
    """hf_spec.plan for target + draft (at the step's dtype, or in 4 bits), KV caches for the prompt, the new tokens
    and the widest verification."""
    from hf_spec.plan import plan

    tokens = settings.prompt_length + settings.new_tokens + max(settings.ks) + 1
    precision = "4bit" if (contenders.draft_form or "").startswith("4bit") else settings.dtype
    estimate = plan(contenders.target.config, contenders.draft.config, gpu_memory="1TB", max_model_len=tokens,
                    dtype=settings.dtype, draft_quantization=precision)
    return {f"target + {precision} draft (plan)": estimate.options[f"with {precision} draft"]}


def trees_memory_plan(contenders, settings: Settings) -> dict[str, int]:
    """hf_spec.plan for target + Medusa heads; the EAGLE draft (which the planner does not know) counted beside it:
    its parameters and its one layer's KV cache."""
    from hf_spec.plan import kv_cache_bytes, plan

    heads = contenders.medusa_heads
    tokens = settings.prompt_length + settings.new_tokens + 64
    heads_config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
                    "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size}
    estimate = plan(contenders.target.config, gpu_memory="1TB", max_model_len=tokens, dtype=settings.dtype,
                    medusa_heads=heads_config)
    eagle = contenders.eagle_model
    eagle_bytes = sum(p.numel() * p.element_size() for p in eagle.parameters())
    element = torch.finfo(getattr(torch, settings.dtype)).bits // 8
    return {"target + Medusa heads (plan)": estimate.options["with Medusa heads"],
            "EAGLE draft (counted)": eagle_bytes + kv_cache_bytes(eagle.config, tokens, dtype_bytes=element)}


def seed_pair_verdict(settings: Settings) -> str:
    """The planner's verdict for the step's two shapes on a 24 GB card at 4,096 tokens (the design card's claim)."""
    from hf_spec.commands.bench import synthetic_configs
    from hf_spec.plan import plan

    target, draft = synthetic_configs(settings.synthetic)
    verdict = plan(target, draft, gpu_memory="24GB", max_model_len=4096, dtype="float16").verdict
    return f"planner, {settings.synthetic} on a 24 GB card at 4096 tokens: {verdict}"


STEPS = {  # step: (modes, what the models are, the memory plan)
    "draft": (["vanilla", "draft", "auto"], "target + draft", draft_memory_plan),
    "draft_4bit": (["vanilla", "draft", "auto"], "target + 4-bit draft", draft_memory_plan),
    "trees": (["vanilla", "eagle", "medusa"], "target + Medusa heads + EAGLE draft", trees_memory_plan),
}


def bench_step(step: str, settings: Settings, out: Path) -> int:
    """Build the step's models, bench them, count each strategy's syncs, read the peak memory; record it all."""
    errors: list[str] = []
    modes, what, memory_plan = STEPS[step]
    extra = {"four_bit": four_bit_status()} if step == "draft_4bit" else {}
    if extra and extra["four_bit"]["checked"]:
        contenders, prompts, encoded = build(settings, modes)
        extra["four_bit"] = quantize_draft(contenders, errors)
    if extra and not extra["four_bit"]["checked"]:
        print(f"4-bit draft NOT CHECKED: {extra['four_bit']['why']}")
        record(out, step, settings=asdict(settings), errors=errors, **extra)
        return 1 if errors else 0
    if not extra:
        contenders, prompts, encoded = build(settings, modes)
    if step == "draft":
        extra["planner_24gb"] = attempt("planner verdict", lambda: seed_pair_verdict(settings), errors)
        print(extra["planner_24gb"])
    result = attempt("bench", lambda: bench(contenders, prompts, encoded, modes, settings), errors)
    syncs = attempt("host syncs", lambda: host_syncs(contenders, encoded[0], sync_modes(result), settings), errors)
    memory_row = attempt("memory", lambda: memory(memory_plan(contenders, settings), what, settings), errors)
    record(out, step, settings=asdict(settings), bench=result, syncs=syncs, memory=memory_row, errors=errors, **extra)
    return 1 if errors else 0


COMPILED_MODES = ["vanilla", "draft", "auto", "eagle", "medusa"]


def compiled_step(settings: Settings, out: Path) -> int:
    """Speculation on static caches with compiled steps (on CUDA, as generate() compiles there: CUDA graphs) against
    transformers' own compiled plain decoding, and its eager plain decoding: the baseline each compiled mode is
    measured against must be real (compiled vanilla well above eager)."""
    errors: list[str] = []
    contenders, prompts, encoded = build(settings, COMPILED_MODES)
    eager = attempt("eager vanilla", lambda: bench(contenders, prompts, encoded, ["vanilla"], settings), errors)
    compiled = attempt("compiled", lambda: bench(contenders, prompts, encoded, COMPILED_MODES, settings, "static",
                                                 ks=(3, 5)), errors)
    record(out, "compiled", settings=asdict(settings), eager=eager, bench=compiled, errors=errors)
    return 1 if errors else 0


def placement_step(settings: Settings, out: Path) -> int:
    """The target placed by accelerate, half its layers on the device and half offloaded (to the CPU's memory on a
    GPU, to disk in a rehearsal), the draft on the device: every output equal to the target's in one place, and what
    speculation buys where each forward reads the offloaded layers once."""
    from accelerate import dispatch_model

    errors: list[str] = []
    contenders, prompts, encoded = build(settings, ["vanilla", "draft"])
    target = contenders.target
    generation = dict(max_new_tokens=settings.new_tokens, do_sample=False)
    reference = [target.generate(**inputs, **generation) for inputs in encoded]
    layers = target.config.num_hidden_layers
    away = "cpu" if settings.device != "cpu" else "disk"
    device = 0 if settings.device != "cpu" else "cpu"
    device_map = {"model.embed_tokens": device, "model.rotary_emb": device, "model.norm": device, "lm_head": device,
                  **{f"model.layers.{i}": device if i < layers // 2 else away for i in range(layers)}}
    with tempfile.TemporaryDirectory() as folder:
        contenders.target = dispatch_model(target, device_map, main_device=device, offload_dir=folder)
        placed = [contenders.target.generate(**inputs, **generation) for inputs in encoded]
        equal = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(placed, reference))
        print(f"placed target ({layers // 2} of {layers} layers offloaded to {away}): plain output "
              f"{'equal' if equal else 'DIFFERENT'} to the target in one place", flush=True)
        result = attempt("bench", lambda: bench(contenders, prompts, encoded, ["vanilla", "draft"], settings,
                                                ks=(3, 5)), errors)
    record(out, "placement", settings=asdict(settings), offloaded_to=away, equal_to_unplaced=equal, bench=result,
           errors=errors)
    return 0 if equal and not errors else 1


OWN_CALL_STEPS = {"compiled": compiled_step, "placement": placement_step}  # too long to share a call
STEP_CHOICES = ("environment", "tree-verify", *STEPS, *OWN_CALL_STEPS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=STEP_CHOICES)
    parser.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = REHEARSAL if args.rehearse else GPU
    if args.step in STEPS:
        return bench_step(args.step, settings, out)
    if args.step in OWN_CALL_STEPS:
        return OWN_CALL_STEPS[args.step](settings, out)
    return {"environment": environment, "tree-verify": tree_verify}[args.step](settings, out)


if __name__ == "__main__":
    sys.exit(main())
