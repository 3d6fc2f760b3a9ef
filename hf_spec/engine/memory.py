"""What "auto" schedules keep across calls, per (target, proposer) pair on one device and dtype."""
from __future__ import annotations

from dataclasses import dataclass, field

from .auto import ProbeCadence
from .costs import Costs
from .estimates import AnswerLengths, ConfidenceCalibration


@dataclass
class PairMemory:
    """What "auto" keeps for one (target, draft, Medusa heads, EAGLE draft or prompt lookup) pair on one device and
    dtype, across calls."""

    costs: Costs = field(default_factory=Costs)
    calibration: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    realised: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    head_accuracy: object = None  # Medusa heads: a hf_spec.medusa.accuracy.HeadAccuracy
    tree_confidence: object = None  # EAGLE: a hf_spec.eagle.auto.TreeConfidence
    probe_cadence: ProbeCadence = field(default_factory=ProbeCadence)  # Medusa's and EAGLE's auto: plain steps
    lookup_survival: object = None  # prompt lookup's: a hf_spec.lookup.auto.MatchSurvival
    answer_lengths: AnswerLengths = field(default_factory=AnswerLengths)

    def calibration_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.calibration.setdefault(do_sample, ConfidenceCalibration())

    def realised_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.realised.setdefault(do_sample, ConfidenceCalibration.of_predictions())


_MEMORY: dict[tuple, PairMemory] = {}


def _model_key(model) -> tuple:
    if isinstance(model, str):  # a proposer without weights (prompt lookup)
        return (model,)
    config = getattr(model, "config", None)
    if config is None:  # Medusa heads
        return (getattr(model, "name_or_path", None) or id(model), str(next(model.parameters()).device))
    quantization = getattr(config, "quantization_config", None) or getattr(model, "hf_spec_quantization", None)
    return (model.name_or_path or id(model), str(model.device), str(model.dtype), str(quantization))


def pair_memory(target, draft, cache_costs: bool = True) -> PairMemory:
    """The memory kept for this (target, draft) pair on this device and dtype, or a fresh one. ``draft``: a model,
    Medusa heads, or a name for a proposer without weights (e.g. "prompt_lookup")."""
    if not cache_costs:
        return PairMemory()
    return _MEMORY.setdefault((_model_key(target), _model_key(draft)), PairMemory())
