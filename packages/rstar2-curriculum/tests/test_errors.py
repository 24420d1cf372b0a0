"""Every data mistake is a DataError with one actionable line, and the CLI exits 2 with it."""

import json
import subprocess
import sys

import pytest

from rstar2_curriculum import DataError, JsonlSource, MissingExtraError, load_problems, load_sft


def _cli(*args: str, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for name in {list(block)!r}:\n"
        "    sys.modules[name] = None\n"
        "from rstar2_curriculum.cli import main\n"
        f"sys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such data file"):
        load_sft(str(tmp_path / "nope.jsonl"))
    line = _one_line(_cli("sft", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")))
    assert line.endswith(f"no such data file or folder: {tmp_path / 'nope.jsonl'}")


def test_unknown_format(tmp_path):
    (tmp_path / "data.csv").write_text("question,answer\n1+1?,2\n")
    (tmp_path / "folder").mkdir()
    for path in (tmp_path / "data.csv", tmp_path / "folder"):
        with pytest.raises(DataError):
            load_sft(str(path))
    line = _one_line(_cli("clean", str(tmp_path / "data.csv")))
    assert "cannot tell the format" in line and ".jsonl or .parquet" in line
    line = _one_line(_cli("sft", str(tmp_path / "folder"), "--out", str(tmp_path / "o")))
    assert "not a Hugging Face dataset saved with save_to_disk" in line


def test_missing_fields_are_named(tmp_path):
    path = tmp_path / "omr.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "expected_answer": "2"}) + "\n")
    with pytest.raises(
        DataError, match=r"'question', 'answer'; the rows have: expected_answer, problem"
    ):
        load_problems(JsonlSource(path=str(path)))
    line = _one_line(_cli("clean", str(path)))
    assert "no row has the field(s) 'question', 'answer'" in line
    line = _one_line(_cli("clean", str(path), "--preset", "verl"))
    assert "'prompt', 'reward_model'" in line


@pytest.mark.parametrize(
    ("suffix", "blocked", "command"),
    [
        (".parquet", "pyarrow", 'pip install "rstar2-curriculum[parquet]"'),
        ("", "datasets", 'pip install "rstar2-curriculum[hf]"'),
    ],
)
def test_missing_extra_names_the_pip_command(tmp_path, suffix, blocked, command):
    path = tmp_path / f"data{suffix}"
    if suffix:
        path.write_bytes(b"PAR1")
    else:
        path.mkdir()
        (path / "dataset_info.json").write_text("{}")
    line = _one_line(_cli("clean", str(path), block=(blocked, f"{blocked}.parquet")))
    assert line.endswith(command)
    line = _one_line(_cli("sft", str(path), "--out", str(tmp_path / "o"), block=(blocked,)))
    assert line.endswith(command)
    assert issubclass(MissingExtraError, DataError) and issubclass(MissingExtraError, ImportError)


def test_a_file_that_is_not_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "fake.parquet"
    path.write_text("not parquet at all\n")
    line = _one_line(_cli("clean", str(path)))
    assert f"cannot read {path} as Parquet" in line


def test_bad_settings_name_the_field(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    args = ("verify-labels", str(path), "--model", "m", "--k", "2", "--m", "3", "--out", "o")
    # checked before the extra is needed, so the same line with or without it
    line = _one_line(_cli(*args, block=("rstar2_rollout", "rstar2_verify")))
    assert line.endswith("m (3) cannot exceed k (2)")
