"""What a person reads when `rstar2-train` writes to a file (not a terminal): step lines and the
final table whole, progress lines during long phases; and plots that say what they show."""

from __future__ import annotations

import time

from rstar2_trainer.rundir import plots, report

LONG = "aime24_with_a_deliberately_long_benchmark_name"
EVALS = [
    {
        "when": "after stage stage3_long_context_budget",
        "step": 120,
        "accuracy": 0.4375,
        "problems": 512,
        "samples": 16,
        "tool_use_share": 0.97,
        "tool_error_ratio_pos": 0.0312,
        "finish_answered": 0.99,
        "response_len_mean": 11873.2,
    },
    {
        **dict.fromkeys(("accuracy", "tool_use_share"), 0.25),
        "when": "before RL",
        "step": 0,
        "benchmark": LONG,
        "problems": 30,
        "samples": 4,
    },
]


def test_the_final_table_in_a_file_is_markdown_with_every_header_and_cell_whole(
    tmp_path, capsys
) -> None:
    report.final_table(EVALS, tmp_path, tmp_path / "policy", "--n 4")
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| set"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(report.COLUMNS)
    assert "…" not in out
    at = lines.index(header)
    rule, rows = lines[at + 1], lines[at + 2 : at + 4]
    assert set(rule) <= set("|-: ") and rule.count("|") == len(report.COLUMNS) + 1
    assert rows[1].split("|")[1].strip() == LONG  # held-out sorts first, then the benchmark
    assert "after stage stage3_long_context_budget" in rows[0]
    assert "512 x 16" in rows[0] and "11873" in rows[0]
    assert len({len(line) for line in (header, rule, *rows)}) == 1  # columns line up


def test_a_step_line_in_a_file_is_one_line_whatever_its_length(capsys) -> None:
    metrics = {"reward": 0.5, "groups_kept": 30, "groups_in": 32, "tool_use_share": 0.9}
    report.step_line(12, "stage1[8k]", metrics)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and len(out) > 160
    assert "[stage1[8k]]" in out and "tool use 0.90" in out  # the stage name is not markup


def test_a_step_line_says_when_a_service_was_restarted_or_a_call_resent(capsys) -> None:
    report.step_line(3, "tiny1", {"reward": 0.5, "service_restarts": 1, "calls_retried": 4})
    report.step_line(4, "tiny1", {"reward": 0.5, "service_restarts": 0, "calls_retried": 0})
    quiet, noted = capsys.readouterr().out.strip().splitlines()[::-1]
    assert noted.endswith("| services: 1 restart, 4 calls resent")
    assert "services" not in quiet


def test_a_long_phase_prints_progress_lines_at_the_interval_and_at_its_end(capsys) -> None:
    with report.progress("SFT", 10, interval_s=0.05) as advance:
        for _ in range(10):
            time.sleep(0.03)
            advance()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 3, lines  # 0.3 s at one line per 0.05 s, and the end
    assert all(line.startswith("SFT: ") for line in lines)
    assert lines[-1].startswith("SFT: 10/10 (100 %)") and lines[-1].endswith("(done)")


def test_a_short_phase_prints_its_end_line_only(capsys) -> None:
    with report.progress("eval (before RL)", 4, interval_s=30) as advance:
        advance(4)
    assert capsys.readouterr().out.splitlines() == ["eval (before RL): 4/4 (100 %), 0 s (done)"]


def test_plots_say_what_they_show_mark_stage_switches_and_smooth_noisy_steps(tmp_path) -> None:
    records = [{"phase": "rl", "step": s, "reward": (s % 3) / 2} for s in range(1, 21)]
    records += [{"phase": "stage", "step": 8, "from_name": "stage1", "to_name": "stage2"}]
    records += [{"phase": "eval", "step": s, "accuracy": 0.1 * s} for s in (0, 10, 20)]
    fig = plots.figure(plots.PLOTS["reward"], records)
    ax = fig.axes[0]
    assert ax.get_title() == "Mean reward of the step's rollouts"
    assert ax.get_xlabel() == "RL step" and ax.get_ylabel() == "reward (0-1)"
    raw, smooth, switch = ax.get_lines()
    assert list(raw.get_ydata()) == [r["reward"] for r in records[:20]]
    assert max(smooth.get_ydata()) - min(smooth.get_ydata()) < 0.5  # flatter than the raw 0-1
    assert list(switch.get_xdata()) == [8.5, 8.5]
    assert any("stage2" in t.get_text() for t in ax.texts)
    eval_ax = plots.figure(plots.PLOTS["eval_accuracy"], records).axes[0]
    assert len(eval_ax.get_lines()) == 2  # three evaluations point to point, and the switch
    written = plots.draw_plots(tmp_path, records)
    assert sorted(p.name for p in written) == ["eval_accuracy.png", "reward.png"]
    assert all(p.stat().st_size > 0 for p in written)
