"""The text of one model's result: a header, the diffs per step, the headline lines."""

from __future__ import annotations

from typing import Any

from .alloc_check import summary_line


def headline(result: dict[str, Any]) -> str:
    """A few lines per model for the end of the output: peaks and the four largest differences."""
    real, est = result.get("real", {}), result.get("estimate", {})
    lines = [
        f"{result['model']} (transformers {result.get('transformers')}): {result.get('stage')}"
        + (f"  ERROR {result['error']}" if result.get("error") else ""),
        f"  real step peaks {[p[0] for p in real.get('step_peaks', [])]} untagged "
        f"{[p[0] for p in real.get('plain_step_peaks', [])]} fixture {real.get('fixture_step_peaks')}"
        f" estimate {est.get('step_peaks')}; attention {real.get('attn_impl')}: {_ops(real.get('attention_ops', {}))}",
    ]
    for s in result.get("steps", []):
        top = "; ".join(f"{r['key']} {r['delta']:+,}" for r in s["by_key"][:4])
        lines.append(
            f"  step {s['step']} real-est {s['delta_exact']:+,} (blocks {s['delta_rounded']:+,}): {top}"
        )
    if "real" in result:
        fig = result.get("allocator") or {}
        line = summary_line(
            fig, est.get("step_peaks"), est.get("slack_at_step_peaks"), est.get("reserved_peak_bytes")
        )
        lines.append(f"  {line}")
    return "\n".join(lines)


def allocator_summary(fig: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s few figures of the allocator check (all of them are in ``<model>.json``)."""
    keys = ("step", "real_peak", "clean_from_step1_peak", "clean_from_start_peak", "real_slack")
    return {
        "rates": fig.get("rates"),
        "errors": fig.get("errors"),
        "steps": [
            {**{k: s.get(k) for k in keys}, "build_slack": s["before_steps"]["slack"]}
            for s in fig.get("steps", [])
        ],
    }


def allocator_lines(fig: dict[str, Any], est: dict[str, Any]) -> list[str]:
    """The allocator check's section of the text."""
    if not fig:
        return []
    check = fig.get("check") or {}
    lines = [
        f"-- the allocator model on this trace ({fig['entries']:,} entries, config {fig['config']}, "
        f"{fig.get('live_before_trace', '?')} blocks live before it, {fig.get('guessed_block_sizes', '?')} "
        f"block sizes guessed; {fig.get('seconds')} s)"
    ]
    lines += [f"   ERROR {e}" for e in fig.get("errors", [])]
    if fig.get("rates"):
        lines.append(f"   match rates over {check.get('allocs', 0):,} allocations: {fig['rates']}")
        lines.append(
            f"   whole trace: allocated peak real {check['real_peak_allocated']:,} model {check['model_peak_allocated']:,}; "
            f"reserved real {check['real_peak_reserved']:,} model {check['model_peak_reserved']:,}; end state equal "
            f"{check['end_state_equal']}; slack at the real peak real {check['real_slack_at_peak']:,} "
            f"model {check['model_slack_at_peak']:,} ({check['live_at_peak']} live blocks)"
        )
        lines += [f"   departs: {d}" for d in fig.get("divergences", [])]
    for name in ("clean_from_start", "clean_from_step1"):
        c = fig.get(name)
        if c:
            lines.append(
                f"   {name.replace('_', ' ')}: allocated peak {c['peak_allocated']:,}, reserved peak "
                f"{c['peak_reserved']:,}, slack at its peak {c['slack_at_peak']:,}"
            )
    if fig.get("clean_from_step1") and "real_reserved_in_steps" in fig:
        lines.append(
            f"   reserved peak in the steps: real {fig['real_reserved_in_steps']:,}; the same requests from an empty "
            f"cache at step 1 {fig['clean_from_step1']['peak_reserved']:,}; estimate {_n(est.get('reserved_peak_bytes'))}"
        )
    est_slack = est.get("slack_at_step_peaks") or []
    lines.append(
        "   step  real peak (entry)             - empty cache at step 1 = delta     "
        "(from trace start)   slack: real = build + steps   estimate"
    )
    for s in fig.get("steps", []):
        clean = s.get("clean_from_step1_peak")
        whole = s.get("clean_from_start_peak")
        b, d = s["before_steps"], s["during_steps"]
        slack_est = est_slack[s["step"] - 1] if len(est_slack) >= s["step"] else None
        lines.append(
            f"   {s['step']:>4}  {s['real_peak']:>15,} ({s['entry']:>7})  {_n(clean):>15} "
            f"{_n(None if clean is None else s['real_peak'] - clean, True):>12}  {_n(whole):>15}   "
            f"{s['real_slack']:>11,} = {b['slack']:,} + {d['slack']:,}   {_n(slack_est)}"
        )
        lines.append(
            f"         live at the real peak: {b['blocks']} blocks made before the steps "
            f"({b['bytes']:,} B), {d['blocks']} during them ({d['bytes']:,} B)"
        )
        tagged = s.get("max_memory_allocated")
        if tagged is not None and tagged != s["real_peak"]:
            lines.append(
                f"         the run's max_memory_allocated() in this step: {tagged:,} ({tagged - s['real_peak']:+,})"
            )
    return lines


def _n(value: int | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+,}" if sign else f"{value:,}"


def _ops(ops: dict[str, int]) -> str:
    """``aten._softmax.default`` as ``_softmax``: the headlines stay short enough to read in a terminal."""
    return ",".join(sorted(op.removeprefix("aten.").removesuffix(".default") for op in ops))


def render(result: dict[str, Any]) -> str:
    """The text diff: a header, then per step the largest differences."""
    real, est = result.get("real", {}), result.get("estimate", {})
    lines = [
        f"== {result['model']}  [{result.get('device', '?')}; torch {result.get('torch')}; "
        f"transformers {result.get('transformers')}]",
        f"real: attention {real.get('attn_impl')} ops {real.get('attention_ops')}; step peaks "
        f"{[p[0] for p in real.get('step_peaks', [])]} (untagged {[p[0] for p in real.get('plain_step_peaks', [])]}, "
        f"fixture {real.get('fixture_step_peaks')}); "
        f"cuBLAS workspaces {real.get('cublas_workspace_bytes')}",
        f"estimate: step peaks {est.get('step_peaks')} (peak_bytes {est.get('peak_bytes')}) "
        f"at {est.get('peak_at')}; workspaces {est.get('workspace_bytes')}",
    ]
    if real and not real.get("events_with_metadata"):
        lines.append(
            "WARNING: no user metadata in the history: blocks fall under (setup)/(unlabeled) by frame"
        )
    if result.get("error"):
        lines.append(f"ERROR ({result.get('stage')}): {result['error']}")
        for part, tb in (result.get("tracebacks") or {}).items():
            lines.append(f"--- traceback ({part}), last lines:\n{tb[-1500:]}")
        if result.get("stderr_tail"):
            lines.append(f"--- stderr, last lines:\n{result['stderr_tail'][-1500:]}")
    for s in result.get("steps", []):
        lines.append(
            f"-- step {s['step']}: real - estimate at the peaks: {s['delta_exact']:+,} B "
            f"({s['real_call_peak'] or 0:,} - {s['est_call_peak'] or 0:,}), {s['delta_rounded']:+,} B in blocks rounded "
            f"(block slack real {s['real_slack']:,}, est {s['est_slack']:,})"
        )
        lines.append(f"   real peak in {s['real_at']}; estimate peak in {s['est_at']}")
        for title, rows in (
            ("by op @module", s["by_key"]),
            ("by op", s["by_op"]),
            ("by module", s["by_module"]),
        ):
            lines.append(f"   {title}:   delta            real             est   blocks(real/est)  key")
            for row in rows:
                lines.append(
                    f"   {row['delta']:+15,} {row['real']:15,} {row['est']:15,}  {row['n'][0]:>5}/{row['n'][1]:<5}  {row['key']}"
                )
        lines.append(f"   (rest of the difference outside the rows above: {s['by_key_rest']:+,} B)")
        for title, same in (
            ("the estimate inside the real peak's call", s.get("est_in_real_peak_call")),
            ("the real run inside the estimate peak's call", s.get("real_in_est_peak_call")),
        ):
            if not same:
                continue
            head = f"   {title} ({same['call']} #{same['occurrence']})"
            if same.get("missing"):
                lines.append(head + ": no such call there")
                continue
            lines.append(
                f"{head}: {same['other_rounded']:,} B in blocks (call peak {same['other_call_peak']}); "
                f"real - estimate {same['delta_rounded']:+,}"
            )
            lines += [
                f"   {r['delta']:+15,} {r['real']:15,} {r['est']:15,}  {r['key']}" for r in same["by_key"]
            ]
    lines += allocator_lines(result.get("allocator") or {}, est)
    jumps = result.get("gap_jumps") or []
    if jumps:
        lines.append("-- where real - estimate of the peak inside a module's forward/backward changes most:")
        lines.append("            jump     to real - est             real              est  module")
        lines += [
            f"   {j['jump']:+15,} {j['gap']:+16,} {j['real']:16,} {j['est']:16,}  {j['module']}"
            for j in jumps
        ]
    return "\n".join(lines)
