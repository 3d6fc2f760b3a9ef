"""Offline: what "auto" would choose, and what it would cost, on real answers, with costs timed on this machine.

    python tools/auto_replay.py record --target T --draft D --dtype float32 --out answers.json
    python tools/auto_replay.py costs --target T --draft D --dtype float32 --out costs.json
    python tools/auto_replay.py replay --answers answers.json --costs costs.json

``record`` writes each question's greedy answer (``--per-category`` after ``--skip``, 64 new tokens), the target's
confidence at each answer token (its top probability) and how far the draft agrees from there: one draft forward over
prompt and answer gives its greedy proposal at every position, and while a draft agrees with the target its chain
from a position is the target's own text, so a chain of k from answer token j keeps min(k, run[j]) tokens, run[j] the
agreeing tokens from j on. The draft is scored over the vocabulary subset the bench uses (``--draft-vocab-size``, the
lowest ids plus the prompt's and end-of-sequence ids). ``costs`` times V(1..9), the draft's token and its catch-up a
token (the bench's calibration, in rounds). ``replay`` runs the real ``AutoLength`` (and fixed k) over the answers in
order, one schedule for all of them as in one process, and prints the predicted speedup by question and overall: no
clock involved, so that a change to "auto" can be judged on a machine whose timings mean nothing, and in seconds.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from hf_spec.engine.auto import AutoLength
from hf_spec.engine.costs import Costs
from hf_spec.engine.estimates import ConfidenceCalibration
from hf_spec.engine.schedule import FixedLength
from hf_spec.prompts import encode, load_prompts
from hf_spec.token_map import TokenMap

WIDTHS = range(1, 10)


def load(path: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    return model, AutoTokenizer.from_pretrained(path)


def agreeing_runs(draft, ids: list[int], prompt_length: int, vocab_size: int | None, eos: list[int]) -> list[int]:
    """run[j]: how many answer tokens from j on the draft's greedy proposals match (each from the true prefix)."""
    with torch.no_grad():
        logits = draft(torch.tensor([ids])).logits[0, prompt_length - 1:-1].float()
    if vocab_size is not None:  # the ids the bench's draft vocabulary keeps
        keep = TokenMap.lowest_ids(vocab_size, logits.shape[-1], also=ids[:prompt_length] + eos).t2d
        logits[:, ~keep] = float("-inf")
    agree = (logits.argmax(-1) == torch.tensor(ids[prompt_length:])).tolist()
    runs, run = [0] * len(agree), 0
    for j in reversed(range(len(agree))):
        run = run + 1 if agree[j] else 0
        runs[j] = run
    return runs


def record(args) -> None:
    target, tokenizer = load(args.target, args.dtype)
    draft, _ = load(args.draft, args.dtype)
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    answers = []
    prompts = load_prompts(None, args.skip + args.per_category)
    seen = Counter()
    for prompt in prompts:
        seen[prompt.category] += 1
        if seen[prompt.category] <= args.skip:
            continue
        inputs = encode(tokenizer, prompt.text)
        out = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, output_scores=True,
                              return_dict_in_generate=True)
        ids, length = out.sequences[0].tolist(), inputs["input_ids"].shape[1]
        confidence = [float(torch.softmax(s[0].float(), -1).max()) for s in out.scores]
        answers.append({"question_id": prompt.question_id, "category": prompt.category, "prompt_length": length,
                        "tokens": ids[length:], "confidence": confidence,
                        "runs": agreeing_runs(draft, ids, length, args.draft_vocab_size, eos)})
        print(prompt.category, len(ids) - length, "tokens", flush=True)
    Path(args.out).write_text(json.dumps({"dtype": args.dtype, "draft_vocab_size": args.draft_vocab_size,
                                          "answers": answers}))


def measure_costs(args) -> None:
    from hf_spec.bench.calibrate import calibrate
    from hf_spec.engine.timing import forward_seconds
    target, _ = load(args.target, args.dtype)
    draft, _ = load(args.draft, args.dtype)
    head = None if args.draft_vocab_size is None else \
        TokenMap.lowest_ids(args.draft_vocab_size, draft.get_output_embeddings().weight.shape[0]).head_of(draft)
    costs = calibrate(target, draft, args.prompt_length, 64, list(WIDTHS), draft_head=head)
    costs.catch_up_token = forward_seconds(draft, 0, args.prompt_length, repeats=3, head=head) / args.prompt_length
    Path(args.out).write_text(json.dumps({"dtype": args.dtype, **costs.to_dict()}))
    print(json.dumps(costs.to_dict(), indent=1))


def table(path: str) -> Costs:
    data = json.loads(Path(path).read_text())
    return Costs(verify={int(w): s for w, s in data["verify"].items()},
                 draft={int(w): s for w, s in data["draft"].items()}, target_prefill=data["target_prefill"],
                 catch_up_token=data["catch_up_token"])


def replay_answer(schedule, answer: dict, costs: Costs, histogram: Counter) -> float:
    """Seconds to decode ``answer`` under ``schedule`` (the prefill makes the first token, as in generate())."""
    tokens, runs, confidence = answer["tokens"], answer["runs"], answer["confidence"]
    schedule.start(answer["prompt_length"], len(tokens))
    seconds, made, behind = costs.target_prefill, 1, answer["prompt_length"]
    while made < len(tokens):
        k = min(schedule.next(), len(tokens) - made - 1) if len(tokens) - made > 1 else 0
        accepted = min(k, runs[made])
        propose_s = 0.0
        if k > 0:  # the draft feeds what it skipped, then lacks only the step's bonus token
            propose_s, behind = k * costs.draft[1] + costs.catch_up_token * max(behind - 1, 0), 1
        else:
            behind += 1
        verify_s = costs.verify_cost(k + 1)
        schedule.observe(k, [accepted], propose_s, verify_s, [confidence[made:made + accepted + 1]])
        seconds += propose_s + verify_s
        made += accepted + 1
        histogram[k] += 1
    return seconds


def replay(args) -> None:
    answers = json.loads(Path(args.answers).read_text())["answers"]
    costs = table(args.costs)
    plain = [costs.target_prefill + (len(a["tokens"]) - 1) * costs.verify[1] for a in answers]
    schedules = {"auto": lambda: AutoLength(Costs(), ConfidenceCalibration())}
    schedules |= {f"k={k}": (lambda k=k: FixedLength(k)) for k in args.fixed}
    print(f"{'question':<16}" + "".join(f"{name:>10}" for name in schedules))
    results = {}
    for name, make in schedules.items():
        schedule, histogram = make(), Counter()
        for _ in range(args.warmup):  # the bench's warm-up call, on the first question
            replay_answer(schedule, answers[0], costs, Counter())
        results[name] = ([replay_answer(schedule, a, costs, histogram) for a in answers], histogram)
    for i, answer in enumerate(answers):
        print(f"{answer['category']:<16}" + "".join(f"{plain[i] / results[name][0][i]:>9.2f}x" for name in schedules))
    print(f"{'all':<16}" + "".join(f"{sum(plain) / sum(results[n][0]):>9.2f}x" for n in schedules))
    for name in schedules:
        print(f"{name}: k chosen per step {dict(sorted(results[name][1].items()))}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("record", "costs"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True)
        p.add_argument("--draft", required=True)
        p.add_argument("--dtype", default="bfloat16")
        p.add_argument("--draft-vocab-size", type=int, default=32768)
        p.add_argument("--out", required=True)
    sub.choices["record"].add_argument("--per-category", type=int, default=1)
    sub.choices["record"].add_argument("--max-new-tokens", type=int, default=64)
    sub.choices["record"].add_argument("--skip", type=int, default=0, help="leave out the first N of each category")
    sub.choices["costs"].add_argument("--prompt-length", type=int, default=167)
    p = sub.add_parser("replay")
    p.add_argument("--answers", required=True)
    p.add_argument("--costs", required=True)
    p.add_argument("--fixed", type=int, nargs="*", default=[3])
    p.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    {"record": record, "costs": measure_costs, "replay": replay}[args.command](args)


if __name__ == "__main__":
    main()
