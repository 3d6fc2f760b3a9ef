"""The op-by-op report of where a verified block can differ from one-token decode steps."""
import torch

from bitwise_report import compare, format_reports, model_logits_equal, op_reports
from hf_spec.testing import tiny_causal_lm


def test_the_report_covers_every_op_of_a_decoder_and_row_wise_ops_are_equal():
    reports = op_reports(hidden=32, intermediate=64, heads=4, kv_heads=2, vocab=50, context=5, ks=[2, 3],
                         dtype=torch.bfloat16)
    ops = [r.op for r in reports]
    assert ops[:5] == ["linear q_proj / o_proj", "linear k_proj / v_proj", "linear gate_proj / up_proj",
                       "linear down_proj", "linear lm_head"]
    assert {"rms norm", "softmax", "attention (sdpa)"} <= set(ops)
    by_op = {r.op: r for r in reports}
    assert all(by_op["softmax"].equal.values()) and all(by_op["rms norm"].equal.values())  # one row at a time
    assert all(r.block_ms > 0 and r.rows_ms > 0 for r in reports)
    table = format_reports(reports, [2, 3])
    assert "k=2" in table and "rows/block" in table


def test_compare_reports_a_difference():
    # a "block" op that sums over the whole block differs from one position at a time, and is reported so
    report = compare("cumulative", "-", lambda x: x.cumsum(0), lambda x, i: x[i : i + 1], lambda k: torch.ones(k, 2),
                     [1, 2])
    assert report.equal == {1: True, 2: False}


def test_the_whole_model_check_runs_on_a_tiny_bf16_model_and_tells_a_block_that_differs():
    model = tiny_causal_lm("llama", seed=0, dtype=torch.bfloat16)
    equal = model_logits_equal(model, context=6, ks=[1, 4])
    assert equal[1] is True  # one token is one decode step
    assert set(equal) == {1, 4}
    # logits that move by a few bf16 steps wherever a forward holds several tokens: a block of 4 differs from its 4
    # one-token steps, a block of 1 does not, and the check must say exactly that
    hook = model.lm_head.register_forward_hook(lambda module, args, out: out + (out.shape[1] > 1) * 2 ** -4)
    try:
        assert model_logits_equal(model, context=6, ks=[1, 4]) == {1: True, 4: False}
    finally:
        hook.remove()
