"""The OpenAI-compatible engine against a small real HTTP server (serving the transformers engine).

The server speaks the completions API with vLLM's extensions (token-id prompts, `token_ids` and
`stop_token_ids`); it is an outside system to the engine under test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rstar2_rollout import (
    HFEngineConfig,
    OpenAIEngineConfig,
    RolloutConfig,
    RolloutTask,
    SamplingParams,
    build_engine,
)
from rstar2_rollout.chat import ChatFormat
from rstar2_rollout.engines.hf import HFEngine
from rstar2_rollout.engines.openai import OpenAIEngine


@pytest.fixture(scope="module")
def reference(tiny_model) -> HFEngine:
    engine = build_engine(HFEngineConfig(model=str(tiny_model)))
    assert isinstance(engine, HFEngine)
    return engine


@pytest.fixture(scope="module")
def server(reference: HFEngine, tokenizer) -> Iterator[str]:
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if self.path != "/v1/completions" or body["model"] not in ("tiny", "tiny-text"):
                return self._send(404, {"error": {"message": f"model {body['model']} not found"}})
            params = SamplingParams(
                max_tokens=body["max_tokens"],
                temperature=body["temperature"],
                seed=body.get("seed"),
                stop_token_ids=tuple(body.get("stop_token_ids", ())),
            )
            gen = reference.generate_sync(body["prompt"], params)
            choice = {
                "text": tokenizer.decode(gen.token_ids, skip_special_tokens=False),
                "finish_reason": gen.finish_reason,
            }
            if body["model"] == "tiny":  # "tiny-text" plays a server that returns text only
                choice["token_ids"] = gen.token_ids
                choice["logprobs"] = {
                    "tokens": [f"token_id:{t}" for t in gen.token_ids],
                    "token_logprobs": gen.logprobs,
                }
            self._send(200, {"choices": [choice]})

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_same_tokens_and_logprobs_as_the_engine_behind_it(runner, server, reference, tokenizer):
    engine = build_engine(OpenAIEngineConfig(base_url=server, model="tiny"))
    prompt = ChatFormat(tokenizer).prompt_ids("What is 1+1?")
    params = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(7,))
    remote = runner.run(engine.generate(prompt, params, "r"))
    local = reference.generate_sync(prompt, params)
    assert remote.token_ids == local.token_ids and remote.finish_reason == local.finish_reason
    assert remote.logprobs == pytest.approx(local.logprobs)
    assert engine.kv_capacity() is None
    with pytest.raises(RuntimeError, match='use an engine of kind "vllm"'):
        runner.run(engine.update_weights([]))
    runner.run(engine.close())


def test_errors_become_a_reason_not_an_exception(runner, server, tokenizer):
    wrong = OpenAIEngine(OpenAIEngineConfig(base_url=server, model="gpt-9"))
    gen = runner.run(wrong.generate([1, 2], SamplingParams(max_tokens=4), "r"))
    assert (
        gen.finish_reason == "error" and "HTTP 404" in gen.error and "gpt-9 not found" in gen.error
    )
    dead = OpenAIEngine(OpenAIEngineConfig(base_url="http://127.0.0.1:9/v1", model="tiny"))
    gen = runner.run(dead.generate([1, 2], SamplingParams(max_tokens=4), "r"))
    assert gen.finish_reason == "error" and "ConnectError" in gen.error
    runner.run(wrong.close())
    runner.run(dead.close())


def test_a_text_only_server_needs_a_tokenizer(runner, server, tokenizer):
    config = OpenAIEngineConfig(base_url=server, model="tiny-text")
    params = SamplingParams(max_tokens=12, temperature=0)
    without = OpenAIEngine(config)
    gen = runner.run(without.generate([1, 2, 3], params, "r"))
    assert gen.finish_reason == "error" and "pass a tokenizer" in gen.error
    with_tok = OpenAIEngine(config, tokenizer=tokenizer)
    gen = runner.run(with_tok.generate([1, 2, 3], params, "r"))
    assert gen.finish_reason == "length" and gen.token_ids and gen.logprobs == []
    runner.run(without.close())
    runner.run(with_tok.close())


def test_the_loop_runs_against_the_endpoint(runner, server, sandbox, tokenizer, roll_out):
    engine = OpenAIEngine(OpenAIEngineConfig(base_url=server, model="tiny"))
    config = RolloutConfig(n=3, max_turns=2, max_response_tokens=32, seed=1)
    trajs = runner.run(roll_out(engine, sandbox, tokenizer, config, [RolloutTask("p", "2+2?")]))
    for traj in trajs:
        traj.validate()
        assert traj.finish_reason != "error" and traj.sampled_tokens > 0
    runner.run(engine.close())
