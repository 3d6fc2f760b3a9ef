"""num_speculative_tokens: one validator, one message per mistake, for every strategy that takes it; what it means,
its default and the schedule it makes are each strategy's own declaration (``SpeculationLength``)."""
import importlib
import inspect

import pytest

from hf_spec.demo import untrained_eagle_draft
from hf_spec.engine.auto import AutoLength
from hf_spec.engine.schedule import FixedLength, StepwiseLength
from hf_spec.registration import STRATEGIES

draft, eagle, lookup, medusa = (importlib.import_module(f"hf_spec.{name}.generate")
                                for name in ("draft", "eagle", "lookup", "medusa"))
BAD = [0, -1, 2.5, True, "fast", "stepwise"]


def strategy_call(name, target, drafts):
    return {"draft": dict(strategy="draft", draft_model=drafts["partly"]),
            "eagle": dict(strategy="eagle", eagle_model=untrained_eagle_draft(target)),
            "prompt_lookup": dict(strategy="prompt_lookup")}[name]


LENGTHS = {"draft": draft.LENGTH, "eagle": eagle.LENGTH, "prompt_lookup": lookup.LENGTH}


@pytest.mark.parametrize("name, value", [(name, value) for name in sorted(LENGTHS) for value in BAD
                                         if value not in LENGTHS[name].named])  # "stepwise": a draft's schedule
def test_each_bad_value_gets_the_one_message_in_each_strategy(name, value, target, drafts, prompt):
    length = LENGTHS[name]
    with pytest.raises(ValueError) as refused:
        length.check(value)
    with pytest.raises(ValueError) as in_generate:
        target.generate(**prompt, max_new_tokens=4, num_speculative_tokens=value, **strategy_call(name, target, drafts))
    assert str(in_generate.value) == str(refused.value)
    message = str(refused.value)
    assert message.startswith("num_speculative_tokens must be an int >= 1")
    assert f"for strategy={name!r} it is the {length.meaning}" in message and f"got {value!r}" in message


def test_the_messages_name_the_mistake():
    assert "(below 1)" in _message(draft.LENGTH, 0) and "(a bool, not a number)" in _message(draft.LENGTH, True)
    assert "(a float, not an int)" in _message(draft.LENGTH, 2.5)
    assert "strategy='draft' only" in _message(eagle.LENGTH, "stepwise")
    assert "'auto' or 'stepwise'" in _message(draft.LENGTH, "fast") and "'stepwise'" not in _message(lookup.LENGTH, 0)


def _message(length, value) -> str:
    with pytest.raises(ValueError) as refused:
        length.check(value)
    return str(refused.value)


def test_each_strategy_declares_its_default_in_its_signature():
    for name, length in {**LENGTHS, "medusa": medusa.LENGTH}.items():
        parameters = inspect.signature(STRATEGIES[name].generate).parameters
        if name == "medusa":  # tree= sets its nodes: it takes no num_speculative_tokens
            assert "num_speculative_tokens" not in parameters
            continue
        if name == "draft":  # None: the chain's default, or with tree= the tree's (both "auto")
            assert parameters["num_speculative_tokens"].default is None and length.default == "auto"
            assert draft.TREE_LENGTH.default == "auto"
            continue
        assert parameters["num_speculative_tokens"].default == length.default


def test_one_place_makes_the_schedule():
    made = []
    auto = lambda: made.append("auto") or AutoLength(None, None)  # noqa: E731
    assert isinstance(draft.LENGTH.schedule(3, auto), FixedLength) and draft.LENGTH.schedule(3, auto).k == 3
    assert isinstance(draft.LENGTH.schedule("stepwise", auto), StepwiseLength)
    assert isinstance(draft.LENGTH.schedule("auto", auto), AutoLength) and made == ["auto"]
    assert eagle.LENGTH.schedule("auto", auto, fixed=7).k == 7  # a static tree sets k
    with pytest.raises(ValueError, match="a static tree= sets the nodes"):
        eagle.LENGTH.schedule(4, auto, fixed=7)
