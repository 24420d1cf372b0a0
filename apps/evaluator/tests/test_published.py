"""`rstar2-eval run MODEL BENCH --data PATH samples=1 ...` from a small copy of each benchmark in
its published format, on the tiny model built on the spot, as a user runs it: every run writes
`summary.json` with the benchmark, its metric, its score and its n. A suite runs its rows and
writes one table and `suite.json`; two suite runs compare benchmark by benchmark.

The tiny model is untrained: its scores mean nothing here, the path is what is tested. One
benchmark per kind runs in the default suite; every benchmark, and the suite, are slow.
"""

from __future__ import annotations

import json

import pytest

from rstar2_evaluator.cli import main

QUICK = [
    "samples=1",
    "model.engine=hf",
    "max_response_tokens=8",
    "max_turns=1",
    "concurrency=1",
    "sandbox.preload=[]",
    "tool.workers=1",
    "verify.workers=1",
    "code.release=v6",
    "--no-progress",
]


def _matharena(n=2, *, int_answer=False):
    return [
        {"problem_idx": i + 1, "answer": (7 * i) if int_answer else str(7 * i), "problem": f"P{i}"}
        for i in range(n)
    ]


def _copies(folder, published):
    """One small copy per benchmark, named as a suite's --data folder expects."""
    folder.mkdir(exist_ok=True)
    published.write_parquet(
        folder / "aime24.parquet",
        [
            {"id": 60 + i, "problem": f"Q{i}", "answer": "33", "url": "u", "year": "2024"}
            for i in range(2)
        ],
    )
    (folder / "aime25.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}", "answer": str(i)}) + "\n" for i in range(2))
    )
    published.write_parquet(folder / "aime26.parquet", _matharena(int_answer=True))
    for name in ("hmmt_feb25", "hmmt_feb26", "brumo25"):
        rows = [{**r, "problem_type": ["Algebra"]} for r in _matharena()]
        published.write_parquet(folder / f"{name}.parquet", rows)
    published.write_parquet(
        folder / "beyond_aime.parquet", [{"problem": f"B{i}", "answer": str(i)} for i in range(2)]
    )
    (folder / "math500.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "problem": f"M{i}",
                    "solution": "s",
                    "answer": "1",
                    "subject": "Algebra",
                    "level": 1,
                    "unique_id": f"test/algebra/{i}.json",
                }
            )
            + "\n"
            for i in range(2)
        )
    )
    published.write_gpqa(folder / "gpqa_diamond.csv")
    published.write_lcb(folder / "livecodebench")
    return folder


def _run(tiny_model, bench, data, out, *extra):
    code = main(
        ["run", str(tiny_model), bench, "--data", str(data), "--out", str(out), *QUICK, *extra]
    )
    assert code == 0
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize(
    ("bench", "metric"), [("gpqa_diamond", "pass@1"), ("livecodebench", "pass@1")]
)
def test_one_benchmark_per_agent_kind_runs_from_its_published_copy(
    tmp_path, tiny_model, published, bench, metric
):
    data = _copies(tmp_path / "data", published)
    path = data / ("gpqa_diamond.csv" if bench == "gpqa_diamond" else "livecodebench")
    summary = _run(tiny_model, bench, path, tmp_path / "out")
    assert (summary["benchmark"], summary["metric"], summary["n"]) == (bench, metric, 2)
    assert isinstance(summary["score"], float) and 0.0 <= summary["score"] <= 1.0
    records = [json.loads(x) for x in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    if bench == "gpqa_diamond":  # each sample's option order is in its record
        assert all(sorted(r["details"]["order"]) == [0, 1, 2, 3] for r in records)


MATHS = [
    "aime24",
    "aime25",
    "aime26",
    "hmmt_feb25",
    "hmmt_feb26",
    "brumo25",
    "beyond_aime",
    "math500",
]


@pytest.mark.slow
@pytest.mark.parametrize("bench", MATHS)
def test_every_maths_set_runs_from_its_published_copy(tmp_path, tiny_model, published, bench):
    data = _copies(tmp_path / "data", published)
    path = next(data.glob(f"{bench}.*"))
    summary = _run(tiny_model, bench, path, tmp_path / "out", "tool=false")
    assert (summary["benchmark"], summary["metric"], summary["n"]) == (bench, "pass@1", 2)
    assert summary["score"] == summary["pass_at_1"]


@pytest.mark.slow
def test_a_suite_runs_each_row_prints_one_table_and_two_suite_runs_compare(
    tmp_path, tiny_model, published, capsys
):
    data = _copies(tmp_path / "data", published)
    suite = tmp_path / "mine.yaml"
    suite.write_text(
        "title: Mine\nreported: [Paper]\ntables:\n"
        "  - title: Maths\n    rows:\n"
        "      - {benchmark: aime26, label: AIME26, reported: {Paper: 50.0}}\n"
        "  - title: Science\n    rows:\n"
        "      - {benchmark: gpqa_diamond, label: GPQA, overrides: [top_p=0.9]}\n"
    )
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"suite{seed}"
        argv = ["run", str(tiny_model), str(suite), "--data", str(data), "--out", str(out)]
        assert main([*argv, *QUICK, f"seed={seed}"]) == 0
        printed = capsys.readouterr().out
        assert "AIME26" in printed and "Paper (reported)" in printed and "50.0" in printed
        result = json.loads((out / "suite.json").read_text())
        rows = [row for _, table in result["tables"] for row in table]
        assert [(r["benchmark"], r["n"]) for r in rows] == [("aime26", 2), ("gpqa_diamond", 2)]
        assert (out / "gpqa_diamond" / "summary.json").is_file()
        config = (out / "gpqa_diamond" / "config.yaml").read_text()
        assert "top_p: 0.9" in config  # the row's override
        runs.append(out)
    assert main(["compare", *map(str, runs), "--json", str(tmp_path / "cmp.json")]) == 0
    assert "B (A)" in capsys.readouterr().out
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert [r["benchmark"] for r in cmp["rows"]] == ["aime26", "gpqa_diamond"]


def test_a_suite_with_a_missing_copy_names_it_before_anything_runs(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    out = tmp_path / "out"
    argv = ["run", str(tmp_path), "paper", "--data", str(tmp_path / "data"), "--out", str(out)]
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 8  # one per benchmark of the paper's tables
    assert lines[0].startswith("rstar2-eval: math500: no copy in ")
    assert any("gpqa_diamond" in line and "Idavidrein/gpqa" in line for line in lines)
    assert not out.exists()
