"""What every strategy's ``custom_generate`` callable does first: check the call and keep what it needs.

transformers hands a ``custom_generate`` callable the prepared inputs (``input_ids``, logits processors,
stopping criteria, the generation config, the cache among ``model_kwargs``) but keeps ``streamer`` and
``tokenizer`` for itself, so ``strategy=`` passes them as ``token_streamer`` and ``target_tokenizer``
(``hf_spec.registration``). ``DecodingCall.of`` refuses what no strategy can do losslessly and warns about
what a strategy ignores (per option: ``hf_spec.engine.options``), adds the stop-string criterion
``generate()`` would have built, and finds the prompts' padding: the one preamble.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, StopStringCriteria, StoppingCriteriaList

from .cache import CACHE_KEYS, static_capacity
from .options import check_options
from .runner import padding_mask_of


@dataclass
class DecodingCall:
    """One ``generate()`` call as the loop runs it."""

    strategy: str
    model: object  # the target, a transformers causal LM
    input_ids: torch.LongTensor  # [batch, prompt_len], left-padded
    logits_processor: LogitsProcessorList
    stopping_criteria: StoppingCriteriaList  # the stop-string criterion included
    generation_config: GenerationConfig
    padding_mask: torch.Tensor | None  # [batch, prompt_len], or None when nothing is padded
    streamer: object | None
    model_kwargs: dict  # what generate() prepared (the cache among them)

    @classmethod
    def of(cls, strategy: str, model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
           stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *, token_streamer=None,
           stop_strings=None, target_tokenizer=None, own_options: tuple[str, ...] = (),
           **model_kwargs) -> "DecodingCall":
        """``own_options``: generation options the strategy itself reads (e.g. prompt lookup's), not checked."""
        check_supported(model, input_ids, generation_config, strategy, model_kwargs, own_options)
        if token_streamer is not None and input_ids.shape[0] > 1:
            raise ValueError("Streamers take one row: stream a batch of 1, or drop streamer= for batches.")
        stopping_criteria = with_stop_strings(stopping_criteria, stop_strings, target_tokenizer)
        return cls(strategy, model, input_ids, logits_processor, stopping_criteria, generation_config,
                   padding_mask_of(model_kwargs), token_streamer, model_kwargs)

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def do_sample(self) -> bool:
        return bool(self.generation_config.do_sample)

    @property
    def prepared_cache(self):
        """The cache generate() prepared or was given (under whichever name), before the loop takes it; or None."""
        return next((self.model_kwargs[key] for key in CACHE_KEYS if self.model_kwargs.get(key) is not None), None)

    @property
    def cache_capacity(self) -> int | None:
        """The slots of the static cache generate() prepared (``cache_implementation="static"``) or was given; None
        for a cache that grows. The models beside the target get static caches too."""
        return static_capacity(self.prepared_cache)

    @property
    def compile_config(self):
        """The ``CompileConfig`` of the decoding steps where plain generate() would compile them, by transformers' own
        rule (``_valid_auto_compile_criteria``: a compilable cache, a static one, on CUDA, or on any device where the
        config's ``_compile_all_devices`` says so; never with ``disable_compile``, quantizers that cannot, or offloaded
        weights); else None."""
        cache = self.prepared_cache
        if cache is None or not self.model._valid_auto_compile_criteria(
                {key: cache for key in CACHE_KEYS}, self.generation_config):
            return None
        return self.generation_config.compile_config or self.model._default_compile_config()


def check_supported(model, input_ids: torch.LongTensor, generation_config: GenerationConfig, strategy: str,
                    model_kwargs: dict | None = None, own_options: tuple[str, ...] = ()) -> None:
    """Refuse what the loop cannot do losslessly, with what to do instead; warn about what it ignores."""
    if model.config.is_encoder_decoder:
        raise ValueError(f"strategy={strategy!r} supports decoder-only models; {type(model).__name__} is an "
                         "encoder-decoder model. Generate without `strategy`.")
    check_options(generation_config, model_kwargs or {}, strategy, own_options)


def with_stop_strings(stopping_criteria: StoppingCriteriaList, stop_strings, tokenizer) -> StoppingCriteriaList:
    """Add the stop-string criterion that generate() builds itself but cannot for custom_generate callables."""
    if not stop_strings:
        return stopping_criteria
    if tokenizer is None:
        raise ValueError("stop_strings need the target's tokenizer: pass tokenizer= to generate().")
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    return StoppingCriteriaList([*stopping_criteria, StopStringCriteria(tokenizer, stop_strings)])
