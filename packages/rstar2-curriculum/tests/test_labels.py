import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rstar2_curriculum import LabelCheckConfig, Problem, keep_verified

PROBLEMS = [Problem(id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(4)]


def test_keep_when_at_least_m_samples_match_the_label():
    correct = {
        "p0": [True, True, False, False],  # exactly m
        "p1": [True, False, False, False],  # one short
        "p2": [True, True, True, True],
        # p3 was never sampled: no match
    }
    kept, report = keep_verified(PROBLEMS, correct, m=2, k=4, answers={"p1": ["1", "7", None, "7"]})
    assert [p.id for p in kept] == ["p0", "p2"]
    assert (report.problems, report.kept, report.dropped) == (4, 2, 2)
    assert report.agree_histogram == {0: 1, 1: 1, 2: 1, 4: 1}
    assert [(v.id, v.samples, v.agree, v.kept) for v in report.verdicts] == [
        ("p0", 4, 2, True),
        ("p1", 4, 1, False),
        ("p2", 4, 4, True),
        ("p3", 0, 0, False),
    ]
    assert report.verdicts[1].answers == ["1", "7", None, "7"]
    assert json.loads(report.model_dump_json())["k"] == 4


def test_m_cannot_exceed_k():
    with pytest.raises(ValidationError, match="cannot exceed"):
        LabelCheckConfig(k=2, m=3)


def _cli(*args: str, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter; `block` makes those modules fail to import."""
    code = (
        "import sys\n"
        f"for name in {list(block)!r}:\n"
        "    sys.modules[name] = None\n"
        "from rstar2_curriculum.cli import main\n"
        f"sys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_verify_labels_help_works_without_the_extra():
    done = _cli("verify-labels", "--help", block=("rstar2_rollout", "rstar2_verify"))
    assert done.returncode == 0, done.stderr
    assert "--k" in done.stdout and "label-check" in done.stdout


def test_verify_labels_without_the_extra_is_one_line_naming_it(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    done = _cli(
        "verify-labels", str(path), "--model", str(tmp_path), "--out", str(tmp_path / "o.jsonl"),
        block=("rstar2_rollout", "rstar2_verify"),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "rstar2-curriculum verify-labels: the label check needs: "
        'pip install "rstar2-curriculum[label-check]"'
    )
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "o.jsonl").exists()
