"""Arena-Hard's win rates against the baseline, computed as arena-hard-auto's `show_result.py`.

The arithmetic of lmarena/arena-hard-auto at commit 196f6b826783b3da7310e361a805fa36f0be83f3
(`show_result.py`: `print_leaderboard`, `print_leaderboard_with_style_features`;
`utils/math_utils.py`: `one_hot_encode`, `fit_pairwise_model`, `bootstrap_pairwise_model`,
`to_winrate_probabilities`), over `Battle`s (one judged question of one model: its scores, its
answer's style, the baseline answer's style):

- plain: per model, 100 bootstrap resamples of its battle scores; the score is the mean of the
  resampled means, the interval their 5 % and 95 % quantiles;
- style-controlled (`-f markdown length`): one Bradley-Terry fit over every model's battles at
  once, a +1/-1 column per model and the baseline plus four style differences (answer length,
  then header, list and bold density), normalised over all battles; LBFGS on 100 bootstrap
  resamples of the battles; per model the median, 5 % and 95 % quantiles of its implied win
  probability against the baseline.

The random draws are theirs, seeded: their bootstraps draw from numpy's global generator
(`groupby(...).sample` per model in name order, then `np.random.randint`); here a
`numpy.random.RandomState(seed)` makes the same draws, so the same battles in the same order
give their numbers exactly (`tests/data/arena-hard-v0.1` holds the check). One departure: a style
feature that is constant over every battle is set to 0 after normalising (theirs stops on NaN).
Not covered: the Rao-Kupper ("rk") loss, length-only or markdown-only control, categories (the
caller passes one category's battles and its baseline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ROUNDS = 100  # bootstrap rounds, as show_result


@dataclass(frozen=True)
class Battle:
    """One judged question of one model, as show_result explodes it: the model's scores (one
    per game, a strong verdict three times) and the style metadata of its answer and of the
    baseline's (`arena.style_metadata`'s layout; None: unknown, no style control)."""

    model: str
    scores: tuple[float, ...]
    style: dict[str, Any] | None = None
    baseline_style: dict[str, Any] | None = None


def win_rates(
    scores: Mapping[str, Sequence[float]], *, seed: int, rounds: int = ROUNDS
) -> dict[str, dict[str, float]]:
    """Per model, the plain win rate against the baseline and its 90 % bootstrap interval.

    `scores` holds each model's battle scores in show_result's row order. The draws are
    pandas' `groupby("model").sample(frac=1, replace=True)` under `np.random.seed(seed)`: each
    round resamples every model in name order."""
    if not scores or any(len(v) == 0 for v in scores.values()):
        raise ValueError("no battles to score")
    names = sorted(scores)
    values = {m: np.asarray(scores[m], dtype=np.float64) for m in names}
    means = {m: np.empty(rounds) for m in names}
    rng = np.random.RandomState(seed)
    for r in range(rounds):
        for m in names:
            n = len(values[m])
            means[m][r] = values[m][rng.choice(n, size=n, replace=True)].mean()
    return {
        m: {
            "score": float(means[m].mean()),
            "lower": float(np.quantile(means[m], 0.05)),
            "upper": float(np.quantile(means[m], 0.95)),
        }
        for m in names
    }


def win_rate(scores: Sequence[float], *, seed: int, rounds: int = ROUNDS) -> dict[str, float]:
    """The plain win rate of one model alone (`win_rates` of a pool of one)."""
    return win_rates({"model": scores}, seed=seed, rounds=rounds)["model"]


def style_controlled_win_rates(
    battles: Sequence[Battle], *, baseline: str, seed: int, rounds: int = ROUNDS
) -> dict[str, dict[str, float]]:
    """Per model, the win rate against `baseline` with answer length and markdown controlled.

    `battles` in show_result's row order (judgment files by name, each file's records in order);
    every battle needs both styles. All models are fitted together and the style features are
    centred over all their battles, so a model is compared at the pool's average style and its
    number depends on the pool: fitted alone, a model gets its win probability at its own
    average style, which is neither its plain rate nor a leaderboard's number."""
    import torch

    rows: list[tuple[str, float, dict[str, Any], dict[str, Any]]] = []
    for b in battles:
        if b.style is None or b.baseline_style is None:
            raise ValueError("style control needs every battle's style metadata")
        rows += [(b.model, s, b.style, b.baseline_style) for s in b.scores]
    if not rows:
        raise ValueError("no battles to score")
    if any(m == baseline for m, _, _, _ in rows):
        raise ValueError(f"a model is named as the baseline ({baseline})")
    model = torch.tensor([_features(st) for _, _, st, _ in rows], dtype=torch.float32)
    base = torch.tensor([_features(bst) for _, _, _, bst in rows], dtype=torch.float32)
    style = torch.zeros_like(model)
    style[:, 0] = (model[:, 0] - base[:, 0]) / (model[:, 0] + base[:, 0])
    model_density = model[:, 1:] / (model[:, :1] + 1)
    base_density = base[:, 1:] / (base[:, :1] + 1)
    style[:, 1:] = (model_density - base_density) / (model_density + base_density + 1)
    style = (style - torch.mean(style, dim=0)) / torch.std(style, dim=0)
    style = torch.nan_to_num(style)  # a feature constant over all battles carries no signal
    names = sorted({m for m, _, _, _ in rows} | {baseline})  # one_hot_encode's columns
    one_hot = torch.zeros(len(rows), len(names))
    for i, (m, _, _, _) in enumerate(rows):
        one_hot[i, names.index(m)] = 1
        one_hot[i, names.index(baseline)] = -1
    features = torch.cat([one_hot, style], dim=1)
    outcomes = torch.tensor([s for _, s, _, _ in rows], dtype=torch.float32)
    boot = np.random.RandomState(seed).randint(0, len(rows), size=(rounds, len(rows)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny fits: more threads only hand work off (50x slower, 2 cores)
    try:
        fits = [_fit_bt(features[idx], outcomes[idx]) for idx in boot]
    finally:
        torch.set_num_threads(threads)
    coefs = torch.stack(fits)[:, : len(names)]
    exp = torch.exp(coefs)
    b = names.index(baseline)
    out = {}
    for i, name in enumerate(names):
        if i == b:
            continue
        probs = (exp[:, i] / (exp[:, i] + exp[:, b])).double().numpy()  # float32, as theirs
        out[name] = {
            "score": float(np.quantile(probs, 0.5)),
            "lower": float(np.quantile(probs, 0.05)),
            "upper": float(np.quantile(probs, 0.95)),
        }
    return out


def _features(meta: dict[str, Any]) -> list[float]:
    """token_len, then each count group summed, in the metadata's key order (as the original)."""
    return [float(v if isinstance(v, int) else sum(v.values())) for v in meta.values()]


def _fit_bt(features: Any, outcomes: Any) -> Any:
    """fit_pairwise_model with loss "bt": logits from 0.5, LBFGS lr 0.1, 50 iterations, tol 1e-9,
    the summed binary cross-entropy of `features @ logits`."""
    import torch
    import torch.nn.functional as F

    logits = torch.nn.Parameter(torch.full((features.shape[1],), 0.5))
    optimizer = torch.optim.LBFGS(
        [logits], lr=0.1, max_iter=50, tolerance_grad=1e-9, tolerance_change=1e-9
    )

    def closure() -> Any:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(features @ logits, outcomes, reduction="sum")
        loss.backward()
        return loss

    optimizer.step(closure)
    return logits.detach()
