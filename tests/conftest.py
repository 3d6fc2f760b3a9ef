import os
import sys
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run through its interpreter on CPU tensors. Triton reads this when it is first
    # imported (transformers may import it), so it is set before anything else is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The suite is offline: a name that is not a folder fails at once instead of retrying the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the research scripts in tools/ (outside the package) have tests too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import hf_spec  # noqa: E402,F401  (registers strategy=)
from hf_spec.testing import char_tokenizer, contrary_draft, perturbed_draft, tiny_causal_lm


@pytest.fixture(scope="session")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def target(request):
    return tiny_causal_lm(request.param, seed=0)


@pytest.fixture(scope="session")
def drafts(target):
    """Drafts that are always right (the target itself), never right and partly right under greedy."""
    return {"always": target, "never": contrary_draft(target), "partly": perturbed_draft(target)}


@pytest.fixture
def forward_clock(monkeypatch):
    """``install(seconds)``: ``time.perf_counter`` becomes a clock that only model forwards move, each by
    ``seconds(cached_model, input_ids, now)`` (the ``CachedModel`` running it, its input, the clock before it), so
    that what the package times does not depend on the machine's load."""
    from hf_spec.engine.runner import CachedModel

    forward, clock = CachedModel.forward, [0.0]

    def install(seconds) -> None:
        def timed(self, tokens, *args, **kwargs):
            clock[0] += seconds(self, tokens, clock[0])
            return forward(self, tokens, *args, **kwargs)

        monkeypatch.setattr(CachedModel, "forward", timed)
        monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    return install


@pytest.fixture
def prompt(tokenizer):
    return tokenizer("def fib(n):", return_tensors="pt")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


@pytest.fixture(scope="module")
def heads(target):
    """Four untrained Medusa heads for the target, their output layers spread so that their guesses vary
    (test modules that need other heads define their own)."""
    from hf_spec.medusa import MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads.for_model(target, num_heads=4)
    for head in heads.heads:
        torch.nn.init.normal_(head[-1].weight, std=0.5)
    return heads


@pytest.fixture(scope="module")
def draft_folder(target, tmp_path_factory):
    """A draft that is often right, saved with the tokenizer, for the loading paths (a module may override
    ``target``)."""
    folder = tmp_path_factory.mktemp("draft")
    perturbed_draft(target, noise=0.05).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)
