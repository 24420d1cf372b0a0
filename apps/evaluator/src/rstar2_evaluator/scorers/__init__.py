"""Reference scorers for the paper's non-maths benchmarks: IFEval, BFCL and Arena-Hard.

Each module loads its benchmark's published files from a local path, builds the benchmark's
default prompt, and scores through the reference: IFEval with lm-eval's copy of Google's
checkers (`ifeval`), BFCL with bfcl-eval's own runner checks (`bfcl`), Arena-Hard with
arena-hard-auto's judge prompt, verdict regex and Bradley-Terry win rates (`arena`). The modules
are imported by name (`from rstar2_evaluator.scorers import ifeval`); importing this package
loads none of the reference packages. A missing or malformed file raises `ScorerDataError`
(one line naming what to download). Not covered: generation, run directories, the CLI.
"""

from rstar2_evaluator.scorers._data import ScorerDataError

__all__ = ["ScorerDataError"]
