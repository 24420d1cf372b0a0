"""Regenerate apps/evaluator/tests/data/ifeval_gpt4_reference.jsonl.gz from Google's IFEval code.

Runs Google's reference (`instruction_following_eval.evaluation_lib`, its strict and loose tests)
on Google's archived GPT-4 responses and writes, per prompt with a response, the input fields,
the response and the per-instruction verdicts. Needs a checkout that holds the package folder
`instruction_following_eval/` (code and `data/`) and an environment with its requirements
(absl-py, langdetect, nltk, immutabledict); nothing from rstar2 is imported, so the verdicts are
the reference's own. Two settings match rstar2's scorer and are stated in its docstring:
langdetect's seed 0, and Python's `random` seeded with the prompt's key before the strict test
(the checker draws a letter when the published one is not a-z). Punkt comes from NLTK_DATA.

    NLTK_DATA=apps/evaluator/src/rstar2_evaluator/scorers/nltk_data \\
        python scripts/ifeval_reference_verdicts.py CHECKOUT OUT.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def main(checkout: Path, out: Path) -> None:
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0
    sys.path.insert(0, str(checkout))
    from instruction_following_eval import evaluation_lib  # type: ignore[import-not-found]

    data = checkout / "instruction_following_eval" / "data"
    inputs = evaluation_lib.read_prompt_list(data / "input_data.jsonl")
    responses = evaluation_lib.read_prompt_to_response_dict(
        data / "input_response_data_gpt4_20231107_145030.jsonl"
    )
    missing = [inp.key for inp in inputs if inp.prompt not in responses]
    print(f"no archived response for keys {missing}", file=sys.stderr)
    with out.open("w", encoding="utf-8") as f:
        for inp in inputs:
            if inp.prompt in missing or inp.key in missing:
                continue
            random.seed(inp.key)
            strict = evaluation_lib.test_instruction_following_strict(inp, responses)
            loose = evaluation_lib.test_instruction_following_loose(inp, responses)
            row = {
                "key": inp.key,
                "prompt": inp.prompt,
                "instruction_id_list": inp.instruction_id_list,
                "kwargs": inp.kwargs,
                "response": strict.response,
                "strict": strict.follow_instruction_list,
                "loose": loose.follow_instruction_list,
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
