"""An MCP test server (Python SDK `mcp`, pinned in requirements.txt) over
Streamable HTTP, used as the upstream behind idemgate's `mcp` route profile.

    python server.py --port 0 --effects /tmp/effects.jsonl [--stateless] [--json-response] [--only-2025]

Listens on 127.0.0.1 (``--host``), endpoint ``/mcp``. With ``--port 0`` the
kernel picks a port. The server prints ``listening PORT`` on stdout (one
line, flushed) once the socket is bound, before serving.

Every execution of a side-effecting tool appends one JSON line to the effects
file: {"seq": N, "tool": NAME, "arguments": {...}, "pid": PID, "ts": UNIX_TS}.
`slow_create` also appends its arguments to EFFECTS.started as it begins, so a
test can act while the call is running.
``GET /_effects`` returns that file as a JSON array.

Tools:
  create_task(title)        non-idempotent; records an effect, returns "created task N"
  slow_create(title, ms)    sleeps ms (reporting progress if the client asked for it),
                            then records an effect like create_task
  held_create(title)        notes its start like slow_create, then waits (at most 30 s)
                            until EFFECTS.release holds a line with its title, then
                            records an effect like create_task
  die_after_effect(title)   records the effect, then os._exit(17) before answering; declares
                            an outputSchema ({"id": int}), as the SDK does for a typed return
  confirm_create(title)     asks the client to confirm (elicitation), then records an
                            effect like create_task
  list_tasks()              readOnlyHint=true; returns the titles recorded so far
  find_task(title)          readOnlyHint=true; structuredContent {"seq": N} of the
                            latest effect with that title, {"seq": null} if none

The SDK answers both protocol eras on the same endpoint: 2025-11-25 and older
(initialize handshake, Mcp-Session-Id unless --stateless) and 2026-07-28
(per-request _meta envelope, server/discover, no sessions); ``--only-2025``
refuses the latter, as a server of 2025-11-25 only does.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import sys
import time
from typing import Any

import listen
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    listen.add_arguments(p)
    p.add_argument("--effects", required=True, help="JSON-lines file, one line per tool side effect")
    p.add_argument("--stateless", action="store_true", help="no Mcp-Session-Id on the 2025-11-25 path")
    p.add_argument("--json-response", action="store_true", help="answer requests with application/json, not SSE")
    p.add_argument(
        "--only-2025",
        action="store_true",
        help="refuse 2026-07-28 requests as a server of 2025-11-25 only does (HTTP 400)",
    )
    p.add_argument(
        "--no-dns-rebinding-protection",
        action="store_true",
        help="accept any Host/Origin header (the SDK otherwise allows only localhost/127.0.0.1 hosts)",
    )
    return p.parse_args()


ARGS = _parse_args()
EFFECTS = os.path.abspath(ARGS.effects)
CREATING_TOOLS = ("create_task", "slow_create", "held_create", "die_after_effect")


def _read_effects() -> list[dict[str, Any]]:
    try:
        with open(EFFECTS, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _record_effect(tool: str, arguments: dict[str, Any]) -> int:
    """Append one effect line under an exclusive lock and return its 1-based sequence number."""
    with open(EFFECTS, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            seq = sum(1 for line in f if line.strip()) + 1
            entry = {"seq": seq, "tool": tool, "arguments": arguments, "pid": os.getpid(), "ts": time.time()}
            f.seek(0, os.SEEK_END)
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return seq


mcp = MCPServer(
    name="idemgate-mcp-test-server",
    version="1.0.0",
    instructions="Test upstream for idemgate's mcp route profile; every create records one effect.",
    log_level=ARGS.log_level,
)

NON_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


@mcp.tool(annotations=NON_IDEMPOTENT, structured_output=False)
def create_task(title: str) -> str:
    """Create a task (not idempotent: every call creates another one)."""
    n = _record_effect("create_task", {"title": title})
    return f"created task {n}"


@mcp.tool(annotations=NON_IDEMPOTENT, structured_output=False)
async def slow_create(title: str, ms: int, ctx: Context) -> str:
    """Wait `ms` milliseconds, then create a task like create_task."""
    with open(EFFECTS + ".started", "a", encoding="utf-8") as f:
        f.write(json.dumps({"title": title, "ms": ms}) + "\n")
    await ctx.report_progress(0, ms, "started")
    await asyncio.sleep(ms / 1000)
    n = _record_effect("slow_create", {"title": title, "ms": ms})
    await ctx.report_progress(ms, ms, "done")
    return f"created task {n}"


@mcp.tool(annotations=NON_IDEMPOTENT, structured_output=False)
async def held_create(title: str) -> str:
    """Wait until the test releases this title (EFFECTS.release), then create a task."""
    with open(EFFECTS + ".started", "a", encoding="utf-8") as f:
        f.write(json.dumps({"title": title}) + "\n")
    for _ in range(3000):
        try:
            with open(EFFECTS + ".release", encoding="utf-8") as f:
                if any(line.strip() == title for line in f):
                    break
        except FileNotFoundError:
            pass
        await asyncio.sleep(0.01)
    n = _record_effect("held_create", {"title": title})
    return f"created task {n}"


class Created(BaseModel):
    id: int


@mcp.tool(annotations=NON_IDEMPOTENT, structured_output=True)
def die_after_effect(title: str) -> Created:
    """Record the effect, then kill this server process before any answer is sent."""
    _record_effect("die_after_effect", {"title": title})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(17)


class Confirmation(BaseModel):
    confirm: bool


@mcp.tool(annotations=NON_IDEMPOTENT, structured_output=False)
async def confirm_create(title: str, ctx: Context) -> str:
    """Ask the client to confirm, then create a task like create_task."""
    answer = await ctx.elicit(message=f"Create task {title!r}?", schema=Confirmation)
    if answer.action != "accept" or not answer.data.confirm:
        return "not created"
    n = _record_effect("confirm_create", {"title": title})
    return f"created task {n}"


@mcp.tool(
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False),
    structured_output=False,
)
def list_tasks() -> str:
    """List the titles of the tasks created so far (read-only), as a JSON array."""
    titles = [e["arguments"].get("title") for e in _read_effects() if e.get("tool") in CREATING_TOOLS]
    return json.dumps(titles)


class Found(BaseModel):
    seq: int | None


@mcp.tool(
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False),
    structured_output=True,
)
def find_task(title: str) -> Found:
    """The latest task created with this title (read-only): its sequence number, or null."""
    found = [e["seq"] for e in _read_effects() if e.get("arguments", {}).get("title") == title]
    return Found(seq=found[-1] if found else None)


@mcp.custom_route("/_effects", methods=["GET"])
async def effects_route(_request: Request) -> Response:
    return JSONResponse(_read_effects())


async def _serve() -> None:
    security = (
        TransportSecuritySettings(enable_dns_rebinding_protection=False) if ARGS.no_dns_rebinding_protection else None
    )
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        json_response=ARGS.json_response,
        stateless_http=ARGS.stateless,
        transport_security=security,
        host=ARGS.host,
    )
    if ARGS.only_2025:
        app = _only_2025(app)
    await listen.serve(app, ARGS.host, ARGS.port, ARGS.log_level)


def _only_2025(app):
    """The app behind a refusal of every request announcing 2026-07-28, as
    a server that speaks 2025-11-25 and older answers one (HTTP 400,
    "Unsupported protocol version"): clients of 2025-11-25 and older pass."""

    async def only_2025(scope, receive, send):
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        if headers.get(b"mcp-protocol-version") == b"2026-07-28":
            response = JSONResponse(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "Bad Request: Unsupported protocol version: 2026-07-28"},
                },
                status_code=400,
            )
            await response(scope, receive, send)
            return
        await app(scope, receive, send)

    return only_2025

if __name__ == "__main__":
    asyncio.run(_serve())
