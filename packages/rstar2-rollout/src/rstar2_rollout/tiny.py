"""Build a tiny Qwen3-architecture model and its tokenizer on the spot, with no downloads.

`build_tiny_model(out_dir, seed=...)` trains a byte-level BPE tokenizer on generated text (digits,
arithmetic, maths words, Python keywords and code, the chat format's tags), gives it a ChatML chat
template, creates a randomly initialised `Qwen3ForCausalLM` with untied embeddings (`tied=True`:
the head shares the embedding, as Qwen3-1.7B's does), and saves both with `save_pretrained`. The
folder loads in transformers and in vLLM (the CPU build included: head_dim is 32, a size its
attention kernel supports). The same seed gives byte-identical files.

The model is untrained: it emits plausible tokens in no particular order. It exists so that
engines, the agent loop and the trainer run end to end on any machine; teaching it the format is
the trainer's SFT stage. Needs the `hf` extra (torch, transformers).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from rstar2_rollout.chat import FORMAT_TAGS, IM_END, IM_START, TOOL_NAME

ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_MATHS_WORDS = [
    "the",
    "sum",
    "of",
    "product",
    "integer",
    "prime",
    "divisor",
    "remainder",
    "find",
    "compute",
    "how",
    "many",
    "number",
    "digits",
    "triangle",
    "circle",
    "area",
    "perimeter",
    "angle",
    "square",
    "root",
    "probability",
    "expected",
    "value",
    "sequence",
    "polynomial",
    "roots",
    "equation",
    "solve",
    "answer",
    "therefore",
    "let",
    "be",
    "such",
    "that",
    "positive",
    "real",
    "modulo",
    "factorial",
    "binomial",
    "coefficient",
    "fraction",
    "greatest",
    "common",
    "least",
    "multiple",
    "boxed",
    "check",
    "verify",
]
_PYTHON_WORDS = [
    "def",
    "return",
    "import",
    "from",
    "for",
    "in",
    "range",
    "if",
    "elif",
    "else",
    "while",
    "print",
    "len",
    "sum",
    "int",
    "str",
    "list",
    "dict",
    "set",
    "True",
    "False",
    "None",
    "and",
    "or",
    "not",
    "lambda",
    "math",
    "itertools",
    "sympy",
    "input",
    "split",
    "map",
    "break",
    "continue",
]


def _corpus(seed: int, lines: int) -> list[str]:
    """Generated training text for the tokenizer: deterministic for a seed."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(lines):
        kind = rng.randrange(5)
        if kind == 0:
            out.append(" ".join(rng.choice(_MATHS_WORDS) for _ in range(rng.randint(5, 15))))
        elif kind == 1:
            a, b = rng.randint(0, 10**6), rng.randint(1, 999)
            out.append(f"{a} + {b} = {a + b}, {a} * {b} = {a * b}, {a} % {b} = {a % b}")
        elif kind == 2:
            n = rng.randint(2, 50)
            out.append(
                f"def f(n):\n    total = 0\n    for i in range({n}):\n"
                f"        if i % {rng.randint(2, 9)} == 0:\n            total += i\n"
                f"    return total\nprint(f({n}))"
            )
        elif kind == 3:
            out.append(" ".join(rng.choice(_PYTHON_WORDS) for _ in range(rng.randint(5, 15))))
        else:
            code = f"print(sum(range({rng.randint(1, 99)})))"
            call = json.dumps({"name": TOOL_NAME, "arguments": {"code": code, "input": ""}})
            out.append(
                f"<reason> Let me compute it. </reason><tool_call>{call}</tool_call>"
                f"<tool_response>\n{rng.randint(0, 5000)}\n</tool_response>"
                f"<reason> So the answer is {rng.randint(0, 99)}. </reason>"
                f"<answer> \\boxed{{{rng.randint(0, 99)}}} </answer>"
            )
    return out


def build_tokenizer(
    seed: int,
    vocab_size: int,
    corpus: Iterable[str] | None = None,
    *,
    individual_digits: bool = True,
):
    """Train a byte-level BPE tokenizer and wrap it as a `PreTrainedTokenizerFast`.

    With `individual_digits` (as Qwen's tokenizers do) every digit is its own token, so numbers
    are spelled from ten frequent tokens instead of thousands of rare merges: a small model can
    then learn to copy a number from the question into its code and from the tool's output into
    its answer.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = list(corpus) if corpus is not None else _corpus(seed, lines=3000)
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer=trainer)
    # The tags are ordinary added tokens (not special): decoding keeps them, like Qwen's
    # <tool_call>; each is one token, so the parser and the mask see clean boundaries.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in FORMAT_TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=32768,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_position_embeddings: int = 8192,
    corpus: Iterable[str] | None = None,
    tied: bool = False,
) -> Path:
    """Write a tokenizer and a random Qwen3 model to `out_dir`; return the folder.

    `hidden_size / heads` must be a head size vLLM's CPU attention supports (32, 64, ...).
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    if hidden_size % heads or heads % kv_heads:
        raise ValueError(f"hidden_size {hidden_size} must split into {heads} heads, {kv_heads} kv")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed, vocab_size, corpus)
    tokenizer.save_pretrained(out)

    eos_id = int(tokenizer.convert_tokens_to_ids(IM_END))  # type: ignore[arg-type]
    pad_id = int(tokenizer.convert_tokens_to_ids(ENDOFTEXT))  # type: ignore[arg-type]
    config = Qwen3Config(
        # Padded to the requested size when the tokenizer learned fewer merges (as Qwen pads
        # its embedding past the tokenizer): ids below it are always valid model input.
        vocab_size=max(len(tokenizer), vocab_size),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tied,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id
    )
    model.save_pretrained(out, safe_serialization=True)
    return out
