"""Prompt lookup beside another proposer (``strategy="draft"`` with ``prompt_lookup=True``): each step the lookup's
continuation alone (free: the draft does not run, and catches up later on the tokens it skipped), the other
proposer's alone, or, under greedy decoding, both in one tree; whichever should bring tokens fastest. The draft's
catch-up (the whole prompt, the first time it runs in a call) is part of its price, so that a call the lookup
serves well does not pay for a draft it barely uses."""
from __future__ import annotations

import math

import torch
from transformers import LogitsProcessorList

from ..engine.estimates import AnswerLengths, CallYield, PositionSurvival
from ..engine.costs import Costs
from ..engine.memory import pair_memory
from ..engine.proposer import Proposal, Proposer, time_compiled_steps
from ..engine.schedule import Schedule
from .auto import MatchSurvival
from .generate import lookup_proposer, lookup_schedule, lookup_settings
from .proposer import PromptLookupProposer, trie_proposal

FALLBACK_MEMORY = 24.0  # the draft's acceptance by position follows about this many of its recent steps
SOURCES = ("lookup", "both", "fallback", "plain")  # what a step may take, preferred in this order on a tie
DRAFT_SOURCES = ("both", "fallback")  # those that run the draft
PRIOR_STEPS = 2  # steps the draft was not the fastest for, counted before a call's own (``_draft_tokens_ahead``)
CATCH_UP_MEASURED = 64  # a draft step that fed more tokens than this it lacked measures the catch-up a token (in a
# shorter one the draft's own forwards weigh: 37 and 45 tokens read 8.3 and 6.7 ms a token in bf16 here, 709 tokens 2.6)
STEP_FEED = 2  # what a draft step lacks after one it ran: the bonus token, and its last proposal where all were kept


def beside_prompt_lookup(fallback: Proposer, fallback_schedule: Schedule, call, memory_key,
                         num_speculative_tokens, cache_costs: bool = True) -> tuple["LookupAndDraftProposer", Schedule]:
    """``fallback`` and its schedule with prompt lookup beside it, for a decoding ``call`` (an
    ``hf_spec.engine.call.DecodingCall``: its generation config's prompt lookup settings). With
    ``num_speculative_tokens="auto"`` the lookup's chain length is "auto" too (``AutoLookup``, its estimates kept
    for (target, ``memory_key``)); else it is ``prompt_lookup_num_tokens``. Either way each chain is cut to the length
    that brings its tokens fastest (``LookupAndDraftProposer._chain_length``)."""
    num_tokens, max_ngram = lookup_settings(call.generation_config)
    memory = pair_memory(call.model, memory_key, cache_costs)
    memory.lookup_survival = memory.lookup_survival or MatchSurvival()
    nodes = "auto" if num_speculative_tokens == "auto" else num_tokens
    shared = getattr(fallback_schedule, "costs", None)  # the target's costs, as the fallback's "auto" measures them
    schedule = lookup_schedule(nodes, call.model, memory_key, num_tokens, cache_costs, max_nodes=num_tokens,
                               costs=shared)
    lookup = lookup_proposer(call, num_tokens, max_ngram, schedule, memory.lookup_survival)
    vocab_size = call.model.get_output_embeddings().weight.shape[0]
    recorded = getattr(fallback_schedule, "lengths", None)  # an "auto" schedule keeps the answers' lengths itself
    proposer = LookupAndDraftProposer(lookup, fallback, vocab_size, costs=shared or memory.costs,
                                      lengths=recorded or memory.answer_lengths, records_lengths=recorded is None,
                                      fallback_weighs_plain=num_speculative_tokens == "auto",
                                      pooled_survival=memory.fallback_survival,
                                      propose_seconds=memory.propose_seconds)
    return proposer, LookupAndDraftSchedule(proposer, schedule, fallback_schedule)


class LookupAndDraftProposer:
    """Each step, one of three proposals: the lookup's chain alone, where every live row has one (its match's
    continuation, at most ``lookup_length`` tokens, cut where the rest is not worth its verification, ``_chain_length``,
    or where it has no match a guess, ``PromptLookupProposer.chain``; shorter rows padded with their last token; the
    draft does not run); ``fallback``'s proposal of ``fallback_k`` tokens alone; or, under greedy decoding, both as one
    tree per row (``_union``: the draft's chain, and the lookup's continuation branching off where it differs), whose
    longest accepted path wins (``LookupAndDraftSchedule`` sets both lengths each step; the loop's k is their maximum).
    The one chosen brings tokens fastest: E / T, E = 1 + s_1 + s_2 + ... from the acceptance by position each source has
    realised (the lookup's by its match's length, ``MatchSurvival``, kept across calls; the draft's this call's recent
    steps, ``fallback_survival``, as a draft's acceptance follows the text: high in a math answer, low in a story, after
    a prior of two steps at the pair's record across calls, ``pooled_survival``; each E one standard error optimistic
    (``PositionSurvival.expected``), so that a match class the draft outbids at its prior gets tried; the lookup's
    scaled by the share of its pooled promise that this call's lookup steps brought, ``lookup_yield``: in an answer that
    does not repeat its prompt, short matches fail step after step where the pooled record says they copy; for both, the
    draft's E and what the lookup's branch adds beyond it, position i surviving where either does as if independent,
    that addition scaled by the share of it this call's steps of both realised, ``both_yield``: where the two agree, as
    in an answer whose every token the draft foresees, the branch adds nothing and the tree is only wider), T = the
    proposer's measured time a step (the draft's exclude its catch-up; the pair's, kept across calls: a call that
    started from none took the draft at no cost until it ran) + the target's verification of the step's width
    (``costs``, the pair's: measured by width, interpolated between, flat beyond). A proposer that runs the draft also
    pays the draft's catch-up on the tokens its cache lacks (``costs.catch_up_token`` a token, the pair's: measured on
    the draft's first step of a call, the prompt), spread over the tokens the draft should serve
    (``_draft_tokens_ahead``): it is paid once, and the tokens the draft proposes after it gain from it; as it is paid
    in full before any of them is judged, the draft is weighed there at its mean acceptance, not the optimistic one (as
    ``AutoLength`` weighs a catch-up), unless its schedule has judged the catch-up itself (``fallback_weighs_plain``:
    at its mean, from calls whose text suited it less, it lost to a guess by a hair every step and never ran, math
    1.44x against "auto" alone's 2.89x); how many the call should still make is what earlier calls made beyond this
    point (``lengths``, the pair's ``AnswerLengths``, where ``records_lengths`` this proposer records each call's
    length: a RAG answer stops long before ``max_new_tokens``), or what it may still make where no earlier call went
    this far.
    Where that catch-up is what makes the draft lose, and the lookup has nothing better, the step is plain ("plain": the
    draft keeps its k for the steps it runs), unless the draft's schedule weighs plain decoding itself
    (``fallback_weighs_plain``, "auto": its k > 0 already says the step, catch-up included, pays or is a probe worth
    its cost; made plain at the draft's mean here, in float32 the draft never ran: math 0.96x against "auto" alone's
    1.23x). A chain is deterministic: under sampling its q is one-hot, so the speculative sampling rule keeps the
    target's distribution; the tree of both is proposed under greedy decoding only, as the draft's sampled chain
    needs its q. ``source``: what proposed last ("lookup", "fallback", "both" or
    "plain")."""

    hidden_layers = ()

    def time_compiled_steps(self):
        return time_compiled_steps(self.fallback)

    def __init__(self, lookup: PromptLookupProposer, fallback: Proposer, vocab_size: int,
                 fallback_survival: PositionSurvival | None = None, costs: Costs | None = None,
                 lengths: AnswerLengths | None = None, records_lengths: bool = False,
                 pooled_survival: PositionSurvival | None = None, propose_seconds: dict[str, float] | None = None,
                 fallback_weighs_plain: bool = False):
        self.lookup, self.fallback, self.vocab_size = lookup, fallback, vocab_size
        # the fallback's schedule weighs its steps, the draft's catch-up included, against plain decoding itself
        # ("auto": ``AutoLength``, which probes where only its optimism says the draft could pay)
        self.fallback_weighs_plain = fallback_weighs_plain
        self.name = f"{fallback.name}+lookup"
        self.pooled_survival = pooled_survival  # the draft's acceptance by position across calls (the pair's)
        self.fallback_survival = fallback_survival or PositionSurvival(memory=FALLBACK_MEMORY, after=pooled_survival)
        self.costs = costs or Costs()  # the target's verification time by width (the pair's, shared)
        self.lengths = lengths or AnswerLengths()  # what earlier calls made (the pair's, shared)
        self.records_lengths = records_lengths
        # "draft" (a step it ran in) and "lookup" (alone), smoothed: the pair's, kept across calls as ``costs`` are
        self.propose_seconds = {} if propose_seconds is None else propose_seconds
        self.lookup_length, self.fallback_k = 0, 0
        self.source = "fallback"
        self.fallback_proposed = 0
        self.max_new_tokens, self.tokens_left = 1, 1  # what the call may make, and still make (``start``)
        self.steps_judged, self.draft_wanted = 0, 0  # this call's steps, and those the draft was the fastest for
        self.lacking = 0  # the tokens the draft's cache lacked at the last step (its catch-up when it ran)
        # what the last step's choice weighed, each source's seconds a token: "optimistic", at the "mean", and as the
        # draft's catch-up "count"s the step (empty where the draft's schedule said plain), for reading a trace
        self.prices: dict[str, dict[str, float]] = {}
        self.lookup_yield = CallYield()  # this call's lookup steps: tokens brought against the pooled promise
        self.both_yield = CallYield()  # this call's steps of both: tokens beyond the draft's chain against the promise
        self.both_promise = 0.0  # what the last step of both promised beyond the draft's chain
        self._both: tuple[Proposal, list[set[int]], list[set[int]]] | None = None  # the tree; rows' nodes by source

    def start(self, max_new_tokens: int) -> None:
        self.max_new_tokens = self.tokens_left = max_new_tokens
        self.steps_judged, self.draft_wanted = 0, 0
        self.lookup_yield, self.both_yield = CallYield(), CallYield()
        if self.records_lengths:
            self.lengths.begin()

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        length = min(self.lookup_length, k)
        matched = (self.lookup.chain(rows, length, max_depth, length_for=self._chain_length) if length > 0
                   else [None] * len(rows))
        fallback_k = min(self.fallback_k, k, max_depth)
        covered = getattr(self.fallback, "covered", None)  # a draft model's: the committed tokens its cache holds
        self.lacking = 0 if covered is None else max(row.shape[1] - held for row, held in zip(rows, covered))
        self.source = self._choose([chain for chain in matched if chain is not None], fallback_k,
                                   both=not do_sample)
        if self.source == "plain":
            self.fallback_proposed = 0
            return Proposal(tokens=rows[0].new_empty(len(rows), 0))
        if self.source == "lookup":
            live = next(chain for chain in matched if chain is not None)
            chains = [(chain or live)[1] for chain in matched]  # a finished row's tokens are ignored
            width = max(len(chain) for chain in chains)
            tokens = torch.tensor([chain + chain[-1:] * (width - len(chain)) for chain in chains],
                                  device=rows[0].device)
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float() if do_sample else None
            return Proposal(tokens=tokens, probs=probs)
        proposal = self.fallback.propose(rows, fallback_k, logits_processor, do_sample, max_depth)
        self.fallback_proposed = proposal.k
        if self.source == "both":
            return self._union(proposal, [[] if m is None else m[1] for m in matched], do_sample)
        return proposal

    def _choose(self, live: list[tuple[int, list[int]]], fallback_k: int, both: bool) -> str:
        """"lookup", "both", "fallback" or "plain", the fastest in seconds a token: T / E, and for a proposer that runs
        the draft its catch-up spread over the tokens it should serve (``_draft_tokens_ahead``; ties: in that order;
        times not yet measured: as ``_seconds`` says). Against plain decoding (k = 0) the lookup's "auto" sizing has
        already judged its matches; plain steps are weighed only where the draft must catch up and its schedule does not
        weigh plain decoding itself (``fallback_weighs_plain``). A row with no match has a guess
        (``PromptLookupProposer.chain``): the lookup alone is a choice there only where it is faster than a plain step
        (rarely right, a guess pays only where verifying two tokens is faster than one, as in bf16 on a CPU with native
        bf16). The draft's proposals are taken one standard error optimistic, but where it must catch up (a cost paid
        before any of them is judged; unless its schedule weighed that catch-up, ``fallback_weighs_plain``) and in
        counting the steps it should serve (the evidence the catch-up is paid on), at their mean; in that count the
        lookup's chain is taken at the most each of its positions could bring (``PositionSurvival.upper``), so a step
        counts for the draft only where it beats the lookup at its best.
        (With the lookup's E one standard error up there too, the draft caught up on summarization's and RAG's long
        prompts for steps the lookup served: 0.81x the lookup there, against 0.92x-0.93x.)"""
        self.prices = {}
        if fallback_k == 0:  # the draft's schedule says plain: the lookup's chains where every row has one that pays
            if not (live and all(chain for _, chain in live)):
                return "plain"
            lookup = self._seconds_a_token(live, 0, both=False, optimistic=True)["lookup"]
            return "lookup" if self._guess_pays(live, lookup) else "plain"
        per_token = self._seconds_a_token(live, fallback_k, both, optimistic=True)
        at_mean = self._seconds_a_token(live, fallback_k, both, optimistic=False)
        counted = self._seconds_a_token(live, fallback_k, both, optimistic=False, lookup_upper=True)
        self.prices = {"optimistic": dict(per_token), "mean": at_mean, "count": counted}
        self.steps_judged += 1
        self.draft_wanted += _fastest(counted) in DRAFT_SOURCES
        catch_up = self._catch_up_seconds()
        if catch_up > 0:
            spread = catch_up / self._draft_tokens_ahead()
            # a fixed k's draft is weighed at its mean, as plain decoding is an option; "auto"'s schedule has judged
            # the catch-up worth paying, and a draft weighed at its mean against a guess may never run again
            weighed = per_token if self.fallback_weighs_plain else at_mean
            per_token.update({source: weighed[source] + spread for source in DRAFT_SOURCES if source in weighed})
        if "lookup" in per_token and not self._guess_pays(live, per_token["lookup"]):
            del per_token["lookup"]
        if catch_up > 0 and self.costs.verify and not self.fallback_weighs_plain:
            per_token["plain"] = self.costs.verify_cost(1)
        choice = _fastest(per_token)
        if choice == "both":
            draft = _position_rates(self.fallback_survival.expected(fallback_k))
            self.both_promise = sum(_beyond_draft(draft, rows) for rows in self._lookup_rates(live))
        return choice

    def _guess_pays(self, live: list[tuple[int, list[int]]], lookup_seconds: float) -> bool:
        """Whether the lookup's step at ``lookup_seconds`` a token may be taken: a step where some row guesses (no
        match) only where it is faster than a plain one, V(1) (or the narrowest width measured, not below its
        cost); with no verification measured yet, any step may."""
        guessing = any(length == 0 and chain for length, chain in live)
        return not (guessing and self.costs.verify) or lookup_seconds < self.costs.verify_cost(1)

    def _seconds_a_token(self, live: list[tuple[int, list[int]]], fallback_k: int, both: bool,
                         optimistic: bool, lookup_upper: bool = False) -> dict[str, float]:
        """Each source's seconds a token, T / E, catch-up aside; the draft's E ``optimistic`` or at its mean (the
        lookup's is always optimistic: an unseen match class gets tried; a match's scaled by ``lookup_yield``, a
        guess's not: it promises little, and ``lookup_yield`` is the matches' record)."""
        matched = [(length, chain) for length, chain in live if chain]
        draft = _position_rates(self.fallback_survival.expected(fallback_k, optimistic=optimistic))
        per_token = {"fallback": self._seconds("draft", fallback_k + 1) / (1 + sum(draft))}
        if matched:
            lookup_nodes = max(len(chain) for _, chain in matched)
            lookup = self._lookup_rates(live, lookup_upper)
            if len(matched) == len(live):
                per_token["lookup"] = self._seconds("lookup", lookup_nodes + 1) * len(live) / sum(
                    1 + sum(rows) for rows in lookup)
            if both:
                share = self.both_yield.share()
                per_token["both"] = self._seconds("draft", fallback_k + lookup_nodes + 1) * len(live) / sum(
                    1 + sum(draft) + share * _beyond_draft(draft, rows) for rows in lookup)
        return per_token

    def _lookup_rates(self, live: list[tuple[int, list[int]]], upper: bool = False) -> list[list[float]]:
        """Each row's s_1, s_2, ... for its chain (none without one): its match class's, optimistic (``upper``: each
        position at the most it could bring, ``PositionSurvival.upper``), scaled by ``lookup_yield``; a guess's
        unscaled."""
        share = self.lookup_yield.share()

        def chain_rates(length: int, chain: list[int]) -> list[float]:
            if not chain:
                return []
            record = self.lookup.survival[length]
            expected = record.upper(len(chain)) if upper else record.expected(len(chain), optimistic=True)
            return [(share if length else 1.0) * s for s in _position_rates(expected)]

        return [chain_rates(length, chain) for length, chain in live]

    def _chain_length(self, match_length: int, found: int) -> int:
        """How many of the ``found`` tokens of a match's continuation to propose: the n that brings the lookup's tokens
        fastest, E(n) / T(n), E as the choice prices a chain (its class's, one standard error optimistic, scaled by
        ``lookup_yield``), T the lookup's time and the verification of n + 1 tokens (as ``_seconds``: with none
        measured, every n costs the same and the whole continuation is proposed). A class whose first tokens are
        seldom right is not worth a wide verification for its later ones: as the lookup alone sizes a match
        (``AutoLookup.nodes_for``), not ``prompt_lookup_num_tokens`` every step (on a summary, 18 steps of the
        hybrid's lookup verified 10-token chains in 7.2 s, the lookup alone its 1-9 in 6.4 s)."""
        if match_length == 0 or found <= 1:
            return found
        share = self.lookup_yield.share()
        expected = self.lookup.survival[match_length].expected(found, optimistic=True)
        return max(range(1, found + 1),
                   key=lambda n: (1 + share * (expected[n] - 1)) / self._seconds("lookup", n + 1))

    def _lookup_promise(self, match_length: int, nodes: int) -> float:
        """The tokens of a chain of ``nodes`` the pooled record expects accepted (its mean, for ``lookup_yield``)."""
        return self.lookup.survival[match_length].expected(nodes)[-1] - 1.0

    def _observe_lookup_yield(self, accepted: list[int]) -> None:
        """What the lookup's chains brought, by row, against what they promised: the rows the lookup proposed to
        (``PromptLookupProposer.proposed``, read before its ``advance`` clears it, so a later plain step's or
        prefill's ``advance`` hears nothing)."""
        rows = [(length, nodes, brought) for (length, nodes), brought in zip(self.lookup.proposed, accepted)
                if length and nodes]  # matches only: a guess's record is its own
        self.lookup_yield.observe(sum(self._lookup_promise(length, nodes) for length, nodes, _ in rows),
                                  sum(brought for _, _, brought in rows))

    def _tokens_ahead(self) -> float:
        """The tokens the call should still make: what earlier calls made beyond this call's length, or, where none
        went this far, all it may still make."""
        ahead = self.lengths.expected_ahead(self.max_new_tokens - self.tokens_left, self.tokens_left)
        return self.tokens_left if ahead is None else ahead

    def _draft_tokens_ahead(self) -> float:
        """The tokens the draft should serve if it catches up now: those the call should still make, in the share of
        its steps where a source that runs the draft was the fastest, catch-up aside (counted this call, the
        current step included, after ``PRIOR_STEPS`` steps it was not: the catch-up is paid on evidence, as what
        it buys is unknown until the call shows how much the lookup serves). A call the lookup serves well spreads
        the draft's catch-up over few tokens."""
        share = self.draft_wanted / (self.steps_judged + PRIOR_STEPS)
        return max(self._tokens_ahead() * share, 1.0)

    def _catch_up_seconds(self) -> float:
        """The draft's time to feed what its cache lacks beyond a step's usual token (0 until measured: optimistic,
        so that the draft gets tried and its catch-up measured)."""
        per_token = self.costs.catch_up_token
        return 0.0 if per_token is None or self.lacking <= 1 else per_token * (self.lacking - 1)

    def _union(self, draft: Proposal, chains: list[list[int]], do_sample: bool) -> Proposal:
        """Each row's tree: the draft's chain (nodes (0,), (0, 0), ...), then the lookup's continuation where it
        differs, as a branch off the last node the two share (or going on below the draft's chain)."""
        tries, by_draft, by_lookup = [], [], []
        for drafted, chain in zip(draft.tokens.tolist(), chains):
            shared = next((i for i, (a, b) in enumerate(zip(drafted, chain)) if a != b),
                          min(len(drafted), len(chain)))
            paths = [(0,) * depth for depth in range(1, len(drafted) + 1)]
            branch = [(0,) * shared + ((0,) if shared == len(drafted) else (1,)) + (0,) * i
                      for i in range(len(chain) - shared)]
            tries.append((paths + branch, drafted + chain[shared:]))
            by_draft.append(set(paths))
            by_lookup.append(set(paths[:shared] + branch))
        proposal, trees = trie_proposal(tries, draft.tokens.device, do_sample)
        blocks = [{path: i + 1 for i, path in enumerate(tree.paths)} for tree in trees]
        self._both = (proposal, [{row[p] for p in paths} for row, paths in zip(blocks, by_draft)],
                      [{row[p] for p in paths} for row, paths in zip(blocks, by_lookup)])
        return proposal

    def accepted_by_source(self, live_only: bool = True) -> tuple[list[int], list[int]]:
        """After a step that proposed both: each row's accepted tokens that were the draft's and the lookup's (a
        prefix they share counts for both); ``live_only``: the rows still decoding, as the schedules hear them."""
        proposal, by_draft, by_lookup = self._both
        kept = [(path, draft, lookup) for path, draft, lookup in zip(proposal.kept, by_draft, by_lookup)
                if path or not live_only]
        return ([len(draft.intersection(path)) for path, draft, _ in kept],
                [len(lookup.intersection(path)) for path, _, lookup in kept])

    def _seconds(self, proposer: str, width: int) -> float:
        """A step's seconds: the proposer's measured time (0 until measured: optimistic, so that it is tried) and
        the target's verification of ``width`` tokens (``Costs.verify_cost``; 1 s for every width until one is
        measured)."""
        verify = self.costs.verify_cost(width) if self.costs.verify else 1.0
        return self.propose_seconds.get(proposer, 0.0) + verify

    def observe_propose_seconds(self, seconds: float, smoothing: float = 0.3) -> None:
        """The last step's proposing time, for the draft (a step it ran in) or the lookup (alone). A draft step that
        lacked more than ``CATCH_UP_MEASURED`` tokens (its first step of a call: the prompt) measures the catch-up a
        token (``costs.catch_up_token``); one that lacked more than ``STEP_FEED`` and fewer is not recorded, as its
        catch-up's cost is not known (a short catch-up costs several times a long one's rate a token: 8.3 ms at 37
        tokens, 2.6 ms at 709), and taken as the draft's step (kept across calls) it priced the draft out of every
        later call (a first call on a 61-token prompt read 0.36 s a step, against 0.12 s)."""
        if self.source == "plain":
            return
        proposer = "lookup" if self.source == "lookup" else "draft"
        if proposer == "draft" and self.lacking > CATCH_UP_MEASURED:
            step = self.propose_seconds.get("draft", 0.0)
            self.costs.observe_catch_up(max(seconds - step, 0.0) / (self.lacking - 1))
            return
        if proposer == "draft" and self.lacking > STEP_FEED:
            return
        old = self.propose_seconds.get(proposer)
        self.propose_seconds[proposer] = seconds if old is None else (1 - smoothing) * old + smoothing * seconds

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        self.tokens_left -= 1 + min(accepted, default=0)
        if self.records_lengths:
            self.lengths.record(self.max_new_tokens - self.tokens_left)
        if self.source == "lookup":
            self._observe_lookup_yield(accepted)
            self.lookup.advance(accepted)
            return
        if self.source == "both":
            by_draft, by_lookup = self.accepted_by_source(live_only=False)
            beyond = sum(max(path - own, 0) for path, own in zip(accepted, by_draft))  # tokens past the draft's
            self.both_yield.observe(self.both_promise, beyond)
            self._observe_lookup_yield(by_lookup)
            self.lookup.advance(by_lookup)
            self._both = None
            accepted = by_draft  # the draft hears its own tokens
        if self.fallback_proposed:
            for row_accepted in accepted:
                self.fallback_survival.observe(self.fallback_proposed, row_accepted)
                if self.pooled_survival is not None:
                    self.pooled_survival.observe(self.fallback_proposed, row_accepted)
        self.fallback_proposed = 0
        self.fallback.advance(accepted, target_hidden)


def _fastest(per_token: dict[str, float]) -> str:
    """The source with the fewest seconds a token (ties: in ``SOURCES`` order)."""
    return min(SOURCES, key=lambda source: per_token.get(source, math.inf))


def _position_rates(expected: list[float]) -> list[float]:
    """s_1, s_2, ...: the chance each position is accepted, from E(0), E(1), ..."""
    return [after - before for before, after in zip(expected, expected[1:])]


def _beyond_draft(draft: list[float], lookup: list[float]) -> float:
    """What a tree of two chains is expected to accept beyond the draft's chain alone: position i accepted where
    either is (taken as independent), less where the draft's is."""
    width = max(len(draft), len(lookup))
    draft, lookup = draft + [0.0] * (width - len(draft)), lookup + [0.0] * (width - len(lookup))
    return sum(b * (1 - a) for a, b in zip(draft, lookup))


class LookupAndDraftSchedule(Schedule):
    """The two schedules of ``LookupAndDraftProposer``: ``lookup`` sets the lookup's length each step, ``fallback`` the
    other proposer's k; each hears the steps its proposer took (and the other's as plain steps it did not time; a
    step of both: each its own accepted tokens); the verification's time by width goes to the proposer's
    ``costs``, unless the schedule that took the step records it there itself (the "auto" schedules).
    The loop gets the larger of the two: when it is 0, as at the start of "auto", the step is plain whoever would
    propose (the prefill may then score it)."""

    def __init__(self, proposer: LookupAndDraftProposer, lookup: Schedule, fallback: Schedule):
        self.proposer, self.lookup, self.fallback = proposer, lookup, fallback

    @property
    def measures(self) -> bool:
        return self.lookup.measures or self.fallback.measures

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        self.proposer.start(max_new_tokens)
        self.lookup.start(prompt_length, max_new_tokens)
        self.fallback.start(prompt_length, max_new_tokens)

    def next(self) -> int:
        self.proposer.lookup_length, self.proposer.fallback_k = self.lookup.next(), self.fallback.next()
        return max(self.proposer.lookup_length, self.proposer.fallback_k)

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        proposer = self.proposer
        if proposer.source == "both":  # each hears its own proposals; the verification's width is neither's
            by_draft, by_lookup = proposer.accepted_by_source()
            self.fallback.observe(proposer.fallback_proposed, by_draft, propose_s, None, confidence)
            self.fallback.observe_beyond(min(accepted, default=0) - min(by_draft, default=0))
            self.lookup.observe(0, by_lookup, 0.0, None, confidence)
            took = None
        else:
            took, other = ((self.lookup, self.fallback) if proposer.source == "lookup"
                           else (self.fallback, self.lookup))
            took.observe(k, accepted, propose_s, verify_s, confidence)
            other.observe(0, accepted, 0.0, None, confidence)
        if verify_s is not None and getattr(took, "costs", None) is not proposer.costs:
            proposer.costs.observe_verify(k + 1, verify_s)
        if k > 0 and propose_s is not None:  # the step that carried the prompt too: its catch-up is what it measures
            proposer.observe_propose_seconds(propose_s)
