"""An MCP server on stdio, made with the official Python SDK (`mcp`, which mcp-server-time
brings), that counts the calls it starts: each tool appends a line (its process id) to the
file `<dir>/<tool>` (`dir` is its argument) as a call begins, sleeps `seconds` if that was
the tool's first call (so that a test can stop turnlog while it runs) and returns at once
otherwise, then answers `<tool>: start <n>`, `n` the lines the file holds.

Its tools differ only in what they tell clients about running twice: `idem` is annotated
`idempotentHint`, `readonly` `readOnlyHint`, and `once` nothing."""

import asyncio
import os
import pathlib
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

DIR = pathlib.Path(sys.argv[1])
server = MCPServer("counting")


async def count(tool: str, seconds: float) -> str:
    path = DIR / tool
    with path.open("a") as f:
        f.write(f"{os.getpid()}\n")
    starts = len(path.read_text().splitlines())
    if starts == 1:
        await asyncio.sleep(seconds)
    return f"{tool}: start {starts}"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
async def idem(seconds: float) -> str:
    """Counts its start; sleeps `seconds` the first time."""
    return await count("idem", seconds)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def readonly(seconds: float) -> str:
    """Counts its start; sleeps `seconds` the first time."""
    return await count("readonly", seconds)


@server.tool()
async def once(seconds: float) -> str:
    """Counts its start; sleeps `seconds` the first time."""
    return await count("once", seconds)


if __name__ == "__main__":
    asyncio.run(server.run_stdio_async())
