"""Medusa at a real shape: greedy equality with plain generate(), with random heads and with an oracle.

Random heads (never trained) are almost never right: this checks tree verification and the KV-cache
gather on a real model, not speed. The oracle knows the target's greedy continuation and ranks the
true token at fixed per-head ranks, so most of each path is accepted.

    python examples/medusa_real_check.py --target $HF_SPEC_MODELS/qwen2.5-coder-1.5b-instruct --questions 3 --max-new-tokens 32
    python examples/medusa_real_check.py --tiny --questions 1 --max-new-tokens 8   # tiny offline model (the tests)
"""
import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_spec
from hf_spec.medusa import MedusaHeads
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.prompts import encode, load_prompts
from hf_spec.testing import char_tokenizer, oracle_head_logits, tiny_causal_lm

models = os.environ.get("HF_SPEC_MODELS", os.path.expanduser("~/.cache/hf-spec-models"))
parser = argparse.ArgumentParser()
parser.add_argument("--target", default=os.path.join(models, "qwen2.5-coder-1.5b-instruct"))
parser.add_argument("--questions", type=int, default=3)
parser.add_argument("--max-new-tokens", type=int, default=32)
parser.add_argument("--tree", default="mc_sim_7b_63")
parser.add_argument("--oracle-ranks", default="0,1,1,0,0", help="per-head rank of the true token")
parser.add_argument("--tiny", action="store_true", help="a tiny random-weight model built in code (offline)")
args = parser.parse_args()

if args.tiny:
    tokenizer, model = char_tokenizer(), tiny_causal_lm("llama")
else:
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
torch.manual_seed(0)
heads = MedusaHeads.for_model(model, num_heads=5)
original_head_logits = MedusaProposer.head_logits


def first_difference(out, expected, prompt_len):
    """Where greedy outputs differ: the first differing position and the target's top-2 logit gap there."""
    diff = (out[0, : expected.shape[1]] != expected[0, : out.shape[1]]).nonzero()
    if len(diff) == 0:
        return "lengths differ only"
    position = int(diff[0])
    with torch.no_grad():
        logits = model(expected[:, :position]).logits[0, -1]
    top2 = logits.topk(2).values
    return f"first difference at new token {position - prompt_len}: top-2 logit gap {float(top2[0] - top2[1]):.2e}"


for prompt in load_prompts(per_category=1, limit=args.questions):
    inputs = encode(tokenizer, prompt.text)
    prompt_len = inputs["input_ids"].shape[1]
    expected = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    runs = {"random heads": None, f"oracle ranks {args.oracle_ranks}": [int(r) for r in args.oracle_ranks.split(",")]}
    for name, ranks in runs.items():
        MedusaProposer.head_logits = original_head_logits if ranks is None else oracle_head_logits(expected[0], ranks)
        out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, strategy="medusa",
                             medusa_heads=heads, tree=args.tree)
        stats = hf_spec.last_stats()
        equal = torch.equal(out, expected)
        print(f"[{prompt.category}] {name}: equal to plain greedy: {'yes' if equal else 'NO'}; {stats.summary()}")
        if not equal:
            print("   " + first_difference(out, expected, prompt_len))
MedusaProposer.head_logits = original_head_logits
