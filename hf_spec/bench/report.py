"""Aggregate bench runs into the seed article's table (plus what it lacked), JSON and a plot."""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import asdict

from ..engine.costs import FORMULA, PARALLEL_FORMULA, TREE_FORMULA, Costs, predicted_speedup, predicted_tree_speedup
from .run import Run


def summarize(runs: list[Run], costs: Costs | None, new_tokens: int, tree_nodes: dict[str, int] | None = None,
              ) -> list[dict]:
    """One row per mode (and per category with ``by_category``): tokens/s over all its runs, ratios to vanilla.
    ``tree_nodes``: the nodes a fixed tree verifies per step, by mode family ("medusa", "eagle"), for predictions."""
    rows = []
    modes = list(dict.fromkeys(run.mode for run in runs))
    vanilla_tps = _tokens_per_second([r for r in runs if r.mode == "vanilla"])
    for mode in modes:
        rows.append(_row(mode, "all", [r for r in runs if r.mode == mode], runs, vanilla_tps, costs, new_tokens,
                         tree_nodes))
    for category in dict.fromkeys(run.category for run in runs):
        in_category = [r for r in runs if r.category == category]
        category_vanilla = _tokens_per_second([r for r in in_category if r.mode == "vanilla"])
        for mode in modes:
            rows.append(_row(mode, category, [r for r in in_category if r.mode == mode], in_category,
                             category_vanilla, costs, new_tokens, tree_nodes))
    return rows


def _tokens_per_second(runs: list[Run]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(r.new_tokens for r in runs) / seconds if seconds else 0.0


def _row(mode, category, runs, all_runs, vanilla_tps, costs, new_tokens, tree_nodes=None) -> dict:
    tps = _tokens_per_second(runs)
    vanilla_by_prompt = {(r.question_id, r.repeat): r for r in all_runs if r.mode == "vanilla"}
    ratios = [(r.new_tokens / r.seconds) / (v.new_tokens / v.seconds)
              for r in runs if (v := vanilla_by_prompt.get((r.question_id, r.repeat)))]
    row = {"mode": mode, "category": category, "runs": len(runs), "tokens_per_s": tps,
           "speedup": tps / vanilla_tps if vanilla_tps else None,
           "median_prompt_speedup": statistics.median(ratios) if ratios else None,
           "equal_to_vanilla": _share([r.equal_to_vanilla for r in runs]),
           "near_ties": sum(d["near_tie"] for r in runs for d in r.differences),
           "other_differences": sum(not d["near_tie"] for r in runs for d in r.differences)}
    stats = [r.stats for r in runs if r.stats]
    if stats:
        proposed, accepted = sum(s["proposed"] for s in stats), sum(s["accepted"] for s in stats)
        total, prefill = sum(s["total_s"] for s in stats), sum(s["prefill_s"] for s in stats)
        compiling = sum(s.get("compile_s", 0.0) for s in stats)  # reported apart (runs saved before it: none)
        survival = _survival(stats)
        tokens_per_step = sum(s["accepted"] + s["bonus"] for s in stats) / sum(s["steps"] for s in stats)
        predicted = _predicted(mode, costs, stats, survival, tokens_per_step, new_tokens, tree_nodes or {})
        row.update(
            acceptance_rate=accepted / proposed if proposed else 0.0,
            tokens_per_step=tokens_per_step,
            decode_tokens_per_s=sum(s["new_tokens"] for s in stats) / (total - prefill - compiling),
            overhead_share=sum(s["overhead_s"] for s in stats) / total,
            acceptance_by_position=survival,
            k_histogram=_histogram(stats),
            predicted_speedup=predicted,
        )
    return row


def _predicted(mode, costs, stats, survival, tokens_per_step, new_tokens, tree_nodes: dict[str, int]) -> float | None:
    """The cost model's speedup for a fixed k (draft@k; parallel@k, one draft forward a step) or a fixed tree (medusa,
    eagle, draft-tree@n: the proposer's measured time per step is its H); None for the rest (the calibration times the draft modes'
    draft, not the full-precision one of draft-full@k)."""
    if costs is None or not mode.startswith(("draft@", "draft-tree@", "parallel@", "medusa", "eagle")):
        return None
    if mode.startswith(("draft@", "parallel@")):
        return predicted_speedup(costs, survival, new_tokens, parallel=mode.startswith("parallel@"))
    nodes = tree_nodes.get(mode if mode.startswith("draft-tree@") else mode.split("~")[0])
    steps = sum(s["steps"] for s in stats)
    if not nodes or not steps:
        return None
    propose_step = sum(s.get("propose_s", 0.0) for s in stats) / steps
    return predicted_tree_speedup(costs, tokens_per_step, nodes, new_tokens, propose_step)


def _survival(stats: list[dict]) -> list[float]:
    """s_i pooled over runs: accepted at position i / proposed at position i."""
    width = max(len(s["proposed_by_position"]) for s in stats)
    proposed = [sum(s["proposed_by_position"][i] for s in stats if i < len(s["proposed_by_position"])) for i in range(width)]
    accepted = [sum(s["accepted_by_position"][i] for s in stats if i < len(s["accepted_by_position"])) for i in range(width)]
    return [a / p if p else 0.0 for a, p in zip(accepted, proposed)]


def _histogram(stats: list[dict]) -> dict[int, int]:
    """How many steps proposed k tokens, pooled over runs: e.g. {0: 40, 3: 12}."""
    histogram: dict[int, int] = {}
    for s in stats:
        for k in s["k_per_step"]:
            histogram[k] = histogram.get(k, 0) + 1
    return dict(sorted(histogram.items()))


def _share(flags) -> float | None:
    flags = [f for f in flags if f is not None]
    return sum(flags) / len(flags) if flags else None


def _fmt(value, width: int, spec: str, suffix: str = "") -> str:
    """e.g. _fmt(1.234, 8, ".2f", "x") -> "   1.23x"; None -> "-" right-aligned to the same width."""
    return ("-" if value is None else format(value, spec) + suffix).rjust(width)


def format_table(rows: list[dict], category: str = "all") -> str:
    header = (f"{'mode':<14} {'tok/s':>7} {'speedup':>8} {'accept':>7} {'tok/step':>8} {'decode tok/s':>12} "
              f"{'equal':>6} {'overhead':>8} {'predicted':>9}")
    lines = [header, "-" * len(header)]
    for row in (r for r in rows if r["category"] == category):
        lines.append(
            f"{row['mode']:<14} {row['tokens_per_s']:>7.2f} {_fmt(row['speedup'], 8, '.2f', 'x')} "
            f"{_fmt(row.get('acceptance_rate'), 7, '.0%')} {_fmt(row.get('tokens_per_step'), 8, '.2f')} "
            f"{_fmt(row.get('decode_tokens_per_s'), 12, '.2f')} {_fmt(row['equal_to_vanilla'], 6, '.0%')} "
            f"{_fmt(row.get('overhead_share'), 8, '.1%')} {_fmt(row.get('predicted_speedup'), 9, '.2f', 'x')}")
    return "\n".join(lines)


def format_report(rows: list[dict], costs: Costs | None) -> str:
    parts = [format_table(rows)]
    for row in rows:
        histogram = row.get("k_histogram") if row["category"] == "all" else None
        if histogram and (row["mode"].startswith(("auto", "stepwise")) or len(histogram) > 1):
            chosen = "tree nodes" if row["mode"].startswith(("medusa", "eagle")) else "k"
            parts.append(f"{row['mode']}: {chosen} chosen per step {histogram}")
    noise = next((r for r in rows if r["mode"] == "vanilla-again" and r["category"] == "all"), None)
    if noise:
        parts.append(f"noise floor: vanilla against itself {noise['speedup']:.3f}x "
                     f"(median per prompt {noise['median_prompt_speedup']:.3f}x)")
    if costs:
        parts.append(FORMULA)
        if any(r["mode"].startswith(("medusa", "eagle")) and r.get("predicted_speedup") for r in rows):
            parts.append(TREE_FORMULA)
        if any(r["mode"].startswith("parallel@") for r in rows):
            parts.append(PARALLEL_FORMULA)
        parts.append("costs (s): c_t " + ", ".join(f"{w}:{s:.3f}" for w, s in costs.verify.items())
                     + "; c_d " + ", ".join(f"{w}:{s:.3f}" for w, s in costs.draft.items())
                     + f"; prefill target {costs.target_prefill:.3f}, draft {costs.draft_prefill:.3f}")
    parts.append("\nper category (speedup vs vanilla in that category / acceptance):")
    categories = list(dict.fromkeys(r["category"] for r in rows if r["category"] != "all"))
    modes = [r["mode"] for r in rows if r["category"] == "all" and r["mode"] != "vanilla"]
    widths = [max(16, len(mode) + 2) for mode in modes]  # a long mode name keeps a space before it
    parts.append(f"{'category':<16}" + "".join(mode.rjust(width) for mode, width in zip(modes, widths)))
    for category in categories:
        cells = []
        for mode, width in zip(modes, widths):
            row = next(r for r in rows if r["category"] == category and r["mode"] == mode)
            accept = row.get("acceptance_rate")
            cells.append(f"{_fmt(row['speedup'], 0, '.2f', 'x')} / {_fmt(accept, 0, '.0%')}".rjust(width))
        parts.append(f"{category:<16}" + "".join(cells))
    return "\n".join(parts)


def write_json(path, rows: list[dict], runs: list[Run], costs: Costs | None, settings: dict) -> None:
    with open(path, "w") as f:
        json.dump({"settings": settings, "formula": FORMULA, "costs": costs.to_dict() if costs else None,
                   "rows": rows, "runs": [asdict(r) for r in runs]}, f, indent=1)


PLOT_NEEDS = "--plot needs matplotlib: pip install 'hf-spec[bench]'"


def plot(path, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ValueError(PLOT_NEEDS) from error
    overall = [r for r in rows if r["category"] == "all" and "@" in r["mode"]]
    families = list(dict.fromkeys(r["mode"].split("@")[0] for r in overall))
    if len(overall) == len(families):  # one k a family: nothing to draw against k
        figure = plot_bars(plt, rows)
        figure.savefig(path)
        return
    figure, (speed_axis, accept_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for color, family in enumerate(families):
        family_rows = sorted((r for r in overall if r["mode"].startswith(family + "@")),
                             key=lambda r: int(r["mode"].split("@")[1]))
        ks = [int(r["mode"].split("@")[1]) for r in family_rows]
        style = {"marker": "o", "color": f"C{color % 10}", "label": family}
        speed_axis.plot(ks, [r["speedup"] for r in family_rows], **style)
        if any(r.get("acceptance_rate") is not None for r in family_rows):
            accept_axis.plot(ks, [r.get("acceptance_rate") for r in family_rows], **style)
    # modes without a fixed k (auto, eagle, medusa, lookup; vanilla-again, the noise floor) as levels across k
    levels = [r for r in rows if r["category"] == "all" and "@" not in r["mode"] and r["mode"] != "vanilla"]
    dashes = itertools.cycle([":", "-.", (0, (5, 2)), (0, (1, 3, 5, 3))])
    for color, (row, dash) in enumerate(zip(levels, dashes), start=len(families)):
        style = {"color": f"C{color % 10}", "linestyle": dash, "linewidth": 1.5, "label": row["mode"]}
        speed_axis.axhline(row["speedup"], **style)
        if row.get("acceptance_rate") is not None:
            accept_axis.axhline(row["acceptance_rate"], **style)
    speed_axis.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    speed_axis.set(xlabel="k (speculative tokens)", ylabel="speedup vs plain generate", title="speed")
    accept_axis.set(xlabel="k (speculative tokens)", ylabel="acceptance rate", title="acceptance", ylim=(0, 1))
    speed_axis.legend()
    accept_axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def plot_bars(plt, rows: list[dict]):
    """Speedup and acceptance per mode (left), speedup per mode in each category (right), as bars."""
    modes = [r["mode"] for r in rows if r["category"] == "all" and r["mode"] != "vanilla"]
    overall = {r["mode"]: r for r in rows if r["category"] == "all"}
    categories = list(dict.fromkeys(r["category"] for r in rows if r["category"] != "all"))
    figure, (speed_axis, category_axis) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=(1, 2))
    bars = speed_axis.bar(modes, [overall[m]["speedup"] for m in modes], color=[f"C{i % 10}" for i in
                                                                              range(len(modes))])
    for bar, mode in zip(bars, modes):  # the acceptance above each bar
        accept = overall[mode].get("acceptance_rate")
        if accept is not None:
            speed_axis.annotate(f"{accept:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=8)
    speed_axis.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    speed_axis.set(ylabel="speedup vs plain generate", title="overall (acceptance above the bars)")
    speed_axis.tick_params(axis="x", rotation=45)
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        values = [next(r["speedup"] for r in rows if r["category"] == c and r["mode"] == mode) for c in categories]
        category_axis.bar([j + i * width for j in range(len(categories))], values, width, color=f"C{i % 10}",
                          label=mode)
    category_axis.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    category_axis.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(categories))], categories,
                             rotation=45, ha="right")
    category_axis.set(ylabel="speedup vs plain generate", title="by category")
    category_axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
