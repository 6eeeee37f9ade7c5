#!/usr/bin/env python3
"""A TCP relay that delays every byte by a fixed time each way: a
replication link between two PostgreSQL servers on one machine made as far
apart as two zones (failover.sh). Order is kept per direction; nothing is
dropped. Listens on 127.0.0.1:LISTEN, connects each client to
127.0.0.1:TARGET.

    delay_relay.py LISTEN TARGET DELAY_MS
"""

import asyncio
import sys


async def pipe(reader, writer, delay):
    """Copies reader to writer, each chunk sent `delay` seconds after it came."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((loop.time() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, None))
    try:
        await sender
    except ConnectionError:
        pass


async def main():
    listen, target, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    delay = delay_ms / 1000

    async def relay(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pipe(client_reader, server_writer, delay),
            pipe(server_reader, client_writer, delay),
        )

    server = await asyncio.start_server(relay, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
