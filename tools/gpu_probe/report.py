"""The text of one model's result: a header, the diffs per step, the headline lines."""

from __future__ import annotations

from typing import Any


def headline(result: dict[str, Any]) -> str:
    """A few lines per model for the end of the output: peaks and the four largest differences."""
    real, est = result.get("real", {}), result.get("estimate", {})
    lines = [
        f"{result['model']} (transformers {result.get('transformers')}): {result.get('stage')}"
        + (f"  ERROR {result['error']}" if result.get("error") else ""),
        f"  real step peaks {[p[0] for p in real.get('step_peaks', [])]} untagged "
        f"{[p[0] for p in real.get('plain_step_peaks', [])]} fixture {real.get('fixture_step_peaks')}"
        f" estimate {est.get('step_peaks')}; attention {real.get('attn_impl')}: {sorted(real.get('attention_ops', {}))}",
    ]
    for s in result.get("steps", []):
        top = "; ".join(f"{r['key']} {r['delta']:+,}" for r in s["by_key"][:4])
        lines.append(
            f"  step {s['step']} real-est {s['delta_exact']:+,} (blocks {s['delta_rounded']:+,}): {top}"
        )
    return "\n".join(lines)


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
    jumps = result.get("gap_jumps") or []
    if jumps:
        lines.append("-- where real - estimate of the peak inside a module's forward/backward changes most:")
        lines.append("            jump     to real - est             real              est  module")
        lines += [
            f"   {j['jump']:+15,} {j['gap']:+16,} {j['real']:16,} {j['est']:16,}  {j['module']}"
            for j in jumps
        ]
    return "\n".join(lines)
