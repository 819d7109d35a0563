"""An MCP server on stdio, made with the official Python SDK (`mcp`, which mcp-server-time
brings): one tool, `wait`, that writes `started` to the file named by its argument, sleeps,
and writes `cancelled` there when the client's `notifications/cancelled` stops it."""

import asyncio
import pathlib
import sys

from mcp.server.mcpserver import MCPServer

MARK = pathlib.Path(sys.argv[1])
server = MCPServer("slow")


@server.tool()
async def wait(seconds: float) -> str:
    """Sleeps `seconds`."""
    MARK.write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        MARK.write_text("cancelled")
        raise
    return "done"


if __name__ == "__main__":
    asyncio.run(server.run_stdio_async())
