import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_trainer.training.batching import make_batch, response_logprobs, token_budget_chunks


def _model():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).eval()


def test_masked_logprobs_equal_the_full_forward_and_ignore_padding():
    model = _model()
    prompts = [[1, 2, 3], [4, 5]]
    responses = [[6, 7, 8, 9], [10, 11]]
    masks = [[1, 0, 1, 1], [1, 1]]
    batch = make_batch(prompts, responses, masks, pad_id=0)
    with torch.no_grad():
        logp, entropy = response_logprobs(model, batch, with_entropy=True)
    assert logp.shape == (2, 4) and entropy is not None
    for i, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True)):
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=torch.tensor([p + r])).logits[0], -1)
        for j, token in enumerate(r):
            expected = float(full[len(p) + j - 1, token]) if m[j] else 0.0
            assert abs(float(logp[i, j]) - expected) < 1e-5
    assert float(logp[1, 2:].abs().sum()) == 0.0  # padding scores nothing
    assert float(entropy[0, 1]) == 0.0 and float(entropy[0, 0]) > 0.0


def test_temperature_scores_the_tempered_distribution():
    model = _model()
    batch = make_batch([[1, 2, 3]], [[6, 7, 8]], [[1, 1, 1]], pad_id=0)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, temperature=0.5)
        logits = model(input_ids=torch.tensor([[1, 2, 3, 6, 7, 8]])).logits[0]
    tempered = torch.log_softmax(logits / 0.5, -1)
    expected = torch.stack([tempered[2 + j, t] for j, t in enumerate([6, 7, 8])])
    assert torch.allclose(logp[0], expected, atol=1e-5)
    assert not torch.allclose(logp[0], torch.log_softmax(logits, -1)[[2, 3, 4], [6, 7, 8]])


def test_gradient_flows_only_through_scored_positions():
    model = _model()
    batch = make_batch([[1, 2]], [[3, 4]], [[1, 1]], pad_id=0)
    logp, _ = response_logprobs(model, batch)
    logp.sum().backward()
    assert model.lm_head.weight.grad is not None
    assert model.lm_head.weight.grad.abs().sum() > 0


def test_token_budget_chunks_cover_every_row_once_within_budget():
    lengths = [5, 100, 7, 60, 60, 3]
    padded = list(token_budget_chunks(lengths, max_tokens=128, packed=False))
    assert sorted(i for c in padded for i in c) == list(range(len(lengths)))
    for chunk in padded:  # rows x the longest row
        assert len(chunk) == 1 or max(lengths[i] for i in chunk) * len(chunk) <= 128
    packed = list(token_budget_chunks(lengths, max_tokens=128))
    assert sorted(i for c in packed for i in c) == list(range(len(lengths)))
    for chunk in packed:  # the rows' own tokens
        assert len(chunk) == 1 or sum(lengths[i] for i in chunk) <= 128
    assert packed[0] == [5, 0, 2, 3]  # 3 + 5 + 7 + 60 = 75 tokens; padded they would be 240
