"""The external labelled set and its held-out split are fixed before any rule was tuned.

Cases were transcribed from other graders' public test suites (Math-Verify, NeMo-Skills) and
hand-made in public dataset answer formats; each line names its `source`. The split is a hash
of the case, so nobody chooses which case lands where: sha256(response NUL gold), first 8 hex
digits mod 5 < 2 is held out. This test fails if a case moves, is edited, or is added to the
wrong file, and pins the held-out file's digest so that tuning on it shows up in review.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DATA = Path(__file__).parent / "data"
HELDOUT_SHA256 = "06cce43c9d1b50dbe3afa7349a5384b39fd547f9319f60b6e1efda790a98f37e"


def _split_of(response: str, gold: str) -> str:
    digest = hashlib.sha256(f"{response}\x00{gold}".encode()).hexdigest()
    return "heldout" if int(digest[:8], 16) % 5 < 2 else "dev"


def _rows(name: str) -> list[dict]:
    lines = (DATA / f"external_{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_every_case_is_in_the_split_its_hash_gives():
    for name in ("dev", "heldout"):
        for row in _rows(name):
            assert _split_of(row["response"], row["gold"]) == name, row


def test_every_case_names_its_source_and_label():
    for name in ("dev", "heldout"):
        for row in _rows(name):
            assert row["source"] and isinstance(row["correct"], bool)


def test_the_held_out_file_is_pinned():
    digest = hashlib.sha256((DATA / "external_heldout.jsonl").read_bytes()).hexdigest()
    assert (len(_rows("dev")), len(_rows("heldout"))) == (220, 154)
    assert digest == HELDOUT_SHA256
