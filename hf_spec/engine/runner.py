"""A model with its own KV cache over a prefix of the committed sequence: feed new tokens, get logits."""
from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
from transformers.cache_utils import Cache

from ..verify.backends import compact_layer_torch
from .cache import cache_kwargs, keep_path, rollback, static_capacity
from .compiled import StepPaths, step_paths
from .placement import execution_device


@functools.lru_cache(maxsize=None)
def takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def padding_mask_of(model_kwargs: dict) -> torch.Tensor | None:
    """The prompts' 2D attention mask [batch, prompt_len], or None when nothing is padded."""
    mask = model_kwargs.get("attention_mask")
    if mask is None:
        return None
    if mask.dim() != 2:
        raise ValueError(f"attention_mask must be 2D [batch, prompt_len]; got shape {tuple(mask.shape)}.")
    if bool(mask.all()):
        return None
    if not bool(mask[:, -1].all()):
        raise ValueError("The prompts are right-padded (attention_mask ends in 0 in some row): decoder-only "
                         "models generate after the last token, so pad on the left (tokenizer.padding_side = "
                         "'left').")
    return mask


STEP_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # the widths a compiled step runs at (a block padded to the next)


def _padded_block(tokens: torch.LongTensor, width: int, valid, tree_mask, tree_depths):
    """A block of n tokens [batch, n] padded to ``width``: pad entries after it, each attending the block's root and
    itself (a tree) or what a chain's causal mask gives it; nothing of the block attends them. e.g. a tree of 3
    nodes padded to 4: the mask gains a row and a column, its own row [1, 0, 0, 1]."""
    batch, n = tokens.shape
    tokens = torch.nn.functional.pad(tokens, (0, width - n))
    if valid is not None:
        valid = torch.nn.functional.pad(valid.bool(), (0, width - n), value=True)
    if tree_mask is not None:
        grown = torch.zeros(*tree_mask.shape[:-2], width, width, dtype=torch.bool, device=tree_mask.device)
        grown[..., :n, :n] = tree_mask
        grown[..., n:, 0] = True
        grown[..., range(n, width), range(n, width)] = True
        tree_mask = grown
        tree_depths = torch.nn.functional.pad(tree_depths, (0, width - n), value=1)
    return tokens, valid, tree_mask, tree_depths


class ForwardOutput(NamedTuple):
    logits: torch.Tensor  # [batch, m, vocab]
    hidden: torch.Tensor | None  # [batch, n, features] hidden states of every entry fed, when asked for


class CachedModel:
    """Runs ``model`` on tokens appended to what its ``cache`` holds, for one row or a batch of rows.

    All rows share the cache's length; an entry may be invalid in some rows (``valid`` [batch, length], None
    while every entry is valid): left padding of a prompt, a hole where a row fed fewer tokens than the others,
    or where it kept fewer of a block's tokens. Invalid entries are masked out of attention and never
    recomputed. Position ids follow plain ``generate()``: a row's valid entries are numbered from 0. A chain
    block goes through the unmodified forward with a 2D mask; a tree block with a 4D mask (each node sees the
    row's valid cache, the root and its own ancestors) and positions by depth. One unpadded row never needs a
    mask: what it rejects is cropped. ``compact_layer`` moves one layer's kept tree entries into place (one row:
    the torch reference, or the Triton kernel on CUDA, ``hf_spec.verify.backends``). On a static cache a 4D mask
    spans every slot (``capacity``), the ones past the cache's length disallowed: they hold rejected entries, which
    the next forward overwrites.

    Compiled steps (``compile_config``, where plain generate() would compile its decoding steps): a forward marked as
    a step runs through the model's compiled call (transformers' ``get_compiled_call``) on a block padded to a width
    of ``STEP_WIDTHS`` (padding after the block, attended by nothing of it, its slots dropped with the rest of the
    block's rejected ones), so that a compiled forward sees a few shapes; prefills and catch-ups run as they are. In an
    "auto" call each width runs whichever of its compiled and eager forwards times faster (``time_compiled_steps``).
    """

    def __init__(self, model, cache: Cache, batch_size: int = 1, compact_layer=compact_layer_torch, head=None,
                 compile_config=None):
        self.model = model
        self.cache = cache
        # head: a function from last hidden states to logits that replaces the model's own output layer (e.g. one
        # restricted to a draft vocabulary); the model's base then runs alone
        self.head = head
        self._network = model if head is None else model.base_model
        self.compact_layer = compact_layer
        self.device = execution_device(model)  # where its inputs go (not model.device: 'meta' when offloaded)
        self.batch_size = batch_size
        self._valid: torch.BoolTensor | None = None
        self._cache_kwargs = cache_kwargs(self._network, cache)
        self.capacity = static_capacity(cache)  # the slots of a static cache (None: it grows)
        self._step_call = None if compile_config is None else self._network.get_compiled_call(compile_config)
        # where set (an "auto" call, ``time_compiled_steps``): each step width runs the path that timed faster
        self.step_paths: StepPaths | None = None
        self._takes_logits_to_keep = head is None and takes_logits_to_keep(type(model))

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    @property
    def valid(self) -> torch.BoolTensor | None:
        """[batch, length]: which entries each row attends; None while all of them are valid."""
        return self._valid

    @valid.setter
    def valid(self, value: torch.BoolTensor | None) -> None:
        self._valid = None if value is None or bool(value.all()) else value.bool()

    def forward(self, tokens: torch.LongTensor, logits_to_keep: int = 0, valid: torch.BoolTensor | None = None,
                tree_mask: torch.BoolTensor | None = None, tree_depths: torch.LongTensor | None = None,
                hidden_layers: tuple[int, ...] = (), step: bool = False) -> ForwardOutput:
        """Feed tokens [batch, n] (``valid`` [batch, n]: False for entries that are not tokens of the row); return
        logits [batch, m, vocab] for the last ``logits_to_keep`` columns (0: all n), and with ``hidden_layers``
        the hidden states of all n entries [batch, n, len(hidden_layers) * hidden], those layers concatenated
        (indices into ``output_hidden_states``: 0 the embeddings, -1 the last, after the final norm).
        tree_mask [n, n], or [batch, n, n] for a tree per row (True: row may attend column), and tree_depths [n]
        or [batch, n] make the block a tree. ``step``: a decoding step, compiled where compiling is on."""
        tokens = tokens.to(self.device)
        width = self._step_width(tokens.shape[1]) if step and self._step_call is not None else None
        if width is None or self.step_paths is None:
            return self._forward(tokens, logits_to_keep, valid, tree_mask, tree_depths, hidden_layers, width)
        compiled = self.step_paths.compiled(width)
        with self.step_paths.timed(width, compiled, self.device):
            return self._forward(tokens, logits_to_keep, valid, tree_mask, tree_depths, hidden_layers,
                                 width if compiled else None)

    def _forward(self, tokens: torch.LongTensor, logits_to_keep: int, valid: torch.BoolTensor | None,
                 tree_mask: torch.BoolTensor | None, tree_depths: torch.LongTensor | None,
                 hidden_layers: tuple[int, ...], width: int | None) -> ForwardOutput:
        """``forward`` eagerly (``width`` None) or through the compiled call at ``width``."""
        n = tokens.shape[1]
        if width is not None and width > n:  # padded at the end: nothing of the block attends it
            tokens, valid, tree_mask, tree_depths = _padded_block(tokens, width, valid, tree_mask, tree_depths)
            output = self._forward(tokens, 0, valid, tree_mask, tree_depths, hidden_layers, width)
            keep = logits_to_keep or n
            return ForwardOutput(output.logits[:, n - keep : n],
                                 None if output.hidden is None else output.hidden[:, :n])
        valid = None if valid is None or bool(valid.all()) else valid.to(self.device, torch.bool)
        masked = self._valid is not None or valid is not None
        past, block = self._past_and_block(n, valid) if masked or tree_mask is not None else (None, None)
        if tree_mask is None:
            layout = self._chain_layout(n, past, block)
        else:
            layout = self._tree_layout(tree_mask.to(self.device), tree_depths.to(self.device), past, block)
        output = self._run(tokens, layout, logits_to_keep, hidden_layers, compiled=width is not None)
        if masked:
            self.valid = torch.cat([past, block], dim=-1)
        return output

    def time_compiled_steps(self) -> StepPaths | None:
        """Keep each compiled step width only where it times faster than the eager forward
        (``hf_spec.engine.compiled``); returns the record, or None where the steps do not compile."""
        if self._step_call is not None:
            self.step_paths = step_paths(self._network)
        return self.step_paths

    def _step_width(self, n: int) -> int:
        """The width a compiled step of n tokens runs at: the smallest of ``STEP_WIDTHS`` that holds them and fits the
        cache's free slots (else n itself)."""
        room = None if self.capacity is None else self.capacity - self.length
        return next((w for w in STEP_WIDTHS if w >= n and (room is None or w <= room)), n)

    def forward_masked(self, tokens: torch.LongTensor, attention: torch.BoolTensor,
                       positions: torch.LongTensor) -> ForwardOutput:
        """Feed tokens [batch, n] at ``positions`` [batch, n], each attending exactly the entries ``attention``
        [batch, n, length + n] allows (the cache's, then the block's); logits for all n. Validity is the caller's:
        e.g. a level of a tree grown over the cache, whose entries the caller rolls back."""
        tokens = tokens.to(self.device)
        layout = {"position_ids": positions.to(self.device), "attention_mask": self._additive(attention)[:, None]}
        return self._run(tokens, layout, 0, ())

    def _run(self, tokens: torch.LongTensor, layout: dict, logits_to_keep: int,
             hidden_layers: tuple[int, ...], compiled: bool = False) -> ForwardOutput:
        extra = {"logits_to_keep": logits_to_keep} if self._takes_logits_to_keep else {}
        if self.head is not None and hidden_layers not in ((), (-1,)):
            raise ValueError("A model scored by its own head gives its last hidden state only.")
        network = self._step_call if compiled else self._network
        outputs = network(input_ids=tokens, **layout, **self._cache_kwargs, use_cache=True,
                          output_hidden_states=bool(hidden_layers) and self.head is None, **extra)
        if self.head is not None:
            last = outputs.last_hidden_state
            logits = self.head(last[:, -logits_to_keep:] if logits_to_keep else last)
            return ForwardOutput(logits, last if hidden_layers else None)
        logits = outputs.logits
        logits = logits[:, -logits_to_keep:] if logits_to_keep else logits
        hidden = None
        if hidden_layers:
            hidden = torch.cat([outputs.hidden_states[i] for i in hidden_layers], dim=-1)
        return ForwardOutput(logits, hidden)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` entries."""
        rollback(self.cache, length)
        if self._valid is not None:
            self.valid = self._valid[:, :length]

    def keep(self, block_start: int, kept: list[list[int]]) -> None:
        """Keep the entries before ``block_start``, then, in row r, the block entries ``block_start + i`` for i in
        ``kept[r]`` (ascending), moved to follow them; rows that keep fewer than the most get holes after theirs.
        Only a tree's entries may skip block indices: in a chain, each entry saw every entry before it, so a
        chain row keeps a prefix of its block (e.g. [0, 1], never [0, 2]).

        e.g. one row, block_start 9, kept [[0, 1, 3]]: entry 12 moves to 11, then the cache is cropped to 12."""
        width = max(len(k) for k in kept)
        if any(k != list(range(len(k))) for k in kept):
            if self.batch_size == 1:
                keep_path(self.cache, block_start, block_start, kept[0], self.compact_layer)
            else:
                self._gather(block_start, kept, width)
        if self._valid is not None or any(len(k) < width for k in kept):
            valid = self._valid if self._valid is not None else torch.ones(
                self.batch_size, block_start + max(max(k, default=0) for k in kept) + 1, dtype=torch.bool,
                device=self.device)
            moved = torch.stack([self._row_validity(valid[r], block_start, k, width) for r, k in enumerate(kept)])
            self.valid = torch.cat([valid[:, :block_start], moved], dim=-1)
        rollback(self.cache, block_start + width)

    @staticmethod
    def _row_validity(row: torch.BoolTensor, block_start: int, kept: list[int], width: int) -> torch.BoolTensor:
        out = torch.zeros(width, dtype=torch.bool, device=row.device)
        if kept:
            out[: len(kept)] = row[block_start + torch.tensor(kept, device=row.device)]
        return out

    def _gather(self, block_start: int, kept: list[list[int]], width: int) -> None:
        """Move each row's kept block entries into place (rows keep different entries)."""
        index = torch.tensor([k + [k[-1] if k else 0] * (width - len(k)) for k in kept], device=self.device)
        index = index + block_start  # [batch, width]
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                source = index.to(states.device)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
                states[:, :, block_start : block_start + width] = states.gather(2, source)

    def _past_and_block(self, n: int, valid: torch.BoolTensor | None) -> tuple[torch.BoolTensor, torch.BoolTensor]:
        past = self._valid if self._valid is not None else torch.ones(
            self.batch_size, self.length, dtype=torch.bool, device=self.device)
        block = valid if valid is not None else torch.ones(self.batch_size, n, dtype=torch.bool, device=self.device)
        return past, block

    def _chain_layout(self, n: int, past: torch.BoolTensor | None, block: torch.BoolTensor | None) -> dict:
        if past is None:  # every entry valid: positions only
            start = self.length
            return {"position_ids": torch.arange(start, start + n, device=self.device).expand(self.batch_size, n)}
        # e.g. a row's past [0, 0, 1, 1] (two pads) and block [1, 1] -> positions [2, 3]
        positions = past.sum(-1, keepdim=True) + block.long().cumsum(-1) - 1
        mask = torch.cat([past, block], dim=-1).long()
        return {"position_ids": positions.clamp_(min=0), "attention_mask": mask}

    def _tree_layout(self, tree_mask: torch.BoolTensor, depths: torch.LongTensor, past: torch.BoolTensor,
                     block: torch.BoolTensor) -> dict:
        """Root at the position the row's next token would take; node at root + depth. 4D mask
        [batch, 1, n, length + n]: 0 where a query may attend, the dtype's minimum elsewhere."""
        n = tree_mask.shape[-1]
        positions = past.sum(-1, keepdim=True) + (depths if depths.dim() == 2 else depths.unsqueeze(0))
        rows_mask = tree_mask if tree_mask.dim() == 3 else tree_mask[None]
        allowed = torch.cat([past[:, None, :].expand(-1, n, -1), rows_mask & block[:, None, :]], dim=-1)
        return {"position_ids": positions, "attention_mask": self._additive(allowed)[:, None]}

    def _additive(self, allowed: torch.BoolTensor) -> torch.Tensor:
        """A boolean mask [batch, n, m] as the additive one attention takes: 0 where allowed, the dtype's minimum
        elsewhere."""
        if self.capacity is not None:  # a static cache's every slot: those past the block hold rejected entries
            allowed = torch.nn.functional.pad(allowed, (0, self.capacity - allowed.shape[-1]), value=False)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        return mask.masked_fill_(~allowed.to(self.device), torch.finfo(dtype).min)
