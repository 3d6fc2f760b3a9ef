"""``num_speculative_tokens="auto"`` for prompt lookup: how many nodes of each row's trie to verify, from the
acceptance by position that matches of its length have realised."""
from __future__ import annotations

from ..engine.auto import AutoNodes, ProbeCadence
from ..engine.costs import Costs, best_tree_size
from ..engine.estimates import PositionSurvival


class MatchSurvival:
    """``PositionSurvival`` by class of a lookup match's length (1, 2-3, 4 or more tokens of agreement with the text
    before it: a longer agreement is a surer copy, so the classes realise very different acceptance); class 0 (length
    0) is a row with no match, whose proposal is one guess (``guess``)."""

    CLASSES = 3

    def __init__(self):
        self.by_class: dict[int, PositionSurvival] = {}

    def __getitem__(self, match_length: int) -> PositionSurvival:
        """The survival of matches of this length's class."""
        return self.by_class.setdefault(min(match_length.bit_length(), self.CLASSES), PositionSurvival())

    def classes(self) -> list[PositionSurvival]:
        """The classes of matches (not the guess)."""
        return [self[2 ** c - 1] for c in range(1, self.CLASSES + 1)]

    def guess(self) -> PositionSurvival:
        """The survival of the one-node guesses made where a row has no match."""
        return self[0]


class AutoLookup(AutoNodes):
    """``num_speculative_tokens="auto"`` for prompt lookup: each row's tree gets the n nodes (0 = none) that
    maximise E(n) / (H + V(n + 1)) for its match (``nodes_for``; E from the acceptance by position that matches of
    its length's class realised, ``MatchSurvival``; H the lookup's measured time, V the target's verify cost by
    width). The step's k caps them: the best size for the most promising class, up to ``max_nodes``. As
    ``AutoTree``: plain decoding first measures V(1), then the largest size until a step has proposed; while
    plain decoding wins for every class, probe steps (at least one node a row) keep the estimates current.

    A row with no match gets one node, a guess (``PromptLookupProposer``: the text's most frequent token), where
    that is faster than a plain step: E(1) / (H + V(2)) > 1 / V(1). The guess is rarely right (4% of the no-match
    steps of the 21-question lookup bench's answers), so it pays only where the target verifies two tokens faster
    than one: in bfloat16 on a CPU with native bf16, a one-token forward of Qwen2.5-Coder-1.5B takes 185-250 ms
    and a two-token one 170-200 ms (a one-row matmul and attention take slower kernels); not where two cost twice
    one (float32 on a CPU: once V(2) is measured), and at about break-even where they cost the same (a GPU). A
    probe never guesses: it is for the matches' estimates."""

    def __init__(self, costs: Costs, survival: MatchSurvival, max_nodes: int = 20,
                 cadence: ProbeCadence | None = None):
        super().__init__(costs, survival, max_nodes, cadence)

    def expected(self) -> list[float]:
        """E(n) of the most promising class of matches, for each n (a step where a guess pays is one where a match's
        first token does too: it is a guess at least as good)."""
        curves = [survival.expected(self.max_nodes) for survival in self.estimate.classes()]
        return [max(values) for values in zip(*curves)]

    def nodes_for(self, match_length: int, cap: int) -> int:
        """The nodes to verify for a row whose best match is ``match_length`` tokens long (0: no match, a guess), at
        most ``cap``."""
        if match_length == 0:  # judged once V(1) is known (the lookup's own time is a fraction of a millisecond)
            if self.probing or not self.costs.verify:
                return 0
            return best_tree_size(self.estimate.guess().expected(min(cap, 1)), self.costs)
        if not self.measured():
            return cap
        return best_tree_size(self.estimate[match_length].expected(cap), self.costs, min(int(self.probing), cap))
