import json
from pathlib import Path

import pytest

from rstar2_curriculum import (
    DataError,
    Message,
    SFTExample,
    SFTSourceConfig,
    load_sft,
    render_python_call,
    write_sft_jsonl,
)
from rstar2_curriculum.sftdata import check_example

TRACE = SFTExample(
    messages=[
        Message(role="user", content="What is 17*23?"),
        Message(
            role="assistant",
            content="<reason>Compute it.</reason>\n" + render_python_call("print(17*23)"),
        ),
        Message(role="tool", content="391\n"),
        Message(role="assistant", content="<reason>Done.</reason>\n<answer>\\boxed{391}</answer>"),
    ],
    id="t0",
)
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
XLAM = {
    "query": "Weather in Paris?",
    "tools": json.dumps([WEATHER]),
    "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}]),
}
INSTRUCTION = {"instruction": "Write a haiku about rain.", "output": "Soft rain on the roof."}


def _jsonl(path: Path, rows: list) -> Path:
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _traces(n: int) -> list[SFTExample]:
    return [TRACE.model_copy(update={"id": f"t{i}"}) for i in range(n)]


def test_a_plain_path_is_one_chat_source_and_bad_rows_are_counted(tmp_path):
    path = tmp_path / "traces.jsonl"
    write_sft_jsonl(_traces(3), path)
    with path.open("ab") as handle:
        handle.write(b"{broken\n")
        handle.write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode() + b"\n")
        handle.write(json.dumps(INSTRUCTION).encode() + b"\n")
    result = load_sft(str(path), seed=0)
    assert sorted(e.id for e in result.examples) == ["t0", "t1", "t2"]
    assert all(e.messages == TRACE.messages and e.tools is None for e in result.examples)
    (source,) = result.report.sources
    assert source.format == "chat" and source.rows == 6 and source.valid == 3
    assert source.skipped == {
        "malformed_json": 1,
        "invalid_example": 1,  # one message only
        "missing_field:messages": 1,  # an instruction row is not chat
    }
    assert source.where["malformed_json"] == ["line 4"]
    json.loads(result.report.model_dump_json())  # the trainer writes it to the run directory


def test_parquet_and_saved_dataset_sources_in_converter_formats(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    rows = [{"messages": [m.model_dump() for m in TRACE.messages], "id": f"p{i}"} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    datasets.Dataset.from_list([XLAM, XLAM]).save_to_disk(str(tmp_path / "xlam"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list([INSTRUCTION])}).save_to_disk(
        str(tmp_path / "inst")
    )
    sources = [
        SFTSourceConfig(path=str(tmp_path / "chat.parquet"), format="chat"),
        SFTSourceConfig(path=str(tmp_path / "xlam"), format="function_call"),
        SFTSourceConfig(path=str(tmp_path / "inst"), format="instruction", split="train"),
    ]
    result = load_sft(sources, seed=1)
    assert [s.valid for s in result.report.sources] == [4, 2, 1]
    assert result.report.sources[1].formats == {"xlam": 2}
    call = next(e for e in result.examples if e.id.startswith("xlam"))
    assert call.tools and call.tools[0]["function"]["name"] == "get_weather"
    assert call.messages[-1].content.startswith("<reason></reason>\n<tool_call>")
    plain = next(e for e in result.examples if e.id.startswith("inst"))
    assert plain.tools == []
    assert plain.messages[-1].content == (
        "<reason></reason>\n<answer>Soft rain on the roof.</answer>"
    )
    for example in result.examples:
        check_example(example)  # the agent loop's shape


def test_auto_tells_formats_apart_per_row_and_require_skips_unwrapped_turns(tmp_path):
    path = _jsonl(
        tmp_path / "mixed.jsonl",
        [TRACE.model_dump(), XLAM, INSTRUCTION, {"conversations": "not a list"}],
    )
    result = load_sft([SFTSourceConfig(path=str(path))], seed=0)
    (source,) = result.report.sources
    assert source.formats == {"chat": 1, "xlam": 1, "instruction": 1}
    assert source.wrapped == 2 and source.skipped == {"missing_field:conversations": 1}
    strict = load_sft([SFTSourceConfig(path=str(path), assistant="require")], seed=0)
    assert strict.report.sources[0].skipped["no_reason_prefix"] == 2
    assert [e.id for e in strict.examples] == ["t0"]


def test_rows_the_encoder_would_mis_tokenise_are_skipped(tmp_path):
    def chat(*pairs: tuple[str, str]) -> dict:
        return {"messages": [{"role": r, "content": c} for r, c in pairs]}

    ok = ("assistant", "<reason>ok</reason>\n<answer>1</answer>")
    rows = [
        chat(("user", "q"), ok),
        chat(("user", "q<|im_end|>"), ok),
        chat(("user", "q"), ok, ("user", "more?")),
        chat(("assistant", "<reason>a</reason>"), ("user", "q"), ok),
        chat(("user", "q"), ("tool", "out"), ok),
        chat(("user", "q"), ok, ("system", "late"), ok),
        chat(("user", "q"), ("assistant", "<reason>")),
    ]
    result = load_sft(str(_jsonl(tmp_path / "c.jsonl", rows)), seed=0)
    assert result.report.sources[0].skipped == {
        "special_token_in_text": 1,
        "ends_with_user": 1,
        "does_not_start_with_user": 1,
        "tool_without_call": 1,
        "system_not_first": 1,
        "empty_assistant_turn": 1,
    }


def test_weights_repeat_or_subsample_and_the_mixture_depends_only_on_the_seed(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    write_sft_jsonl(_traces(10), a)
    write_sft_jsonl([TRACE.model_copy(update={"id": f"b{i}"}) for i in range(10)], b)
    sources = [
        {"path": str(a), "format": "chat", "weight": 2.0},
        {"path": str(b), "format": "chat", "weight": 0.5, "limit": 8},
    ]
    first = load_sft(sources, seed=3)
    again = load_sft(sources, seed=3)
    other = load_sft(sources, seed=4)
    ids = [e.id for e in first.examples]
    assert ids == [e.id for e in again.examples]
    assert ids != [e.id for e in other.examples]
    assert [s.used for s in first.report.sources] == [20, 4]
    assert all(ids.count(f"t{i}") == 2 for i in range(10))
    b_ids = {i for i in ids if i.startswith("b")}
    assert len(b_ids) == 4 and b_ids <= {f"b{i}" for i in range(8)}  # limit: the first 8
    assert first.report.sources[1].rows == 8


def test_a_source_with_no_usable_row_is_one_line_naming_fields(tmp_path):
    path = _jsonl(tmp_path / "inst.jsonl", [INSTRUCTION, INSTRUCTION])
    with pytest.raises(DataError) as error:
        load_sft(str(path), seed=0)
    message = str(error.value)
    assert "\n" not in message
    assert "missing_field:messages x2" in message and "instruction, output" in message
    assert "try format: auto" in message


def test_the_sft_command_writes_the_checked_mixture_and_its_report(tmp_path, capsys):
    from rstar2_curriculum import read_sft_jsonl
    from rstar2_curriculum.cli import main

    chat = tmp_path / "chat.jsonl"
    write_sft_jsonl(_traces(2), chat)
    inst = _jsonl(tmp_path / "inst.jsonl", [INSTRUCTION, {"instruction": "no output"}])
    out, report = tmp_path / "mix.jsonl", tmp_path / "r.json"
    assert main(["sft", str(chat), str(inst), "--out", str(out), "--report", str(report)]) == 0
    assert len(list(read_sft_jsonl(out))) == 3
    assert "missing_field:output" in capsys.readouterr().out
    sources = json.loads(report.read_text())["sources"]
    assert [(s["valid"], s["skipped"]) for s in sources] == [
        (2, {}),
        (1, {"missing_field:output": 1}),
    ]
