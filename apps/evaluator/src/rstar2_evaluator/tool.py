"""The code tool of an evaluation: rstar2-sandbox's backends, opened by `open_sandbox`.

A server's outage must not be scored as the model's tool errors. A call the servers could not
run comes back `sandbox_error`, which the agent loop turns into a failed trajectory (not
recorded, retried by a rerun); and `check_tool` asks remote servers for their info before the
run starts, so a wrong address is one line before anything is written.
"""

from __future__ import annotations

import asyncio

from rstar2_evaluator.config import EvalConfig
from rstar2_sandbox import RemoteSandboxConfig, SandboxClient, SandboxStartError, open_sandbox


class ToolError(ValueError):
    """The tool cannot be used as configured; the message is one actionable line."""


def check_tool(config: EvalConfig) -> None:
    """Raise ToolError when no configured sandbox server answers."""
    tool = config.tool
    if not isinstance(tool, RemoteSandboxConfig):
        return

    async def probe() -> int:
        async with open_sandbox(tool, config.sandbox) as client:
            assert isinstance(client, SandboxClient)
            return len(await client.info())

    try:
        answering = asyncio.run(probe())
    except SandboxStartError as exc:
        raise ToolError(str(exc)) from None
    if answering == 0:
        raise ToolError(
            f"no sandbox server answers at {','.join(tool.addresses)}; start one with "
            "`rstar2-sandbox serve`, fix tool.addresses, or use tool.kind=local"
        )
