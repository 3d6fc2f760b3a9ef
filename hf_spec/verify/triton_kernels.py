"""Triton kernels for tree verification: acceptance (greedy and lossless sampling) and KV compaction.

Written against what Triton 3.6 and 3.9 both support; in tests they run through the Triton interpreter
(``TRITON_INTERPRET=1``) on CPU tensors. The torch references they must equal are
``hf_spec.verify.tree`` and ``hf_spec.verify.backends.compact_layer_torch``.

KV compaction is race-free by construction: program (row, chunk) owns the slice
``cache[row, :, chunk]`` of one layer and no other program touches it; inside a program the moves run
in ascending order, and every move writes at or below its own source (accepted block indices only
grow), so a position is always read by its own move before a later move overwrites it:
e.g. accepted nodes [0, 2, 3] move 2 -> 1 (reads 2) and then 3 -> 2 (writes 2).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_argmax_kernel(scores, out, vocab, stride_row, BLOCK: tl.constexpr):
    """out[row] = the first index of the row's maximum (torch.argmax's tie-breaking)."""
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    best_value = -float("inf")
    best_index = 0
    for start in range(0, vocab, BLOCK):
        index = start + offsets
        values = tl.load(scores + row * stride_row + index, mask=index < vocab, other=-float("inf")).to(tl.float32)
        chunk_max = tl.max(values, 0)
        chunk_index = start + tl.argmax(values, 0, tie_break_left=True)
        better = chunk_max > best_value  # strict: an equal later maximum keeps the earlier index
        best_index = tl.where(better, chunk_index, best_index)
        best_value = tl.where(better, chunk_max, best_value)
    tl.store(out + row, best_index)


@triton.jit
def _greedy_path_kernel(target_tokens, node_tokens, parents, retrieve, out, num_leaves,
                        DEPTH: tl.constexpr, BLOCK_LEAVES: tl.constexpr):
    """out = [best leaf row, accepted length, bonus token]: the longest run of nodes equal to the target's
    argmax at their parent, first leaf on ties."""
    rows = tl.arange(0, BLOCK_LEAVES)
    in_range = rows < num_leaves
    alive = in_range
    length = tl.zeros([BLOCK_LEAVES], dtype=tl.int32)
    for d in tl.static_range(DEPTH):
        node = tl.load(retrieve + rows * DEPTH + d, mask=in_range, other=-1)
        valid = in_range & (node >= 0)
        safe = tl.where(valid, node, 1)
        token = tl.load(node_tokens + safe - 1, mask=valid, other=-1)
        parent = tl.load(parents + safe - 1, mask=valid, other=0)
        expected = tl.load(target_tokens + parent, mask=valid, other=-2)
        alive = alive & valid & (token == expected)
        length += alive.to(tl.int32)
    length = tl.where(in_range, length, -1)
    best = tl.argmax(length, 0, tie_break_left=True)
    best_length = tl.max(length, 0)
    last = tl.load(retrieve + best * DEPTH + tl.maximum(best_length - 1, 0))
    last = tl.where(best_length > 0, last, 0)
    tl.store(out + 0, best)
    tl.store(out + 1, best_length)
    tl.store(out + 2, tl.load(target_tokens + last))


@triton.jit
def _sample_walk_kernel(probs, node_tokens, child_start, child_count, uniforms, accepted, out, vocab, stride_row,
                        DEPTH: tl.constexpr, MAX_CHILDREN: tl.constexpr, BLOCK_CHILDREN: tl.constexpr,
                        BLOCK: tl.constexpr):
    """The lossless tree sampling walk (see sample_accept_tree), then the bonus token from the residual.
    accepted[:n] = accepted block indices; out = [n, bonus token]."""
    current = tl.full([], 0, tl.int64)
    num_accepted = tl.full([], 0, tl.int64)
    draw = tl.full([], 0, tl.int64)
    done = tl.full([], 0, tl.int32)
    for _ in tl.static_range(DEPTH + 1):
        start = tl.load(child_start + current)
        count = tl.load(child_count + current)
        remaining = tl.full([], 1.0, tl.float32)
        chosen = tl.full([], -1, tl.int64)
        for c in tl.static_range(MAX_CHILDREN):
            active = (done == 0) & (c < count) & (chosen < 0)
            kid = start + c
            token = tl.load(node_tokens + kid - 1, mask=active, other=0)
            p = tl.load(probs + current * stride_row + token, mask=active, other=0.0)
            u = tl.load(uniforms + draw, mask=active, other=1.0)
            take = active & (u * remaining < p)
            chosen = tl.where(take, kid, chosen)
            remaining = tl.where(active & (chosen < 0), remaining - p, remaining)
            draw = tl.where(active, draw + 1, draw)
        moved = (done == 0) & (chosen >= 0)
        tl.store(accepted + num_accepted, chosen, mask=moved)
        num_accepted = tl.where(moved, num_accepted + 1, num_accepted)
        done = tl.where(chosen < 0, 1, done)
        current = tl.where(moved, chosen, current)

    # the bonus token: inverse CDF of p[current] with its (rejected) children zeroed
    kids = tl.arange(0, BLOCK_CHILDREN)
    start = tl.load(child_start + current)
    count = tl.load(child_count + current)
    kid_tokens = tl.load(node_tokens + start + kids - 1, mask=kids < count, other=-1)
    offsets = tl.arange(0, BLOCK)
    total = tl.full([], 0.0, tl.float32)
    for chunk in range(0, vocab, BLOCK):
        index = chunk + offsets
        values = tl.load(probs + current * stride_row + index, mask=index < vocab, other=0.0)
        rejected = tl.sum((index[:, None] == kid_tokens[None, :]).to(tl.int32), 1) > 0
        total += tl.sum(tl.where(rejected, 0.0, values), 0)
    zero_rejected = total > 0  # no residual mass left: sample from p itself (as the reference does)
    if total <= 0:
        total = tl.full([], 0.0, tl.float32)
        for chunk in range(0, vocab, BLOCK):
            index = chunk + offsets
            total += tl.sum(tl.load(probs + current * stride_row + index, mask=index < vocab, other=0.0), 0)
    threshold = tl.load(uniforms + draw) * total
    running = tl.full([], 0.0, tl.float32)
    found = tl.full([], 0, tl.int64) + vocab
    for chunk in range(0, vocab, BLOCK):
        index = chunk + offsets
        values = tl.load(probs + current * stride_row + index, mask=index < vocab, other=0.0)
        rejected = tl.sum((index[:, None] == kid_tokens[None, :]).to(tl.int32), 1) > 0
        values = tl.where(rejected, tl.where(zero_rejected, 0.0, values), values)
        cumulative = tl.cumsum(values, 0) + running
        hit = (cumulative > threshold) & (index < vocab)
        first = tl.min(tl.where(hit, index, vocab), 0)
        found = tl.minimum(found, first)
        running += tl.sum(values, 0)
    tl.store(out + 0, num_accepted)
    tl.store(out + 1, tl.minimum(found, vocab - 1))


@triton.jit
def _compact_kernel(keys, values, sources, destinations, num_moves, head_dim, stride_row, stride_seq,
                    BLOCK_D: tl.constexpr):
    """For one layer viewed as [rows, seq, head_dim]: cache[row, destinations[i]] = cache[row, sources[i]],
    i ascending, for the keys and the values."""
    row = tl.program_id(0)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = dims < head_dim
    for i in range(num_moves):
        src = tl.load(sources + i)
        dst = tl.load(destinations + i)
        k = tl.load(keys + row * stride_row + src * stride_seq + dims, mask=mask)
        v = tl.load(values + row * stride_row + src * stride_seq + dims, mask=mask)
        tl.store(keys + row * stride_row + dst * stride_seq + dims, k, mask=mask)
        tl.store(values + row * stride_row + dst * stride_seq + dims, v, mask=mask)


def _next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def greedy_accept_tree(target_scores: torch.Tensor, node_tokens: torch.LongTensor, parents: torch.LongTensor,
                       retrieve: torch.LongTensor) -> tuple[list[int], torch.Tensor]:
    """Same contract as ``hf_spec.verify.tree.greedy_accept_tree``."""
    device = target_scores.device
    scores = target_scores.contiguous()
    num_blocks, vocab = scores.shape
    target_tokens = torch.empty(num_blocks, dtype=torch.int64, device=device)
    _row_argmax_kernel[(num_blocks,)](scores, target_tokens, vocab, scores.stride(0), BLOCK=1024)
    retrieve = retrieve.to(device=device, dtype=torch.int64).contiguous()
    out = torch.empty(3, dtype=torch.int64, device=device)
    _greedy_path_kernel[(1,)](target_tokens, node_tokens.to(device).contiguous(), parents.to(device).contiguous(),
                              retrieve, out, retrieve.shape[0], DEPTH=retrieve.shape[1],
                              BLOCK_LEAVES=_next_power_of_2(retrieve.shape[0]))
    best, length, bonus = out.tolist()
    return retrieve[best, :length].tolist(), out[2]


def sample_accept_tree(target_probs: torch.Tensor, node_tokens: torch.LongTensor, children, uniforms: torch.Tensor,
                       ) -> tuple[list[int], torch.Tensor]:
    """Same contract as ``hf_spec.verify.tree.sample_accept_tree``; children are contiguous
    block ranges in rank order (as ``build_tree_buffers`` lays them out)."""
    device = target_probs.device
    probs = target_probs.float().contiguous()
    starts = [kids[0] if kids else 0 for kids in children]
    counts = [len(kids) for kids in children]
    if any(list(kids) != list(range(start, start + len(kids))) for kids, start in zip(children, starts)):
        raise ValueError("The Triton sampling kernel needs each node's children at contiguous block indices.")
    depth = _tree_depth(children)
    accepted = torch.zeros(max(depth, 1), dtype=torch.int64, device=device)
    out = torch.empty(2, dtype=torch.int64, device=device)
    max_children = max(counts) if max(counts) > 0 else 1
    _sample_walk_kernel[(1,)](
        probs, node_tokens.to(device).contiguous(), torch.tensor(starts, device=device),
        torch.tensor(counts, device=device), uniforms.to(device=device, dtype=torch.float32).contiguous(),
        accepted, out, probs.shape[1], probs.stride(0), DEPTH=depth, MAX_CHILDREN=max_children,
        BLOCK_CHILDREN=_next_power_of_2(max_children), BLOCK=1024)
    num_accepted, _ = out.tolist()
    return accepted[:num_accepted].tolist(), out[1]


def _tree_depth(children) -> int:
    depth = [0] * len(children)
    for node, kids in enumerate(children):
        for kid in kids:
            depth[kid] = depth[node] + 1
    return max(depth)


def compact_layer(keys: torch.Tensor, values: torch.Tensor, sources: torch.Tensor, destinations: torch.Tensor) -> None:
    """In place, for keys and values [batch, heads, seq, head_dim]: position sources[i] -> destinations[i]."""
    batch, heads, _, head_dim = keys.shape
    if keys.stride(-1) != 1 or keys.stride() != values.stride() or keys.stride(0) != heads * keys.stride(1):
        raise ValueError("compact_layer needs keys and values with the same strides and a contiguous last dimension.")
    block_d = min(_next_power_of_2(head_dim), 128)
    grid = (batch * heads, triton.cdiv(head_dim, block_d))
    _compact_kernel[grid](keys, values, sources, destinations, sources.shape[0], head_dim, keys.stride(1),
                          keys.stride(2), BLOCK_D=block_d)
