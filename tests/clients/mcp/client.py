"""Calls one MCP tool with the Python SDK (`mcp`, pinned in requirements.txt):
a `ClientSession` over the SDK's Streamable HTTP client transport.

    python client.py --url http://127.0.0.1:PORT/mcp --tool create_task --args '{"title":"a"}' \
        [--times N] [--header 'Idempotency-Key: k1' ...] [--timeout SECONDS] \
        [--mode auto|legacy|2026-07-28] [--list-first] [--progress] [--confirm]

--mode picks how the session negotiates, as the SDK's own `Client(mode=...)` does:
  auto        (the SDK default) `server/discover` at 2026-07-28, falling back to the
              2025-11-25 `initialize` handshake when the server is not modern
  legacy      `initialize` handshake at 2025-11-25 (Mcp-Session-Id if the server mints one)
  2026-07-28  adopt 2026-07-28 without any probe: the first request is the tools/call

Each of the N calls is a fresh tools/call (a new JSON-RPC id) on the same session, and
prints one JSON line on stdout:
  {"isError": bool, "content": [...], "structuredContent": ... or null, "meta": result._meta or null}
or, when the call raised (timeout, JSON-RPC error, transport failure):
  {"error": "message", "code": JSON-RPC code or null, "kind": exception class}

Note the SDK's own traffic besides the calls: after the first successful call of a
tool it sends tools/list once (to validate structured output), unless --list-first
already listed the tools. Diagnostics (negotiated version) go to stderr.
Exit status: 0 when every call printed a result (isError included), 1 otherwise.
A transport failure on the 2026-07-28 path (e.g. the server dying before it answers)
tears down the SDK's transport instead of failing just that call: the run then prints
one error line for it and makes no further calls.
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import json
import sys
from typing import Any

from mcp.client._probe import negotiate_auto
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import Implementation


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--header", action="append", default=[], metavar="K:V", help="extra HTTP header, repeatable")
    p.add_argument("--tool", required=True)
    p.add_argument("--args", default="{}", help="tool arguments as a JSON object")
    p.add_argument("--times", type=int, default=1)
    p.add_argument("--timeout", type=float, default=None, help="read timeout per call, seconds")
    p.add_argument("--mode", default="auto", help="auto (default), legacy, or 2026-07-28")
    p.add_argument("--list-first", action="store_true", help="send tools/list before the calls")
    p.add_argument("--confirm", action="store_true", help="accept every elicitation with {confirm: true}")
    p.add_argument(
        "--progress",
        action="store_true",
        help="ask for progress (a progressToken in _meta); progress notifications go to stderr",
    )
    return p.parse_args()


def _headers(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            raise SystemExit(f"--header wants K:V, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _error_report(exc: BaseException) -> dict[str, Any]:
    # A transport failure (e.g. the server dying mid-request) can surface from the SDK's task
    # groups as an exception group: report the first leaf, which names the actual failure.
    group = getattr(builtins, "BaseExceptionGroup", ())  # Python >= 3.11
    while isinstance(exc, group) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return {"error": exc.error.message, "code": exc.error.code, "kind": type(exc).__name__}
    if isinstance(exc, TimeoutError):
        return {"error": f"timed out: {exc}", "code": None, "kind": type(exc).__name__}
    return {"error": str(exc) or repr(exc), "code": None, "kind": type(exc).__name__}


async def _confirm(_context: Any, _params: Any) -> Any:
    import mcp_types

    return mcp_types.ElicitResult(action="accept", content={"confirm": True})


async def _print_progress(progress: float, total: float | None, message: str | None) -> None:
    print(f"progress {progress}/{total} {message or ''}", file=sys.stderr)


async def _negotiate(session: ClientSession, mode: str) -> None:
    if mode == "legacy":
        await session.initialize()
    elif mode == "auto":
        await negotiate_auto(session)
    else:
        import mcp_types

        # Same as Client(mode="2026-07-28"): adopt a synthesized discover result, no probe.
        session.adopt(
            mcp_types.DiscoverResult(
                supported_versions=[mode],
                capabilities=mcp_types.ServerCapabilities(),
                result_type="complete",
                ttl_ms=0,
                cache_scope="public",
            )
        )


async def _run(ns: argparse.Namespace) -> int:
    try:
        arguments = json.loads(ns.args)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--args is not JSON: {e}") from e
    http_client = create_mcp_http_client(headers=_headers(ns.header))
    failures = 0
    async with http_client, streamable_http_client(ns.url, http_client=http_client) as (read, write):
        async with ClientSession(
            read,
            write,
            client_info=Implementation(name="idemgate-mcp-python-client", version="1.0.0"),
            elicitation_callback=_confirm if ns.confirm else None,
        ) as session:
            await _negotiate(session, ns.mode)
            print(f"negotiated protocol version {session.protocol_version}", file=sys.stderr)
            if ns.list_first:
                await session.list_tools()
            progress = _print_progress if ns.progress else None
            for _ in range(ns.times):
                try:
                    result = await session.call_tool(
                        ns.tool, arguments, read_timeout_seconds=ns.timeout, progress_callback=progress
                    )
                except Exception as exc:  # noqa: BLE001 - every failure is reported, not raised
                    failures += 1
                    _emit(_error_report(exc))
                    continue
                dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                _emit(
                    {
                        "isError": bool(dumped.get("isError", False)),
                        "content": dumped.get("content", []),
                        "structuredContent": dumped.get("structuredContent"),
                        "meta": dumped.get("_meta"),
                    }
                )
    return 1 if failures else 0


def main() -> None:
    ns = _parse_args()
    try:
        code = asyncio.run(_run(ns))
    except Exception as exc:  # noqa: BLE001 - connect/negotiation failure
        _emit(_error_report(exc))
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
