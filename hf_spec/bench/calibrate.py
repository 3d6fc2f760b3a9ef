"""Measure c_t(w), c_d(w) and the prefill times before the timed runs (see ``hf_spec.engine.costs``)."""
from __future__ import annotations

from ..engine.costs import Costs
from ..engine.timing import forward_seconds, forward_seconds_by_width


def calibrate(target, draft, prompt_length: int, new_tokens: int, widths: list[int], repeats: int = 5,
              draft_head=None, draft_widths: list[int] = ()) -> Costs:
    """Costs at the context a mid-generation step sees: the prompt plus half the new tokens.
    ``widths``: the verification widths to time besides 1 and 2 (k + 1 for chains, n + 1 for trees);
    ``draft_head``: what scores the draft's proposals when not its own output layer (a draft vocabulary);
    ``draft_widths``: the draft's forward widths to time besides 1 and 2 (a parallel draft's steps)."""
    context = prompt_length + new_tokens // 2
    return Costs(
        verify=forward_seconds_by_width(target, context, dict.fromkeys(sorted({1, 2, *widths})), repeats),
        draft=forward_seconds_by_width(draft, context, dict.fromkeys(sorted({1, 2, *draft_widths})), repeats,
                                       head=draft_head)
        if draft is not None else {},
        target_prefill=forward_seconds(target, 0, prompt_length, repeats=1),
        draft_prefill=forward_seconds(draft, 0, prompt_length, repeats=1, head=draft_head) if draft is not None
        else 0.0,
    )
