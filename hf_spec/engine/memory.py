"""What "auto" schedules keep across calls, per (target, proposer) pair on one device and dtype."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from .auto import ProbeBudget, ProbeCadence
from .costs import Costs
from .estimates import AnswerLengths, ConfidenceCalibration, PositionSurvival
from .placement import execution_device


@dataclass
class PairMemory:
    """What "auto" keeps for one (target, draft, Medusa heads, EAGLE draft or prompt lookup) pair on one device and
    dtype, across calls."""

    costs: Costs = field(default_factory=Costs)
    calibration: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    realised: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    runs: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample: AutoLength.runs
    # by do_sample: acceptance by the draft's probability of its pick (a chain's ConfidenceStop)
    draft_confidence: dict[bool, ConfidenceCalibration] = field(default_factory=dict)
    head_accuracy: object = None  # Medusa heads: a hf_spec.medusa.accuracy.HeadAccuracy
    tree_confidence: object = None  # dynamic trees (EAGLE, a draft's): a hf_spec.engine.dynamic_tree.TreeConfidence
    probe_cadence: ProbeCadence = field(default_factory=ProbeCadence)  # Medusa's and EAGLE's auto: plain steps
    probe_budget: ProbeBudget = field(default_factory=ProbeBudget)  # a chain's auto: what its probes may spend
    lookup_survival: object = None  # prompt lookup's: a hf_spec.lookup.auto.MatchSurvival
    fallback_survival: PositionSurvival = field(default_factory=PositionSurvival)  # a draft's beside the lookup
    answer_lengths: AnswerLengths = field(default_factory=AnswerLengths)
    propose_seconds: dict[str, float] = field(default_factory=dict)  # beside the lookup: a step's, by proposer

    def calibration_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.calibration.setdefault(do_sample, ConfidenceCalibration())

    def realised_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.realised.setdefault(do_sample, ConfidenceCalibration.of_predictions())

    def runs_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.runs.setdefault(do_sample, ConfidenceCalibration.of_predictions())

    def draft_confidence_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.draft_confidence.setdefault(do_sample, ConfidenceCalibration())


class PairMemories:
    """A ``PairMemory`` per (target, proposer) pair on one device and dtype, held only while both live.

    Models are held by weak reference, not by name or ``id()``: a model built or loaded anew never inherits the
    memory of one that was discarded (Python reuses ids, and two models loaded from one path may differ), and a
    discarded model's memories go with it. A proposer without weights (e.g. "prompt_lookup") is a name. At most
    ``limit`` memories a target (beyond it, the first made go)."""

    def __init__(self, limit: int = 32):
        self.limit = limit
        self._by_target: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> (by object, by name)

    def get(self, target, proposer, variant: str = "") -> PairMemory:
        by_object, by_name = self._by_target.setdefault(target, (weakref.WeakKeyDictionary(), {}))
        if isinstance(proposer, str):
            settings = by_name.setdefault(proposer, {})
        else:
            settings = by_object.setdefault(proposer, {})
        key = (_settings(target), _settings(proposer), variant)
        if key not in settings:
            self._make_room(by_object, by_name)
            settings[key] = PairMemory()
        return settings[key]

    def _make_room(self, by_object, by_name) -> None:
        kept = [(settings, key) for group in (by_object, by_name) for settings in list(group.values())
                for key in settings]
        for settings, key in kept[: max(len(kept) - self.limit + 1, 0)]:
            del settings[key]

    def values(self) -> list[PairMemory]:
        return [memory for by_object, by_name in list(self._by_target.values())
                for group in (by_object, by_name) for settings in list(group.values()) for memory in settings.values()]

    def __len__(self) -> int:
        return len(self.values())

    def clear(self) -> None:
        self._by_target = weakref.WeakKeyDictionary()


def _settings(model) -> tuple:
    """What besides the object decides its costs: device, dtype and quantization (a name: nothing)."""
    if isinstance(model, str):
        return ()
    config = getattr(model, "config", None)
    if config is None:  # Medusa heads
        return (str(next(model.parameters()).device),)
    quantization = getattr(config, "quantization_config", None) or getattr(model, "hf_spec_quantization", None)
    return (str(execution_device(model)), str(model.dtype), str(quantization))


_MEMORY = PairMemories()


def pair_memory(target, draft, cache_costs: bool = True, variant: str = "") -> PairMemory:
    """The memory kept for this (target, draft) pair on this device and dtype, or a fresh one. ``draft``: a model,
    Medusa heads, an EAGLE draft, or a name for a proposer without weights (e.g. "prompt_lookup"); ``variant``: a
    way of proposing with that draft whose costs and acceptance are its own (e.g. "parallel": one forward for k
    tokens)."""
    if not cache_costs:
        return PairMemory()
    return _MEMORY.get(target, draft, variant)
