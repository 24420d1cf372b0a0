"""The trainer and the evaluator each hold a copy of `_keys.py` (overrides, error lines,
--help-config): a shared package for one module would add a member and edges for ~300 lines.
The copies must not drift."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_two_copies_of_keys_are_the_same():
    trainer = REPO / "apps/trainer/src/rstar2_trainer/_keys.py"
    evaluator = REPO / "apps/evaluator/src/rstar2_evaluator/_keys.py"
    assert trainer.read_text() == evaluator.read_text(), "copy one _keys.py over the other"
