import json

import pytest
from pydantic import ValidationError

from rstar2_curriculum import (
    CurriculumConfig,
    DataError,
    FieldMap,
    JsonlSource,
    ParquetSource,
    load_problems,
    prepare,
    strip_instructions,
)

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
AIME = "Find the number of ordered pairs of positive integers whose product equals two thousand and twenty five exactly."


def _verl_row(i: int, question: str, answer: str, source: str = "math_dapo") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": i, "split": "train"},
    }


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_verl_parquet_through_prepare_cleans_decontaminates_and_reports(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [
        _verl_row(0, DAPO_PREFIX + "What is 6 times 7?" + DAPO_SUFFIX, "42"),
        _verl_row(
            1,
            "Compute 2^10. Let's think step by step and output the final answer within \\boxed{}.",
            "1024",
        ),
        _verl_row(2, "Simplify sqrt(8).", "2\\sqrt{2}"),  # not an integer: cleaned out
        _verl_row(3, "Does the limit exist?", "The limit does not exist"),  # unverifiable
        _verl_row(4, AIME, "15"),  # overlaps the benchmark
        _verl_row(5, "What is 6 times 7?", "42"),  # duplicate of row 0 once DAPO's text is gone
        {**_verl_row(6, "x", "1"), "reward_model": {"style": "rule"}},  # no ground truth
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    bench = _jsonl(tmp_path / "aime.jsonl", [{"id": "aime/1", "question": AIME, "answer": "15"}])
    config = CurriculumConfig.model_validate(
        {
            "batch_size": 2,
            "source": {
                "kind": "parquet",
                "path": str(tmp_path / "train.parquet"),
                "preset": "verl",
            },
            "eval_sources": [{"kind": "jsonl", "path": bench, "source": "aime24"}],
        }
    )
    prepared = prepare(config)
    assert [p.question for p in prepared.problems] == ["What is 6 times 7?", "Compute 2^10."]
    assert [p.id for p in prepared.problems] == ["math_dapo/0", "math_dapo/1"]
    assert prepared.problems[0].metadata["ability"] == "MATH"
    report = json.loads(prepared.report.model_dump_json())
    assert report["rows_read"] == 7 and report["loaded"] == 6
    assert report["skipped"] == {"missing_field:reward_model.ground_truth": 1}
    assert report["cleaned_out"] == {"not_integer": 1, "unverifiable": 1, "duplicate": 1}
    assert report["decontamination"] == {
        "ngram": 8,
        "eval_problems": 1,
        "hits": 1,
        "by_source": {"aime24": 1},
    }
    assert report["kept"] == 2 == len(prepared.curriculum.problems)


def test_prepare_decontaminates_against_problems_the_caller_passes(tmp_path):
    from rstar2_curriculum import Problem

    path = _jsonl(
        tmp_path / "t.jsonl",
        [{"question": AIME, "answer": "15"}, {"question": "1+1?", "answer": "2"}],
    )
    config = CurriculumConfig(source=JsonlSource(path=path))
    bench = [Problem(id="b/0", question=AIME, answer="15", source="bench")]
    prepared = prepare(config, eval_problems=bench)
    assert [p.answer for p in prepared.problems] == ["2"]
    assert prepared.report.decontamination.by_source == {"bench": 1}


def test_dapo_in_both_published_layouts(tmp_path):
    original = _verl_row(7, DAPO_PREFIX + "How many primes are below 20?" + DAPO_SUFFIX, "8")
    processed = {
        "prompt": "How many primes are below 30?",
        "solution": "10",
        "data_source": "math_dapo",
    }
    path = _jsonl(tmp_path / "dapo.jsonl", [original, processed])
    result = load_problems(JsonlSource(path=path, preset="dapo"))
    assert [(p.id, p.question, p.answer) for p in result.problems] == [
        ("dapo/7", "How many primes are below 20?", "8"),
        ("dapo/1", "How many primes are below 30?", "10"),
    ]


def test_openmathreasoning_keeps_problems_with_an_extracted_answer(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"problem": "Find x if 2x = 10.", "expected_answer": "5", "problem_type": "has_answer_extracted",
         "problem_source": "aops_c4", "pass_rate_72b_tir": "0.5"},
        {"problem": "Prove that ...", "expected_answer": "", "problem_type": "converted_proof",
         "problem_source": "aops_c6", "pass_rate_72b_tir": "n/a"},
    ]  # fmt: skip
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "omr"))
    config = CurriculumConfig.model_validate(
        {"source": {"kind": "hf", "path": str(tmp_path / "omr"), "preset": "openmathreasoning"}}
    )
    result = load_problems(config.source)
    assert [p.answer for p in result.problems] == ["5"]
    assert result.problems[0].source == "aops_c4"
    assert result.report.skipped == {"problem_type:converted_proof": 1}


def test_project_euler_rows(tmp_path):
    rows = [
        {"id": 1, "title": "Multiples of 3 or 5", "problem": "Sum the multiples of 3 or 5 below 1000.", "numerical_answer": "233168"},
        {"id": 2, "problem": "A problem whose answer is huge.", "answer": 12},
    ]  # fmt: skip
    result = load_problems(
        JsonlSource(path=_jsonl(tmp_path / "pe.jsonl", rows), preset="project_euler")
    )
    assert [(p.id, p.answer, p.source) for p in result.problems] == [
        ("euler/1", "233168", "project_euler"),
        ("euler/2", "12", "project_euler"),
    ]


def test_a_preset_on_the_wrong_data_names_the_missing_columns(tmp_path):
    path = _jsonl(tmp_path / "plain.jsonl", [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(DataError, match=r"preset verl.*'prompt', 'reward_model'.*answer, question"):
        load_problems(JsonlSource(path=path, preset="verl"))
    with pytest.raises(ValidationError, match="either `preset` or `fields`"):
        ParquetSource(path="x.parquet", preset="verl", fields=FieldMap(question="problem"))
    # a written config (every field, the default mapping beside the preset) reads back
    written = ParquetSource(path="x.parquet", preset="verl").model_dump()
    assert ParquetSource.model_validate(written).preset == "verl"


def test_instruction_wrappers_are_removed_and_other_text_kept():
    assert strip_instructions(DAPO_PREFIX + "Q?" + DAPO_SUFFIX) == "Q?"
    assert (
        strip_instructions('Q? Let\'s think step by step and output the final answer after "####".')
        == "Q?"
    )
    assert (
        strip_instructions("Solve the following math problem: 1+1")
        == "Solve the following math problem: 1+1"
    )
