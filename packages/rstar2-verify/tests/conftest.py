from collections.abc import Iterator

import pytest

from rstar2_verify import Grader, VerifyConfig


@pytest.fixture(scope="session")
def grader() -> Iterator[Grader]:
    """One pool for the whole run: starting sympy workers costs seconds on a busy machine."""
    with Grader(VerifyConfig(workers=2)) as g:
        g.start(wait_s=120)
        yield g
