"""``num_speculative_tokens="auto"`` and ``tree="auto"``: the k each step that measured costs say is fastest.

"auto" for a chain (``AutoLength``): each step picks the k in 0..max_k that maximises expected tokens per second,
  E(k) / (D(k) + V(k + 1)) with E(k) = 1 + a + a^2 + ... + a^k (``hf_spec.engine.costs``), where V(w) is the
  target's measured time to verify w tokens, D(k) = k x the draft's measured time per token (``draft_step_cost``:
  a parallel draft's is one forward, ``hf_spec.draft.parallel.ParallelLength``), and a the acceptance predicted for
  the next tokens. k = 0 is plain decoding (rate 1 / V(1)).

Where "auto" gets a while it decodes plainly: from the target itself. Every step already has the target's
distribution at each committed token; its confidence (the top probability, after the user's logits
processors) predicts whether a draft would have agreed there. ``ConfidenceCalibration`` learns, per pair
and across calls, the acceptance by confidence bin from the steps that did speculate; the prediction is a
moving average of the calibrated acceptance of the recent tokens. So plain decoding costs the draft nothing
(no probe steps, no draft prefill), and speculation starts where the text turns predictable.

That prediction is judged against what happens: speculation starts when the recent tokens were predictable,
and the next ones are less so than the average says (regression to the mean). A second calibration, by bin of
the prediction, learns from every speculative step the acceptance that followed it; ``a`` is that realised
acceptance (one standard error optimistic while a bin's record is short). Where only that optimism says a step
could pay, the step is a probe, and stakes what loses least at the mean (``best_k``). Starting again after plain
steps makes the draft catch up on every token it skipped (the whole prompt, the first time): "auto" switches only
when the time the tokens ahead should save, at the mean acceptance (not the optimistic one a step is chosen at: a
catch-up is paid in full before any proposal is judged), exceeds that catch-up; and at most at the acceptance
earlier runs begun at the same prediction realised, each run counted once (``runs``: a catch-up is one bet on a
run, where the proposals' record counts each run by its length). Both calibrations pool every text the pair
has seen, so a text whose proposals fare worse than the pooled record (prose after code) would pay for it step
after step: within a call, ``a`` is also held to what this call's own speculative steps realised
(``CallAcceptance``, one standard error optimistic, starting from the pooled prediction), so speculation that loses
stops within a few steps.

All of these records learn only from steps that speculate, so a verdict of "plain" reached early (a first text where
the draft fared badly, a first catch-up timed on a cold draft) would stand for good. ``ProbeBudget`` buys probe steps
where the records say plain, out of a share of plain decoding's time (2%: the most probes cost where nothing pays),
and refunds a probe that beat plain decoding, so that probing goes on while the records are wrong. Simulated (a
draft that fails on a first text at the same target confidence as the easy texts that follow, on a bf16 CPU's cost
curve): without probes "auto" stayed plain in 4 of 5 seeds (0.78x of k = 3); with them it caught up in every one.

max_new_tokens says when an answer must stop, not how long it is: the tokens ahead are what earlier calls that went
past this point made beyond it (``AnswerLengths``), and with no such call, as many as this call has made so far (at
most what is left and ``max_horizon``). Costs, calibrations and answer lengths are kept per (target, draft, device,
dtype) across calls (``cache_costs=False`` starts afresh).

``AutoTree`` (Medusa's ``tree="auto"``) picks the prefix size of a nested tree family the same way, from the
heads' measured accuracy; ``AutoNodes`` picks how many of a tree built afresh each step to verify, from an
estimate a strategy supplies (dynamic trees' ``hf_spec.engine.dynamic_tree``, prompt lookup's
``hf_spec.lookup.auto``). While plain decoding wins, ``ProbeCadence`` spaces the probe steps that keep a tree's estimates current.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .confidence_stop import ConfidenceStop
from .costs import Costs, best_tree_size, expected_tokens_per_step
from .estimates import AnswerLengths, CallAcceptance, ConfidenceCalibration
from .schedule import Schedule


@dataclass
class Run:
    """A run of speculative steps, from the catch-up that began it to the next plain step: the acceptance predicted
    when it began, and the call's counts of accepted and judged proposals then (``CallAcceptance``: a run is the
    part of the call's record since)."""

    prediction: float
    accepted_before: int
    judged_before: int


@dataclass
class ProbeBudget:
    """What a chain's "auto" may spend on probes: steps of ``first_k`` proposals where its records say plain.

    Its records (acceptance by confidence and by prediction, a run's acceptance, the draft's costs) learn only from
    the steps that speculate, so a verdict of "plain" would stand for good once they turned pessimistic (a first text
    where the draft fared badly, a first catch-up timed while the draft was cold), as in a process that decoded
    plainly where k = 3 gave 1.34x. Each plain step earns ``share`` of its time; a probe is bought when the balance
    covers its price at no acceptance (the draft's catch-up on what it skipped, its proposals, the wider
    verification), so probes cost at most ``share`` of plain decoding's time where nothing pays; a probe whose step
    (its catch-up aside) beats plain decoding is refunded, so that probing goes on while the records are wrong."""

    share: float = 0.02
    balance: float = 0.0

    def earn(self, plain_step_s: float) -> None:
        self.balance += self.share * plain_step_s

    def buy(self, price: float) -> bool:
        if price > self.balance:
            return False
        self.balance -= price
        return True

    def refund(self, price: float) -> None:
        self.balance += price


class AutoLength(Schedule):
    """Chooses k each step from measured costs and predicted acceptance (see the module docstring).

    calibration: acceptance by the target's confidence; realised: acceptance by the prediction made before
    a step (fresh when not given); runs: the acceptance each run of speculative steps realised, one observation
    a run, by the prediction it began at (fresh when not given; ``worth_catching_up``); draft_cost_ratio: the
    draft's cost per token as a share of V(1) until it is measured (e.g. the ratio of the parameter counts);
    catch_up_ratio: the draft's cost per skipped token (a prefill) as a share of its cost per proposed token,
    until measured; smoothing: the weight of each new token in the acceptance average; max_horizon: the most
    tokens ahead a switch to speculation is expected to pay over; first_k: the length of the steps that measure
    the draft's costs, once per pair; budget: what probes may spend (``ProbeBudget``, the pair's; fresh when not
    given); confidence_stop: where given, a step that speculates offers the draft up to ``max_k`` tokens and sets the
    rule by which it stops sooner (``hf_spec.engine.confidence_stop``; the draft's proposer reads it); the steps that
    measure or probe keep their length.
    """

    measures = True

    def __init__(self, costs: Costs, calibration: ConfidenceCalibration, max_k: int = 8,
                 draft_cost_ratio: float = 0.5, catch_up_ratio: float = 0.1, smoothing: float = 0.3,
                 max_horizon: int = 64, first_k: int = 3, realised: ConfidenceCalibration | None = None,
                 lengths: AnswerLengths | None = None, runs: ConfidenceCalibration | None = None,
                 budget: ProbeBudget | None = None, confidence_stop: ConfidenceStop | None = None):
        self.costs, self.calibration, self.max_k, self.first_k = costs, calibration, max_k, first_k
        self.confidence_stop = confidence_stop
        self.budget = budget if budget is not None else ProbeBudget()
        self.probe_price: float | None = None  # the last step chosen is a probe bought at this price
        self.realised = realised or ConfidenceCalibration.of_predictions()
        self.runs = runs or ConfidenceCalibration.of_predictions()
        self.run: Run | None = None  # the run of speculative steps under way
        self.lengths = lengths or AnswerLengths()
        self.draft_cost_ratio, self.catch_up_ratio = draft_cost_ratio, catch_up_ratio
        self.smoothing, self.max_horizon = smoothing, max_horizon
        self.acceptance = 0.5  # the confidence-calibrated prediction for the next proposals
        self.predicted_for_step = self.acceptance  # the prediction when the last step was chosen
        self.behind = 0  # committed tokens the draft has not seen
        self.made = 0  # tokens this call has committed
        self.max_new_tokens = max_horizon  # tokens the call may add
        self.in_call = CallAcceptance()  # what this call's speculative steps realised

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        self.end_run()
        self.behind, self.max_new_tokens, self.made = prompt_length, max_new_tokens, 0
        self.in_call = CallAcceptance()
        self.lengths.begin()

    @property
    def remaining(self) -> int:
        """Tokens the call may still add."""
        return self.max_new_tokens - self.made

    def expected_acceptance(self) -> float:
        """a: the acceptance that steps chosen at this prediction have realised (optimistically, while the
        record is short), at most what this call's own steps allow (``CallAcceptance``)."""
        pooled = self.realised.optimistic_rate(self.acceptance)
        return min(pooled, self.in_call.bound(pooled))

    def mean_acceptance(self) -> float:
        """a without the optimism: the mean of the same two records, for a cost paid at once (the catch-up)."""
        pooled = self.realised.rate(self.acceptance)
        return min(pooled, self.in_call.mean(pooled))

    def draft_token_cost(self) -> float:
        if self.costs.draft_token is not None:
            return self.costs.draft_token
        return self.draft_cost_ratio * self.costs.verify_cost(1)

    def catch_up_cost(self, tokens: int) -> float:
        per_token = self.costs.catch_up_token
        return tokens * (per_token if per_token is not None else self.catch_up_ratio * self.draft_token_cost())

    def survival(self, k: int, a: float | None = None) -> list[float]:
        """s_1 .. s_k at acceptance ``a`` (default: ``expected_acceptance()``)."""
        a = self.expected_acceptance() if a is None else a
        return [a ** i for i in range(1, k + 1)]

    def draft_step_cost(self, k: int, a: float | None = None) -> float:
        """D(k), the draft's time to propose k tokens: k forwards of one token (``a`` does not enter; a parallel
        draft's width does depend on it, ``ParallelLength``)."""
        return k * self.draft_token_cost()

    def expected_rate(self, k: int, a: float | None = None) -> float:
        """Expected tokens per second with k proposals (k = 0: plain decoding), at acceptance ``a`` (default:
        ``expected_acceptance()``)."""
        if k == 0:
            return 1.0 / self.costs.verify_cost(1)
        step = self.draft_step_cost(k, a) + self.costs.verify_cost(k + 1)
        return expected_tokens_per_step(self.survival(k, a)) / step

    def best_k(self) -> int:
        """The step's k. Where some k pays at the mean acceptance (``mean_acceptance``), the best at the optimistic
        one (``expected_acceptance``): erring long costs little where the step pays. Where only the optimism says a
        step could pay (a short record's benefit of the doubt), the step is a probe: of the k that could pay at the
        optimism, the one that loses least at the mean; 0 where none could pay. Where verifying k + 1 tokens costs
        several times one (float32 on a CPU), a probe of eight proposals loses about five plain tokens' time when
        the mean was right, the smallest that could pay a fraction of that."""
        plain, mean, optimistic = self.expected_rate(0), self.mean_acceptance(), self.expected_acceptance()
        ks = range(1, self.max_k + 1)
        if any(self.expected_rate(k, mean) > plain for k in ks):
            return max(ks, key=lambda k: self.expected_rate(k, optimistic))
        could_pay = [k for k in ks if self.expected_rate(k, optimistic) > plain]
        return max(could_pay, key=lambda k: self.expected_rate(k, mean)) if could_pay else 0

    def tokens_ahead(self) -> float:
        """What earlier calls made beyond this call's length (``AnswerLengths``); with no earlier call that long, as
        many as this call has made (at most what is left and max_horizon)."""
        ahead = self.lengths.expected_ahead(self.made, self.remaining)
        return min(self.made, self.remaining, self.max_horizon) if ahead is None else ahead

    def worth_catching_up(self) -> bool:
        """Would speculating over the tokens ahead save more than the draft needs to catch up on the tokens it
        skipped? Judged at the mean acceptance (``mean_acceptance``), at the best k there: the optimism that keeps
        a step's choice exploring costs at most that step, where a catch-up on a long prompt is paid in full
        before any proposal is judged. And at most at what earlier runs begun at this prediction realised
        (``runs``): a catch-up is one bet on a run, and the proposals' record counts each run by its length, so
        the long runs of code and arithmetic would vouch for the short, losing ones that prose starts at the same
        prediction."""
        a = min(self.mean_acceptance(), self.runs.rate(self.acceptance))
        best = max(self.expected_rate(k, a) for k in range(1, self.max_k + 1))
        saved_per_token = 1.0 / self.expected_rate(0) - 1.0 / best
        return saved_per_token * self.tokens_ahead() > self.catch_up_cost(self.behind - 1)

    def draft_measured(self) -> bool:
        """Whether the draft's costs are known: its catch-up on skipped tokens and its time per token."""
        return self.costs.draft_token is not None and self.costs.catch_up_token is not None

    def next(self) -> int:
        self.predicted_for_step, self.probe_price = self.acceptance, None
        if self.confidence_stop is not None:
            self.confidence_stop.thresholds = []  # a step that measures or probes keeps its length
        if 1 not in self.costs.verify:
            return 0  # measure plain decoding first
        if not self.draft_measured():
            return self.first_k  # then, once per pair, the draft's catch-up on the prompt and its cost per token
        k = self.best_k()
        if k > 0 and (self.behind <= 1 or self.worth_catching_up()):
            if self.confidence_stop is None:
                return k
            self.confidence_stop.thresholds = self.stop_thresholds(k)
            return self.max_k
        self.budget.earn(self.costs.verify_cost(1))
        price = self.probe_cost()
        if self.budget.buy(price):
            self.probe_price = price
            return self.first_k
        return 0

    def stop_thresholds(self, k: int) -> list[float]:
        """What the draft's S_j must reach to go on after its j-th token, j = 1 .. max_k - 1
        (``hf_spec.engine.confidence_stop``): going on to m > j tokens costs (m - j) c_d(1) + V(m + 1) - V(j + 1) (the
        verification's part at least 0: measured widths are noisy) and brings S_j (a + ... + a^(m - j)) tokens, a the
        next proposals' acceptance, worth it where that beats r, the tokens per second of a chain of ``k`` (the step's
        best). The threshold is the least S_j that some m makes worth it: a step of the cost curve (a compiled width
        padded to the next) is weighed against all the tokens beyond it, not one."""
        a = self.expected_acceptance()
        rate = self.expected_rate(k, a)
        return [min(((m - j) * self.draft_token_cost()
                     + max(self.costs.verify_cost(m + 1) - self.costs.verify_cost(j + 1), 0.0)) * rate
                    / sum(self.survival(m - j, a))
                    for m in range(j + 1, self.max_k + 1))
                for j in range(1, self.max_k)]

    def probe_cost(self) -> float:
        """What a probe of ``first_k`` proposals costs beyond a plain step where none is accepted: the draft's
        catch-up on the tokens it skipped, its proposals, and the wider verification."""
        k = self.first_k
        return (self.catch_up_cost(self.behind - 1) + self.draft_step_cost(k) + self.costs.verify_cost(k + 1)
                - self.costs.verify_cost(1))

    def observe_draft(self, k: int, propose_s: float) -> None:
        """The draft's time for a step of k proposals: its time per token or, where it also fed the tokens it had
        skipped (a prefill, not k proposals), its time per skipped token."""
        if self.behind > 1:
            catch_up = propose_s - k * self.draft_token_cost()
            self.costs.observe_catch_up(max(catch_up, 0.0) / (self.behind - 1))
        else:
            self.costs.observe_draft_token(propose_s / k)

    def observe_beyond(self, tokens: int) -> None:
        """Tokens the draft did not propose are made, and lacked by the draft."""
        self.made += tokens
        self.behind += tokens
        self.lengths.record(self.made)

    def end_run(self) -> None:
        """Record the run of speculative steps under way (if any) as one observation of its acceptance."""
        if self.run is not None:
            judged = self.in_call.judged - self.run.judged_before
            if judged:
                self.runs.update(self.run.prediction, (self.in_call.accepted - self.run.accepted_before) / judged)
        self.run = None

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        self.costs.observe_verify(k + 1, verify_s)
        made = 1 + (min(accepted) if accepted else 0)
        if k > 0:
            if propose_s is not None:  # None: the step compiled a shape, its time is no cost
                self.observe_draft(k, propose_s)
            if self.probe_price is not None and verify_s is not None and \
                    made / (self.draft_step_cost(k) + verify_s) > self.expected_rate(0):
                self.budget.refund(self.probe_price)  # the probe's step beat plain decoding: the records may be wrong
            if self.run is None or self.behind > 1:  # a catch-up begins a run
                self.end_run()
                self.run = Run(self.predicted_for_step, self.in_call.accepted, self.in_call.judged)
            for row_accepted, row_confidence in zip(accepted, confidence):
                for i in range(min(k, row_accepted + 1)):  # proposals 1..accepted + 1 were judged
                    self.calibration.update(row_confidence[i], i < row_accepted)
                    self.realised.update(self.predicted_for_step, i < row_accepted)
                    self.in_call.update(i < row_accepted)
            self.behind = 1
        else:  # the draft did not run: it lacks what the step made (beside a lookup, the lookup's tokens too)
            self.end_run()
            self.behind += made
        self.made += made
        self.lengths.record(self.made)
        for row_confidence in confidence:  # the committed tokens, in order (a batch: row after row)
            for c in row_confidence:
                self.acceptance += self.smoothing * (self.calibration.rate(c) - self.acceptance)


@dataclass
class ProbeCadence:
    """While plain decoding wins, a probe step after ``every`` plain steps (``streak`` counts them); ``every``
    starts at ``minimum``, doubles after each probe up to ``maximum``, and falls back to ``minimum`` when a tree
    pays. A schedule given the pair's (Medusa's and EAGLE's, from its ``PairMemory``) goes on across calls instead
    of probing anew in each; prompt lookup's starts afresh in each call, as its matches depend on the prompt (in
    float32, 13 questions: 1.05x plain, coding 1.24x and summarization 1.39x where a call's probes found the copies
    its prompt offers; with the pair's interval, 0.99x, plain on 654 of 663 steps)."""

    minimum: int = 8
    maximum: int = 128
    every: int = field(init=False)  # the interval now
    streak: int = field(init=False)

    def __post_init__(self):
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"a probe cadence needs 1 <= minimum <= maximum, got {self.minimum} and {self.maximum}")
        self.paid()

    def paid(self) -> None:
        """A tree paid: back to the shortest interval."""
        self.streak, self.every = 0, self.minimum

    def plain_step(self) -> bool:
        """Count a step where plain decoding wins; True when it is due to be a probe instead."""
        self.streak += 1
        if self.streak < self.every:
            return False
        self.streak, self.every = 0, min(2 * self.every, self.maximum)
        return True


class AutoTree(Schedule):
    """``tree="auto"`` for Medusa: how many nodes of a nested family to verify each step.

    The family is the prefixes of ``paths`` (listed most probable first, like upstream's trees). Each step
    takes the prefix size n in 0..len(paths) that maximises E(n) / (H + V(n + 1)), E(n) from the heads'
    measured accuracy by rank (``hf_spec.medusa.accuracy``), H the heads' measured time per step and V the
    target's verify cost by width; n = 0 is plain decoding (1 / V(1)). The heads' hidden state is there at
    every step, so switching costs nothing; while plain decoding wins, a probe step after 8, 16, 32, ...
    plain steps (back to 8 when one pays) keeps the accuracy estimate current.
    """

    measures = True

    def __init__(self, costs: Costs, accuracy, paths: list[tuple[int, ...]], cadence: ProbeCadence | None = None):
        self.costs, self.accuracy, self.paths = costs, accuracy, list(paths)
        self.cadence = cadence if cadence is not None else ProbeCadence()
        self.probing = False  # the last step chosen is a probe (plain decoding would have won)

    def expected(self) -> list[float]:
        """E(n), the tokens a step verifying n nodes should bring, for n = 0 .. the largest size."""
        return self.accuracy.expected_tokens(self.paths)

    @property
    def largest(self) -> int:
        return len(self.paths)

    def measured(self) -> bool:
        return self.costs.propose_step is not None

    def best_size(self, smallest: int = 0) -> int:
        return best_tree_size(self.expected(), self.costs, smallest)

    def next(self) -> int:
        self.probing = False
        if 1 not in self.costs.verify:
            return 0  # measure plain decoding first
        if not self.measured():
            return self.largest  # then the largest tree, once per pair
        n = self.best_size()
        if n > 0:
            self.cadence.paid()
            return n
        if self.cadence.plain_step():
            self.probing = True
            return self.best_size(smallest=1)
        return 0

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        self.costs.observe_verify(k + 1, verify_s)
        if k > 0 and propose_s is not None:  # None: the step compiled a shape, its time is no cost
            self.costs.observe_propose_step(propose_s)


class AutoNodes(AutoTree):
    """``AutoTree`` for a tree built afresh each step: the n of its best nodes to verify, up to ``max_nodes``, with
    E(n) from ``estimate.expected(max_nodes)`` (an object that learns it: ``TreeConfidence``, ``PositionSurvival``)."""

    def __init__(self, costs: Costs, estimate, max_nodes: int, cadence: ProbeCadence | None = None):
        super().__init__(costs, None, [], cadence)
        self.estimate, self.max_nodes = estimate, max_nodes

    def expected(self) -> list[float]:
        return self.estimate.expected(self.max_nodes)

    @property
    def largest(self) -> int:
        return self.max_nodes
