"""What the test MCP servers (server.py, everything.py) share: their --port and
--log-level arguments, and serving an ASGI app on a bound socket, printing
``listening PORT`` (one line, flushed) before serving, so a test reads the port
a ``--port 0`` server got."""

from __future__ import annotations

import argparse
import socket

import uvicorn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--port (0: a free port) and --log-level."""
    parser.add_argument("--port", type=int, required=True, help="0: pick a free port; 'listening PORT' is printed")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])


async def serve(app, host: str, port: int, log_level: str) -> None:
    """Binds host:port, prints the port, and serves `app` until stopped; open
    connections are waited for at most 3 s on SIGTERM."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    config = uvicorn.Config(app, log_level=log_level.lower(), lifespan="on", timeout_graceful_shutdown=3)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])
