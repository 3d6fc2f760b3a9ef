"""The memory planner: parameter counts from configs, KV-cache bytes against a real cache, verdicts."""
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, Qwen2Config

from hf_spec.engine.cache import cache_kwargs
from hf_spec.plan import GiB, count_parameters, kv_cache_bytes, parse_memory, plan, weight_bytes
from hf_spec.testing import tiny_causal_lm

LLAMA_2_7B = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False)
TINYLLAMA = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                        num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_05B = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)


@pytest.mark.parametrize("config, published", [(LLAMA_2_7B, 6.74e9), (TINYLLAMA, 1.10e9), (QWEN25_05B, 0.49e9)])
def test_parameter_counts_match_published_sizes(config, published):
    assert sum(count_parameters(config).values()) == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_parameter_count_is_exact_on_a_built_model(arch):
    model = tiny_causal_lm(arch)
    assert sum(count_parameters(model.config).values()) == sum(p.numel() for p in model.parameters())


def test_kv_cache_bytes_match_a_real_cache():
    model = tiny_causal_lm("qwen2", hidden_size=32)  # 4 query heads, 2 kv heads: GQA
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(99, (3, 17)), **cache_kwargs(model, cache), use_cache=True)
    real = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)
    assert kv_cache_bytes(model.config, tokens=17, batch_size=3, dtype_bytes=4) == real


def test_weight_bytes_by_precision():
    full = weight_bytes(TINYLLAMA, "float16")
    assert full == pytest.approx(2 * 1.10e9, rel=0.01)
    assert weight_bytes(TINYLLAMA, "4bit") < weight_bytes(TINYLLAMA, "8bit") < full


def test_the_seeds_a10_example():
    """Llama-2-7B fp16 + TinyLlama on 24 GB at 4096 tokens: the full draft fits; smaller cards need a
    quantized draft, or Medusa heads, or cannot speculate."""
    result = plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="24GB", max_model_len=4096)
    assert result.verdict == "fits" and result.margin_bytes > 0
    assert "draft weights (4bit)" in result.table()
    # totals at 4096 tokens: 18.52 GiB with the fp16 draft, 17.57 with an 8-bit one, 17.11 with a 4-bit one, 16.28
    # for the target alone (each with the runtime allowance): each card gets the best verdict that fits it
    for card, verdict in [("18.8GB", "fits"), ("18GB", "fits with an 8-bit draft"),
                          ("17.4GB", "fits with a 4-bit draft"),
                          ("16.8GB", "only the target fits: no room for speculation"), ("16GB", "does not fit")]:
        tight = plan(LLAMA_2_7B, TINYLLAMA, gpu_memory=card, max_model_len=4096)
        assert tight.verdict == verdict, card
        assert (tight.margin_bytes > 0) is (verdict != "does not fit"), card
    # five Medusa-1 heads for a 7B model are 0.74 B parameters (each has its own 32000 x 4096 lm_head): 1.38 GiB
    medusa = plan(LLAMA_2_7B, None, gpu_memory="18GB", max_model_len=4096,
                  medusa_heads={"medusa_num_heads": 5, "medusa_num_layers": 1})
    assert medusa.verdict == "use Medusa instead"
    assert plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="8GB").verdict == "does not fit"


def test_mixture_of_experts_is_refused_not_miscounted():
    from transformers import MixtralConfig

    with pytest.raises(ValueError, match="counts dense decoders"):
        count_parameters(MixtralConfig(num_local_experts=8))


def test_parse_memory_and_errors(tmp_path):
    assert parse_memory("24GB") == 24 * GiB == parse_memory("24 GiB")
    assert parse_memory("24000MB") == 24000 * 1024**2
    with pytest.raises(ValueError, match="is not a size"):
        parse_memory("lots")
    with pytest.raises(ValueError, match="Could not read the config"):
        plan(str(tmp_path / "missing"), gpu_memory="24GB")


def test_plan_cli_reads_local_configs(tmp_path, capsys):
    from hf_spec.cli import main

    LLAMA_2_7B.save_pretrained(tmp_path / "target")
    TINYLLAMA.save_pretrained(tmp_path / "draft")
    assert main(["plan", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                 "--draft-quantization", "4bit", "--gpu-memory", "24GB", "--max-model-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "draft weights (4bit)" in out and "verdict: fits with a 4-bit draft" in out


def test_the_table_counts_each_models_parameters():
    table = plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="24GB", medusa_heads={"medusa_num_heads": 5}).table()
    lines = {line.rsplit(None, 2)[0]: line.rsplit(None, 2)[1:] for line in table.splitlines() if "parameters" in line}
    assert lines == {"target parameters": ["6.74", "B"], "draft parameters": ["1.10", "B"],
                     "Medusa heads parameters": ["739.3", "M"]}
    assert "target parameters" in plan(QWEN25_05B, gpu_memory="24GB").table().splitlines()[0]
    assert plan(QWEN25_05B, gpu_memory="24GB").table().splitlines()[0].endswith("494.0 M")


@pytest.mark.parametrize("shared_lm_head", [False, True])
def test_plan_cli_reads_heads_saved_by_save_pretrained(tmp_path, capsys, shared_lm_head):
    """--medusa-heads DIR: the config.json MedusaHeads.save_pretrained writes (no model_type) is read as such,
    and the heads' parameters are counted as built (with or without their own lm_head)."""
    from hf_spec.cli import main
    from hf_spec.medusa import MedusaHeads
    from hf_spec.plan import format_count

    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "target")
    heads = MedusaHeads.for_model(model, num_heads=3, shared_lm_head=shared_lm_head)
    heads.save_pretrained(tmp_path / "heads")
    assert main(["plan", "--target", str(tmp_path / "target"), "--medusa-heads", str(tmp_path / "heads"),
                 "--gpu-memory", "1GB"]) == 0
    out = capsys.readouterr().out
    built = sum(p.numel() for p in heads.parameters())
    assert "Medusa heads parameters" in out and format_count(built) in out
    assert f"{'target parameters':<44} {format_count(model.num_parameters()):>8}" in out
    assert "Medusa heads (float16)" in out and "total, with Medusa heads" in out
    result = plan(str(tmp_path / "target"), medusa_heads=str(tmp_path / "heads"))
    assert dict(result.parameters)["Medusa heads"] == built
    assert dict(result.rows)["Medusa heads (float16)"] == 2 * built


def test_plan_refuses_heads_of_another_model_and_folders_without_heads(tmp_path):
    import json

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"medusa_num_heads": 4, "hidden_size": 8}))
    with pytest.raises(ValueError, match="hidden size 8"):
        plan(LLAMA_2_7B, medusa_heads=str(tmp_path / "other"))
    LLAMA_2_7B.save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match="not Medusa heads"):
        plan(LLAMA_2_7B, medusa_heads=str(tmp_path / "model"))


def test_where_the_pair_does_not_fit_the_plan_says_how_to_offload_the_target():
    """Llama-2-7B on an 8 GB card: the 4-bit draft and both caches stay on the GPU, the embeddings and 8 layers beside
    them, the other 24 layers in CPU memory; with 4 GB of it, 9 there and 15 on disk."""
    result = plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="8GB")
    assert result.verdict == "does not fit" and result.offload is not None
    offload = result.offload
    assert (offload.layers_on(0), offload.layers_on("cpu"), offload.layers_on("disk")) == (8, 24, 0)
    assert offload.placement["model.embed_tokens"] == 0 and not offload.needs_disk
    assert "the 4bit draft" in offload.beside and 'device_map="auto"' in result.table()
    on_disk = plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="8GB", cpu_memory="4GB").offload
    assert (on_disk.layers_on(0), on_disk.layers_on("cpu"), on_disk.layers_on("disk")) == (8, 9, 15)
    assert 'offload_folder="offload"' in "\n".join(on_disk.lines())
    assert plan(LLAMA_2_7B, TINYLLAMA, gpu_memory="24GB").offload is None  # it fits: nothing to advise
    assert plan(LLAMA_2_7B, gpu_memory="8GB").offload is None  # nothing speculates beside it


@pytest.mark.parametrize("budget", [80_000, 150_000])
def test_the_placement_the_plan_predicts_is_where_from_pretrained_puts_the_layers(tmp_path, budget):
    """The planner's placement for a CPU budget (the GPU's part in a plan) against where from_pretrained(device_map=
    "auto") actually puts a saved model's modules with that budget, the rest offloaded to disk."""
    from transformers import AutoModelForCausalLM

    from hf_spec.plan import offload_placement

    tiny_causal_lm("llama", num_layers=6).save_pretrained(tmp_path / "model")
    placed = AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map="auto", max_memory={"cpu": budget},
                                                  offload_folder=str(tmp_path / "offload"))
    assert set(placed.hf_device_map.values()) == {"cpu", "disk"}  # the budget splits the model
    predicted = offload_placement(placed.config, "float32", {"cpu": budget})
    assert predicted == placed.hf_device_map


def test_the_command_prints_the_offload_advice(tmp_path, capsys):
    from hf_spec.cli import main

    LLAMA_2_7B.save_pretrained(tmp_path / "target")
    TINYLLAMA.save_pretrained(tmp_path / "draft")
    assert main(["plan", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                 "--gpu-memory", "8GB", "--cpu-memory", "4GB"]) == 0
    out = capsys.readouterr().out
    assert "verdict: does not fit" in out and "'cpu': '4.00GiB'}, offload_folder=\"offload\"" in out
    assert "GPU 0: 8 decoder layers, model.embed_tokens" in out and "disk: 15 decoder layers" in out
