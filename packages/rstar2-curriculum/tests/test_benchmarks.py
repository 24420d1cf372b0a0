"""Loading problems: JSONL with configurable fields, named benchmarks from a local copy, and the
one-line errors for an unknown name, a file without the needed fields, and an offline hub."""

import json

import pytest

from rstar2_curriculum import (
    BENCHMARKS,
    BenchmarkConfig,
    BenchmarkError,
    load_benchmark,
    load_benchmark_file,
)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_any_jsonl_with_question_and_answer(tmp_path):
    data = _jsonl(
        tmp_path / "mine.jsonl",
        [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": 4}],
    )
    problems = load_benchmark(BenchmarkConfig(name=str(data)))
    assert [(p.id, p.question, p.answer) for p in problems] == [
        ("mine/0", "1+1?", "2"),
        ("mine/1", "2+2?", "4"),
    ]


def test_field_names_are_configurable_and_limit_applies(tmp_path):
    rows = [{"prompt": f"q{i}", "gold": str(i), "uid": f"u{i}"} for i in range(5)]
    data = _jsonl(tmp_path / "other.jsonl", rows)
    config = BenchmarkConfig(
        name=str(data), question_field="prompt", answer_field="gold", id_field="uid", limit=2
    )
    assert [(p.id, p.answer) for p in load_benchmark(config)] == [("u0", "0"), ("u1", "1")]


def test_a_named_benchmark_from_a_local_copy_uses_its_field_names(tmp_path):
    rows = [
        {"id": 60 + i, "problem": f"AIME problem {i}", "answer": "033", "year": "2024"}
        for i in range(3)
    ]
    data = _jsonl(tmp_path / "aime24.jsonl", rows)
    problems = load_benchmark(BenchmarkConfig(name="aime24", data=str(data)))
    assert [p.id for p in problems] == ["60", "61", "62"]
    assert problems[0].question == "AIME problem 0"


def test_the_registry_has_the_papers_benchmarks_and_the_new_sets():
    assert {"aime24", "aime25", "math500", "hmmt_feb25"} <= set(BENCHMARKS)  # the paper's
    assert {"aime26", "hmmt_feb26", "brumo25", "beyond_aime", "gpqa_diamond"} <= set(BENCHMARKS)
    assert [p.name for p in BENCHMARKS["aime25"].parts] == ["AIME2025-I", "AIME2025-II"]
    assert BENCHMARKS["gpqa_diamond"].kind == "choice"
    assert all(b.download for b in BENCHMARKS.values())


def test_an_unknown_name_is_one_line_that_lists_the_names():
    with pytest.raises(BenchmarkError) as error:
        load_benchmark(BenchmarkConfig(name="aime23"))
    message = str(error.value)
    assert "unknown benchmark 'aime23'" in message and "aime24, aime25" in message
    assert "\n" not in message


def test_a_file_without_the_needed_field_names_the_fix(tmp_path):
    data = _jsonl(tmp_path / "x.jsonl", [{"problem": "q", "answer": "1"}])
    with pytest.raises(BenchmarkError) as error:
        load_benchmark(BenchmarkConfig(name=str(data)))
    message = str(error.value)
    assert "no row has the field(s) 'question'" in message
    assert "benchmark.question_field=..." in message and "rows have: answer, problem" in message
    assert "\n" not in message


def test_one_bad_row_fails_the_load_instead_of_shrinking_the_benchmark(tmp_path):
    data = _jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": "1"}, {"question": "q2"}])
    with pytest.raises(BenchmarkError, match="1 of 2 rows unusable"):
        load_benchmark(BenchmarkConfig(name=str(data)))


def test_duplicate_ids_are_refused(tmp_path):
    data = _jsonl(
        tmp_path / "x.jsonl",
        [{"id": 1, "question": "a", "answer": "1"}, {"id": 1, "question": "b", "answer": "2"}],
    )
    with pytest.raises(BenchmarkError, match="problem id '1' appears twice"):
        load_benchmark(BenchmarkConfig(name=str(data)))


def test_a_missing_file_and_a_non_jsonl_file(tmp_path):
    with pytest.raises(BenchmarkError, match="no such data file"):
        load_benchmark(BenchmarkConfig(name="aime24", data=str(tmp_path / "nope.jsonl")))
    (tmp_path / "a.csv").write_text("question,answer\n")
    with pytest.raises(BenchmarkError, match=r"expected a \.jsonl file"):
        load_benchmark(BenchmarkConfig(name=str(tmp_path / "a.csv")))


def test_offline_hub_is_one_line_that_suggests_a_local_copy(monkeypatch):
    # The datasets library's own offline switch, so the test is the same on an online machine.
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(BenchmarkError) as error:
        load_benchmark(BenchmarkConfig(name="hmmt_feb25"))
    message = str(error.value)
    assert message.startswith("cannot load hmmt_feb25") and "--data PATH" in message
    assert "download huggingface.co/datasets/MathArena/hmmt_feb_2025" in message
    assert "\n" not in message


def test_a_benchmark_file_loads_whole_from_jsonl_or_parquet_or_not_at_all(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    assert [p.answer for p in load_benchmark_file(tmp_path / "b.parquet")] == ["2", "4"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"question": "3+3?"}) + "\n")
    with pytest.raises(BenchmarkError, match="1 of 2 rows unusable"):
        load_benchmark_file(bad)
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(json.dumps({**r, "id": "7"}) + "\n" for r in rows))
    with pytest.raises(BenchmarkError, match="problem id '7' appears twice"):
        load_benchmark_file(twice)


def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_the_new_maths_sets_load_from_their_published_parquet(tmp_path):
    # MathArena's columns (problem_idx int64; AIME 2026's answer int64, the others' strings)
    # and BeyondAIME's (problem, answer; no id: row order).
    matharena = [{"problem_idx": i + 1, "answer": 100 + i, "problem": f"P{i}"} for i in range(3)]
    typed = [{**r, "answer": str(r["answer"]), "problem_type": ["Algebra"]} for r in matharena]
    beyond = [{"problem": f"B{i}", "answer": str(7 * i)} for i in range(2)]
    for name, rows in (
        ("aime26", matharena),
        ("hmmt_feb26", typed),
        ("brumo25", typed),
        ("beyond_aime", beyond),
    ):
        data = _parquet(tmp_path / f"{name}.parquet", rows)
        problems = load_benchmark(BenchmarkConfig(name=name, data=str(data)))
        assert [p.answer for p in problems] == [str(r["answer"]) for r in rows], name
        assert problems[0].question == rows[0]["problem"]
    ids = [
        p.id
        for p in load_benchmark(
            BenchmarkConfig(name="aime26", data=str(tmp_path / "aime26.parquet"))
        )
    ]
    assert ids == ["1", "2", "3"]
    ids = [
        p.id
        for p in load_benchmark(
            BenchmarkConfig(name="beyond_aime", data=str(tmp_path / "beyond_aime.parquet"))
        )
    ]
    assert ids == ["beyond_aime/0", "beyond_aime/1"]


def test_a_missing_local_copy_says_what_to_download(tmp_path):
    with pytest.raises(BenchmarkError) as error:
        load_benchmark(BenchmarkConfig(name="gpqa_diamond", data=str(tmp_path / "gpqa.csv")))
    message = str(error.value)
    assert "no such data file" in message and "Idavidrein/gpqa" in message
    assert "gpqa_diamond.csv" in message and "\n" not in message
