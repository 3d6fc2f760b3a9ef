"""Draft-model speculative decoding in an existing transformers script: one import, one keyword.

    python examples/draft_quickstart.py                      # models in $HF_SPEC_MODELS (default ~/.cache/hf-spec-models)
    python examples/draft_quickstart.py --target Qwen/Qwen2.5-Coder-1.5B-Instruct --draft Qwen/Qwen2.5-Coder-0.5B-Instruct
    python examples/draft_quickstart.py --tiny --max-new-tokens 8   # tiny random models built offline (the tests run this)
"""
import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer

import hf_spec  # registers generate(strategy=...)
from hf_spec.prompts import encode
from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm

models = os.environ.get("HF_SPEC_MODELS", os.path.expanduser("~/.cache/hf-spec-models"))
parser = argparse.ArgumentParser()
parser.add_argument("--target", default=os.path.join(models, "qwen2.5-coder-1.5b-instruct"))
parser.add_argument("--draft", default=os.path.join(models, "qwen2.5-coder-0.5b-instruct"))
parser.add_argument("--max-new-tokens", type=int, default=48)
parser.add_argument("--tiny", action="store_true", help="tiny random-weight models built in code (offline; noise text)")
args = parser.parse_args()

if args.tiny:
    tokenizer, model = char_tokenizer(), tiny_causal_lm("qwen2")
    draft = perturbed_draft(model)
else:
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    draft = args.draft  # a path or Hub id: loaded once, onto the target's device and dtype
inputs = encode(tokenizer, "Write a Python function that checks whether a number is prime.")  # a chat turn

# Greedy: the same tokens as model.generate(**inputs) alone, streamed as they are accepted.
out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, strategy="draft",
                     draft_model=draft, num_speculative_tokens=3, streamer=TextStreamer(tokenizer))
print(hf_spec.last_stats().summary())

# Sampling: the target's distribution after temperature and top-p, with statistics on the output.
torch.manual_seed(0)
out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=0.7, top_p=0.9,
                     strategy="draft", draft_model=draft, num_speculative_tokens=3,
                     return_dict_in_generate=True)
print(tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print(out.spec_stats.summary())
