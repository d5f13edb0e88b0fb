"""`ApprovalRequest`: a tool call from kernel code waiting for the application's decision."""

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

logger = logging.getLogger(__name__)


class ApprovalRequest:
    """An MCP tool call approval request, yielded by `CodeExecutor.stream()`.

    The application must call `accept()` or `reject()`; the kernel's call waits until then (or
    until the executor's `approval_timeout`), and the wait does not count against the
    execution's timeout.

    Example:
        ```python
        async for item in executor.stream(code):
            match item:
                case ApprovalRequest() as req:
                    print(f"Tool call: {req}")
                    await req.accept()
        ```
    """

    def __init__(
        self,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        respond: Callable[[bool], Awaitable[None]],
    ):
        """
        Args:
            server_name: Name of the MCP server providing the tool.
            tool_name: Name of the tool to execute.
            tool_args: Arguments to pass to the tool.
            respond: Function to make an approval decision.
        """
        self.server_name = server_name
        self.tool_name = tool_name
        self.tool_args = tool_args
        # ipybox-rs: the registered server's command line or URL (`${VAR}` kept as written),
        # what the call reaches; None for shell commands. Set by the executor.
        self.server_command: str | None = None
        self._respond = respond
        # Set by the executor: a shell command (not a tool call), and how many identical queued
        # calls this decision answers.
        self._shell = False
        self._calls = 1
        self._decision: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def __str__(self) -> str:
        """`server.tool(a=1, name='x')` (Python ipybox 0.9.2's form), rendered by the same code as
        every ipybox prompt: names and strings quoted and escaped (control, bidi and zero-width
        characters visible), nothing cut; a shell command as it runs."""
        from ipybox import _ipybox

        return _ipybox.describe(
            self.server_name,
            self.tool_name,
            json.dumps(self.tool_args, default=repr),
            self._shell,
            self._calls,
        )

    def __repr__(self) -> str:
        return f"ApprovalRequest({self})"

    async def accept(self) -> None:
        """Accept the approval request: the tool call goes ahead."""
        self._set_decision(True)
        return await self._respond(True)

    async def reject(self) -> None:
        """Reject the approval request: the call fails in the kernel (`ApprovalRejectedError`), and
        the execution with it unless the code catches it."""
        self._set_decision(False)
        return await self._respond(False)

    async def response(self) -> bool:
        """Wait for and return the approval decision."""
        return await self._decision

    def on_decision(self, callback: Callable[[bool], None]) -> None:
        """Register a callback invoked once when a decision is made."""

        def invoke(result: bool) -> None:
            try:
                callback(result)
            except Exception:
                logger.exception("Error in approval decision callback")

        if self._decision.done():
            invoke(self._decision.result())
            return
        self._decision.add_done_callback(lambda fut: invoke(fut.result()))

    def set_on_decision(self, on_decision: Callable[[], None]) -> None:
        """Backwards-compatible alias for registering a decision callback."""
        self.on_decision(lambda _result: on_decision())

    def _set_decision(self, decision: bool) -> None:
        if not self._decision.done():
            self._decision.set_result(decision)


ApprovalCallback = Callable[[ApprovalRequest], Awaitable[None]]
"""An async function that receives an `ApprovalRequest` and accepts or rejects it."""
