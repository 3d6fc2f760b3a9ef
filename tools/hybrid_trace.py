"""Why the draft+lookup hybrid took each step: one line a step with each source's seconds a token (optimistic, at the
mean, and as the draft's catch-up counts the step: the lookup at its upper bound), the draft's catch-up spread over the
tokens it should serve, the rows' matches (length, chain) and the call's lookup yield, then the choice and what the step
kept. For reading a benchmark's losses step by step.

    python tools/hybrid_trace.py trace.log bench --target ... --draft ... --modes vanilla,draft+lookup --k 3

runs any ``hf-spec`` command with the trace on (``trace`` does the same around any code)."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator, TextIO

from hf_spec.lookup.hybrid import LookupAndDraftProposer


def _rounded(per_token: dict[str, float]) -> str:
    return " ".join(f"{source}={seconds:.3f}" for source, seconds in per_token.items())


@contextlib.contextmanager
def trace(log: TextIO) -> Iterator[None]:
    """Write each hybrid call's steps to ``log`` while the block runs (``LookupAndDraftProposer`` as before after)."""
    proposer = LookupAndDraftProposer
    choose, advance, start = proposer._choose, proposer.advance, proposer.start

    def traced_start(self, max_new_tokens: int) -> None:
        log.write(f"call max_new_tokens={max_new_tokens}\n")
        start(self, max_new_tokens)

    def traced_choose(self, live, fallback_k: int, both: bool) -> str:
        source = choose(self, live, fallback_k, both)
        judged = "".join(f" {name}: {_rounded(per_token)}" for name, per_token in self.prices.items())
        # after the choice has counted this step, as ``_choose`` spreads the catch-up
        spread = self._catch_up_seconds() / self._draft_tokens_ahead() if fallback_k else 0.0
        made = self.max_new_tokens - self.tokens_left
        log.write(f"step made={made} lacking={self.lacking} k={fallback_k} "
                  f"matches={[(length, len(chain)) for length, chain in live]} "
                  f"yield={self.lookup_yield.share():.2f}{judged} catch-up={spread:.3f} -> {source}\n")
        return source

    def traced_advance(self, accepted: list[int], target_hidden=None) -> None:
        log.write(f"  kept {accepted} ({self.source})\n")
        advance(self, accepted, target_hidden)

    proposer._choose, proposer.advance, proposer.start = traced_choose, traced_advance, traced_start
    try:
        yield
    finally:
        proposer._choose, proposer.advance, proposer.start = choose, advance, start
        log.flush()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from hf_spec.cli import main as hf_spec

    with open(argv[0], "w") as log, trace(log):
        return hf_spec(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
