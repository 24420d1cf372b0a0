"""Issue 29's recall kinds, each with the negatives beside it (own cases, never the held-out).

Several boxes that together are the answer, relations against bare values, assignments against
tuples, sets with repeated members, expressions against their values, currency with thousands
separators, base subscripts, percent in prose, residues. The same cases are in `data/labelled.jsonl`
(category `recall_*`), so `rstar2-verify check` scores them too.
"""

from __future__ import annotations

import pytest

CASES = [
    # several boxes, one per root or part
    ("boxes", "The roots are $\\boxed{2}$ and $\\boxed{3}$.", "2, 3", True),
    ("boxes", "For part (a) \\boxed{5}, for part (b) \\boxed{7}.", "5, 7", True),
    ("boxes", "$x = \\boxed{2}$ or $\\boxed{-3}$", "-3, 2", True),
    ("boxes", "\\boxed{5} ... wait, no: \\boxed{7}", "5, 7", False),
    ("boxes", "The roots are $\\boxed{2}$ and $\\boxed{3}$.", "2, 4", False),
    ("boxes", "$\\boxed{2}$ or $\\boxed{-3}$", "2", False),
    # a relation or named equation against a bare value, both ways
    ("relation", "\\boxed{x=3}", "3", True),
    ("relation", "\\boxed{3}", "x=3", True),
    ("relation", "\\boxed{AB = 5}", "5", True),
    ("relation", "\\boxed{\\lim_{x\\to 0} f(x) = 2}", "2", True),
    ("relation", "\\boxed{2}", "\\lim_{x \\to 0} f(x) = 2", True),
    ("relation", "\\boxed{\\lim_{x\\to 0} f(x) = 2}", "3", False),
    ("relation", "\\boxed{f^{-1}(x) = 2x+1}", "2x+1", True),
    ("relation", "\\boxed{2x+1}", "f^{-1}(x)=2x+1", True),
    ("relation", "\\boxed{f^{-1}(x) = 2x+1}", "2x-1", False),
    ("relation", "\\boxed{-2 < x < 3}", "(-2, 3)", True),
    ("relation", "\\boxed{(-2,3)}", "-2<x<3", True),
    ("relation", "\\boxed{-2 \\le x < 3}", "(-2, 3)", False),
    ("relation", "\\boxed{x=4}", "3", False),
    # assignments against tuples
    ("assignments", "\\boxed{x=1, y=2}", "(1, 2)", True),
    ("assignments", "\\boxed{x=1,y=2; x=3,y=4}", "(1,2),(3,4)", True),
    ("assignments", "\\boxed{(3,4),(1,2)}", "x=1,y=2; x=3,y=4", True),
    ("assignments", "\\boxed{x=2, y=1}", "(1, 2)", False),
    ("assignments", "\\boxed{x=1,y=2; x=3,y=5}", "(1,2),(3,4)", False),
    ("assignments", "\\boxed{x=1,y=2; x=3,y=4}", "(2,1),(4,3)", False),
    # sets with repeated members
    ("set_repeats", "\\boxed{\\{1, 1, 2\\}}", "\\{1, 2\\}", True),
    ("set_repeats", "\\boxed{\\{1,2\\}}", "\\{2,2,1\\}", True),
    ("set_repeats", "\\boxed{\\{1, 1, 2\\}}", "\\{1, 2, 3\\}", False),
    ("set_repeats", "\\boxed{(1, 1, 2)}", "(1, 2)", False),
    # an expression against its value
    ("evaluate", "\\boxed{\\sin 30^\\circ}", "\\frac{1}{2}", True),
    ("evaluate", "\\boxed{\\cos 60^{\\circ}}", "0.5", True),
    ("evaluate", "\\boxed{\\tan(45^\\circ)}", "1", True),
    ("evaluate", "\\boxed{\\sin 30^\\circ}", "\\frac{\\sqrt3}{2}", False),
    ("evaluate", "\\boxed{\\sin 30}", "\\frac{1}{2}", False),
    ("evaluate", "\\boxed{2^{10}}", "1024", True),
    ("evaluate", "\\boxed{2^{10}}", "1000", False),
    ("evaluate", "\\boxed{\\sqrt{2}+\\sqrt{8}}", "3\\sqrt{2}", True),
    ("evaluate", "\\boxed{\\sqrt{2}+\\sqrt{8}}", "4\\sqrt{2}", False),
    # thousands separators inside currency
    ("currency", "\\boxed{\\$1,234.50}", "1234.5", True),
    ("currency", "The total is \\$1,234.50.", "1234.50", True),
    ("currency", "\\boxed{\\$12,345}", "12345", True),
    ("currency", "\\boxed{\\$1,234.50}", "1234.05", False),
    # numbers with a base subscript
    ("base", "\\boxed{101_2}", "5", True),
    ("base", "\\boxed{5}", "101_2", True),
    ("base", "\\boxed{1A_{16}}", "26", True),
    ("base", "\\boxed{312_4}", "54", True),
    ("base", "\\boxed{101_2}", "6", False),
    ("base", "\\boxed{312_5}", "54", False),
    ("base", "\\boxed{x_2}", "2", False),
    # percent in prose
    ("percent", "The answer is 25 percent.", "25\\%", True),
    ("percent", "\\boxed{25 \\text{ percent}}", "25\\%", True),
    ("percent", "The answer is 25 percent.", "20\\%", False),
    # a residue against its value, both ways; the modulus compared when both state one
    ("residue", "\\boxed{x \\equiv 3 \\pmod{7}}", "3", True),
    ("residue", "\\boxed{3}", "3 \\pmod{7}", True),
    ("residue", "\\boxed{n \\equiv 5 \\pmod 12}", "5", True),
    ("residue", "\\boxed{x \\equiv 3 \\ (\\mathrm{mod}\\ 7)}", "3", True),
    ("residue", "\\boxed{x \\equiv 4 \\bmod 9}", "x \\equiv 4 \\pmod{9}", True),
    ("residue", "\\boxed{x ≡ 2 (mod 5)}", "2", True),
    ("residue", "\\boxed{x \\equiv 3 \\pmod{7}}", "4", False),
    ("residue", "\\boxed{x \\equiv 3 \\pmod{7}}", "x \\equiv 3 \\pmod{5}", False),
    ("residue", "\\boxed{17 \\bmod 5}", "17", False),
    ("residue", "\\boxed{3 \\pmod{7}}", "10", False),
]


@pytest.mark.parametrize(("kind", "response", "gold", "correct"), CASES)
def test_recall_kinds(grader, kind, response, gold, correct):
    got = grader.grade(response, gold)
    assert got.correct == correct, (kind, got)
