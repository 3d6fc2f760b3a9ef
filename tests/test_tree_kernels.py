"""The Triton tree-verification kernels equal the torch reference (through the Triton interpreter on CPU, on the
GPU where one is present: tools/gpu_check.sh runs the tests marked gpu there).

The interpreter runs program instances one at a time, so it cannot show races between them; the
compaction kernel is race-free by construction (see hf_spec.verify.triton_kernels).
"""
import copy

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")
pytestmark = pytest.mark.gpu
# On CPU, conftest.py sets TRITON_INTERPRET=1 before Triton is first imported.

from hf_spec.verify.backends import compact_layer_torch  # noqa: E402
from hf_spec.verify import tree as reference  # noqa: E402
from hf_spec.verify import get_verifier  # noqa: E402
from hf_spec.verify import triton_kernels as kernels  # noqa: E402
from hf_spec.engine.trees import MC_SIM_7B_63, build_tree_buffers  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TREES = {
    "default": MC_SIM_7B_63,
    "unequal depths": [(0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0), (1, 0)],
    "chain": [(0,), (0, 0), (0, 0, 0)],
    "single": [(0,)],
}


def random_case(tree, vocab, seed, right=0.6, ties=False):
    """Scores, and node tokens that are the target's argmax at their parent with probability ``right``."""
    generator = torch.Generator().manual_seed(seed)
    buffers = build_tree_buffers(tree)
    scores = torch.randn(buffers.num_nodes + 1, vocab, generator=generator)
    if ties:  # several equal maxima per row: argmax must take the first
        scores = scores.round()
        scores[:, vocab // 3] = scores.max() + 1
        scores[:, 2 * vocab // 3] = scores.max()
    argmax = scores.argmax(-1)
    wrong = torch.randint(vocab, (buffers.num_nodes,), generator=generator)
    keep = torch.rand(buffers.num_nodes, generator=generator) < right
    tokens = torch.where(keep, argmax[buffers.parents], wrong)
    return buffers, scores.to(DEVICE), tokens.to(DEVICE)


def test_the_kernels_are_jitted_not_a_fallback():
    assert get_verifier("triton", torch.device(DEVICE)).greedy is kernels.greedy_accept_tree
    assert type(kernels._row_argmax_kernel).__name__ in ("JITFunction", "InterpretedFunction")


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("vocab", [7, 1000, 3000])
@pytest.mark.parametrize("right", [0.0, 0.6, 1.0])
def test_greedy_kernel_equals_reference(tree, vocab, right):
    for seed in range(3):
        buffers, scores, tokens = random_case(TREES[tree], vocab, seed, right, ties=seed == 2)
        expected = reference.greedy_accept_tree(scores, tokens, buffers.parents.to(DEVICE), buffers.retrieve.to(DEVICE))
        got = kernels.greedy_accept_tree(scores, tokens, buffers.parents, buffers.retrieve)
        assert got[0] == expected[0] and int(got[1]) == int(expected[1])
        if right == 1.0:
            assert len(got[0]) == buffers.max_depth  # everything accepted
        if right == 0.0 and vocab > 7:
            assert got[0] == []


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("vocab", [5, 1500])
def test_sampling_kernel_equals_reference(tree, vocab):
    for seed in range(6):
        buffers, scores, tokens = random_case(TREES[tree], vocab, seed, right=0.7)
        probs = (scores * (3.0 if seed % 2 else 0.5)).softmax(-1)  # peaked and flat distributions
        uniforms = torch.rand(buffers.num_nodes + 1, generator=torch.Generator().manual_seed(100 + seed)).to(DEVICE)
        expected = reference.sample_accept_tree(probs, tokens, buffers.children, uniforms)
        got = kernels.sample_accept_tree(probs, tokens, buffers.children, uniforms)
        assert got[0] == expected[0] and int(got[1]) == int(expected[1])


def test_sampling_kernel_when_everything_or_nothing_is_accepted():
    buffers = build_tree_buffers(TREES["unequal depths"])
    vocab = 50
    tokens = torch.arange(1, buffers.num_nodes + 1).to(DEVICE)
    # p puts all mass on each row's first child token: everything along the first path is accepted
    probs = torch.zeros(buffers.num_nodes + 1, vocab)
    for node, kids in enumerate(buffers.children):
        probs[node, int(tokens[kids[0] - 1]) if kids else 0] = 1.0
    uniforms = torch.full((buffers.num_nodes + 1,), 0.5).to(DEVICE)
    for probs_case in (probs.to(DEVICE), torch.full((buffers.num_nodes + 1, vocab), 1.0 / vocab).to(DEVICE)):
        expected = reference.sample_accept_tree(probs_case, tokens, buffers.children, uniforms)
        got = kernels.sample_accept_tree(probs_case, tokens, buffers.children, uniforms)
        assert got[0] == expected[0] and int(got[1]) == int(expected[1])
    assert kernels.sample_accept_tree(probs.to(DEVICE), tokens, buffers.children, uniforms)[0] == [1, 4, 7, 8]


@pytest.mark.parametrize("moves", [
    ([2, 3], [1, 2]),  # accepted nodes [0, 2, 3]: 2 -> 1 and 3 -> 2 overlap
    ([5, 9, 12], [3, 4, 5]),
    ([4], [4]),  # no move at all
    ([1, 2, 3, 4], [1, 2, 3, 4]),
])
@pytest.mark.parametrize("shape", [(1, 2, 16, 8), (2, 3, 20, 96), (1, 4, 16, 200)])
def test_compaction_kernel_equals_reference(moves, shape):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(shape, generator=generator).to(DEVICE)
    values = torch.randn(shape, generator=generator).to(DEVICE)
    sources, destinations = (torch.tensor(m, device=DEVICE) for m in moves)
    expected_keys, expected_values = keys.clone(), values.clone()
    compact_layer_torch(expected_keys, expected_values, sources, destinations)
    kernels.compact_layer(keys, values, sources, destinations)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_compaction_on_a_cropped_cache_view():
    """Cache layers are often views (cropped along seq): the kernel must follow their strides."""
    base = torch.randn(1, 2, 30, 8).to(DEVICE)
    keys, values = base[:, :, :20], base.clone()[:, :, :20]
    expected_keys, expected_values = keys.clone(), values.clone()
    moves = (torch.tensor([12, 15], device=DEVICE), torch.tensor([11, 12], device=DEVICE))
    compact_layer_torch(expected_keys, expected_values, *moves)
    kernels.compact_layer(keys, values, *moves)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_medusa_end_to_end_with_the_triton_verifier(target, prompt, monkeypatch):
    """Greedy and sampled Medusa decoding through the kernels give what the torch verifier gives."""
    import hf_spec
    from hf_spec.medusa import MedusaHeads
    from hf_spec.medusa.proposer import MedusaProposer
    from hf_spec.testing import oracle_head_logits

    target = copy.deepcopy(target).to(DEVICE)  # on a GPU the kernels need CUDA tensors
    prompt = {name: tensor.to(DEVICE) for name, tensor in prompt.items()}
    heads = MedusaHeads.for_model(target, num_heads=4)
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected[0], [0, 1, 1, 0]))
    out = target.generate(**prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16, strategy="medusa",
                          medusa_heads=heads, tree_verifier="triton")
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().accepted > 0
    sampled = {}
    for verifier in ("torch", "triton"):
        torch.manual_seed(0)
        sampled[verifier] = target.generate(**prompt, do_sample=True, max_new_tokens=16, strategy="medusa",
                                            medusa_heads=heads, tree="tree_8", tree_verifier=verifier)
    assert torch.equal(sampled["torch"], sampled["triton"])


def test_verifier_choice(monkeypatch):
    assert get_verifier("auto", torch.device("cpu")).name == "torch"  # auto takes Triton on CUDA only
    assert get_verifier("torch", torch.device("cpu")).name == "torch"
    with pytest.raises(ValueError, match="tree_verifier must be one of"):
        get_verifier("cuda", torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs Triton and a CUDA device"):
        get_verifier("triton", torch.device("cpu"))


def test_auto_takes_each_triton_kernel_that_measured_faster_on_a_gpu(monkeypatch):
    from hf_spec.verify import backends

    monkeypatch.setattr(backends, "triton_usable", lambda device: True)
    auto = get_verifier("auto", torch.device("cuda"))
    assert auto.greedy is kernels.greedy_accept_tree and auto.compact_layer is kernels.compact_layer
    assert auto.sample is reference.sample_accept_tree  # Triton's sampling walk timed slower on the H200
    assert get_verifier("triton", torch.device("cuda")).sample is kernels.sample_accept_tree


def test_micro_benchmark_runs_and_grows_trees():
    from hf_spec.bench.tree_verify import format_rows, run, tree_of_size

    assert len(set(tree_of_size(128))) == 128 and build_tree_buffers(tree_of_size(128)).num_nodes == 128
    rows = run(DEVICE, [16], [300], repeats=1, layers=2, cache_shape=(2, 80, 8))
    assert [row["what"] for row in rows] == ["accept greedy", "accept sampling", "compact 2 layers"]
    assert all(row["equal"] is True for row in rows)
    assert "speedup" in format_rows(rows) and "equal" in format_rows(rows)
