"""How good a parallel draft is, and what it should buy on this machine.

Acceptance by position, measured in one forward per sequence (``pard_layout.evaluation_layout``: every anchor's k
proposals at once): s_i, the share of anchors whose first i proposals are all the reference's next tokens, which is
what greedy verification accepts when the reference is the target's greedy answer. With a target, the references
are its greedy answers to held-out questions (anchors inside the answers, where decoding runs) and the costs are
timed here: V(w), the target's forward of w tokens, and c_d(w), the draft's, so each k gets its predicted tokens/s
E(k) / (c_d(round(E(k)) + k - 1) + V(k + 1)) (``hf_spec.engine.costs.parallel_step_seconds``) beside plain
decoding's 1 / V(1). Without a target, the held-out text is the reference and nothing is timed.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from ..engine.costs import Costs, expected_tokens_per_step, parallel_step_seconds, parallel_width
from ..engine.timing import forward_seconds_by_width
from .pard_layout import evaluation_layout


@dataclass
class PardEvaluation:
    reference: str  # "held-out text" or "the target's greedy answers"
    anchors: int  # anchors judged (at position 1)
    accuracy_by_position: list[float]  # top-1 at proposal i, whatever came before
    survival: list[float]  # s_i: the first i proposals all right
    tokens_per_step: list[float]  # E(k) = 1 + s_1 + ... + s_k for k = 0 .. K
    verify_seconds: dict[int, float] | None = None  # V(w)
    draft_seconds: dict[int, float] | None = None  # c_d(w)
    predicted_tokens_per_s: dict[int, float] | None = None  # by k; 0 is plain decoding

    @property
    def best_k(self) -> int | None:
        rates = self.predicted_tokens_per_s
        return None if not rates else max(rates, key=rates.get)

    def to_dict(self) -> dict:
        return {**asdict(self), "best_k": self.best_k}

    def table(self) -> str:
        lines = [f"acceptance by position on {self.reference} ({self.anchors} anchors)",
                 "position  accuracy  survival"]
        lines += [f"{i + 1:>8}  {a:>8.3f}  {s:>8.3f}"
                  for i, (a, s) in enumerate(zip(self.accuracy_by_position, self.survival))]
        if self.predicted_tokens_per_s:
            plain = self.predicted_tokens_per_s[0]
            lines.append("k  tokens/step  predicted tokens/s  speedup")
            lines += [f"{k:>1}  {self.tokens_per_step[k]:>11.2f}  {rate:>18.2f}  {rate / plain:>6.2f}x"
                      for k, rate in self.predicted_tokens_per_s.items()]
            lines.append(f"best k here: {self.best_k}")
        return "\n".join(lines)


def proposals(model, tokens: torch.LongTensor, k: int, pard_token: int, first_anchor: int,
              chunk: int = 1024) -> torch.LongTensor:
    """The draft's greedy proposals [k, L] (-1 where none) for one sequence tokens [L]: entry [b, j] is proposal
    b + 1 after anchor j - b, predicting tokens[j + 1]."""
    layout = evaluation_layout(len(tokens), k, first_anchor)
    device = model.device
    dtype = model.dtype
    mask = torch.zeros(layout.allowed.shape, dtype=dtype).masked_fill_(~layout.allowed, torch.finfo(dtype).min)
    input_ids = torch.where(layout.blocks == 0, tokens[layout.positions], torch.full_like(layout.positions, pard_token))
    with torch.no_grad():
        hidden = model.base_model(input_ids=input_ids[None].to(device), position_ids=layout.positions[None].to(device),
                                  attention_mask=mask[None, None].to(device)).last_hidden_state[0]
        output = model.get_output_embeddings()
        predicted = torch.cat([output(hidden[start : start + chunk]).argmax(-1).cpu()
                               for start in range(0, len(hidden), chunk)])
    table = torch.full((k, len(tokens)), -1, dtype=torch.long)
    table[layout.blocks, layout.positions] = predicted
    return table


def judge(table: torch.LongTensor, tokens: torch.LongTensor, first_anchor: int) -> tuple[list, list, list]:
    """Per position i = 1 .. k over the anchors a >= first_anchor with a reference for it (a + i < L): (anchors,
    proposals right, runs of i right)."""
    k, length = table.shape
    right = torch.zeros_like(table, dtype=torch.bool)
    right[:, : length - 1] = table[:, : length - 1] == tokens[1:]
    seen, correct, runs = [], [], []
    for i in range(1, k + 1):
        anchors = torch.arange(first_anchor, length - i)
        hits = torch.stack([right[b, anchors + b] for b in range(i)]) if len(anchors) else torch.zeros(i, 0).bool()
        seen.append(len(anchors))
        correct.append(int(hits[-1].sum()))
        runs.append(int(hits.all(0).sum()))
    return seen, correct, runs


def acceptance(model, references: list[tuple[torch.LongTensor, int]], k: int, pard_token: int,
               progress: bool = False) -> tuple[int, list[float], list[float]]:
    """Over ``references`` (tokens [L], first anchor): (anchors at position 1, accuracy by position, survival)."""
    seen, correct, runs = [0] * k, [0] * k, [0] * k
    for tokens, first in tqdm(references, desc="acceptance by position", disable=not progress):
        table = proposals(model, tokens, k, pard_token, first)
        for i, (n, c, r) in enumerate(zip(*judge(table, tokens, first))):
            seen[i], correct[i], runs[i] = seen[i] + n, correct[i] + c, runs[i] + r
    return (seen[0], [c / n if n else 0.0 for c, n in zip(correct, seen)],
            [r / n if n else 0.0 for r, n in zip(runs, seen)])


def target_answers(target, tokenizer, prompts, new_tokens: int) -> list[tuple[torch.LongTensor, int]]:
    """Each held-out question with the target's greedy answer: (tokens [L], the prompt's last index)."""
    from ..prompts import encode

    answers = []
    for prompt in prompts:
        inputs = encode(tokenizer, prompt.text).to(target.device)
        with torch.no_grad():
            out = target.generate(**inputs, do_sample=False, max_new_tokens=new_tokens)
        answers.append((out[0].cpu(), inputs["input_ids"].shape[1] - 1))
    return answers


def timed_costs(target, draft, context: int, k: int, widths: list[int]) -> Costs:
    """V(w) for w = 1 .. k + 1 and c_d(w) for the parallel widths, at ``context`` tokens (``engine.timing``)."""
    return Costs(verify=forward_seconds_by_width(target, context, dict.fromkeys(range(1, k + 2))),
                 draft=forward_seconds_by_width(draft, context, dict.fromkeys(sorted(set(widths)))))


def evaluate_parallel_draft(draft, tokenizer, held_out: list[torch.LongTensor], k: int, *, target=None,
                            prompts=None, new_tokens: int = 128, per_category: int = 1,
                            progress: bool = False) -> PardEvaluation:
    """The module docstring's evaluation of ``draft`` (``pard_token`` in its config) with k proposals. ``target``
    (object, Hub id or path): references are its greedy answers (``new_tokens``) to ``prompts`` (a questions file;
    default the Spec-Bench questions, ``per_category`` of each category), and costs are timed; else the
    ``held_out`` sequences are."""
    pard_token = draft.config.pard_token
    draft.eval()
    if target is None:
        references = [(tokens, 0) for tokens in held_out]
        reference = "held-out text"
    else:
        from ..prompts import load_prompts

        target = _loaded(target, draft.dtype)
        references = target_answers(target, tokenizer, load_prompts(prompts, per_category=per_category), new_tokens)
        reference = "the target's greedy answers"
    if not references:
        raise ValueError("Nothing to evaluate on: hold sequences out (eval_every > 0) or give a target.")
    anchors, accuracy, survival = acceptance(draft, references, k, pard_token, progress)
    expected = [expected_tokens_per_step(survival[:n]) for n in range(k + 1)]
    evaluation = PardEvaluation(reference, anchors, accuracy, survival, expected)
    if target is not None:
        context = round(statistics.mean(len(tokens) for tokens, _ in references) - new_tokens / 2)
        widths = [parallel_width(survival[:n]) for n in range(1, k + 1)]
        costs = timed_costs(target, draft, context, k, widths)
        rates = {0: 1.0 / costs.verify_cost(1)}
        rates.update({n: expected[n] / parallel_step_seconds(costs, survival[:n]) for n in range(1, k + 1)})
        evaluation.verify_seconds, evaluation.draft_seconds = costs.verify, costs.draft
        evaluation.predicted_tokens_per_s = rates
    return evaluation


def _loaded(model, dtype: torch.dtype):
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype).eval()
    return model
