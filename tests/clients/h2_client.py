"""HTTP/2 clients for tests/it/http2.rs, on one TCP connection each.

`same-key` is a well-behaved client (the h2 library, which also refuses a
response carrying connection-specific headers); the others write frames
themselves (hyperframe, hpack) to do what no library lets a client do:

  same-key PORT N KEY      N concurrent streams writing with one key
  write PORT HEADERS       one write whose headers (a JSON object) replace the
                           defaults of the same name; null leaves one out
  reset PORT KEY           a write whose stream is reset (RST_STREAM) at once
  split-length PORT KEY    a write whose content-length arrives in a first DATA
                           frame and more DATA after it, ending the stream
  stream-flood PORT N      N streams opened at once, past the server's limit
  rapid-reset PORT N       N streams each opened and reset at once (CVE-2023-44487)
  reset-accepted PORT N    N streams each reset once the server has read it
  settings-flood PORT N    N SETTINGS frames, none of their ACKs read
  continuation-flood PORT  one header block growing without end in CONTINUATIONs
  idle PORT                a connection that opens no stream (PINGs answered)

Each prints one JSON report as its last line. Every loop is bounded, and the
socket has a timeout: a server that stops reading ends the flood, it never
hangs the client.
"""

import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
BODY = b'{"title":"h2"}'
CANCEL = 0x8
TIMEOUT = 10


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def write_headers(key, path="/tasks", body=BODY):
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "127.0.0.1"),
        (":path", path),
        ("content-type", "application/json"),
        ("authorization", "Bearer alice-token"),
        ("idempotency-key", key),
        ("content-length", str(len(body))),
    ]


def same_key(port, n, key):
    """N streams at once with one key and body; every answer read whole."""
    return writes(port, [write_headers(key)] * n)


def write(port, replaced):
    """One write with the default headers, those named in `replaced` (a
    JSON object) replaced or, when null, left out; added at the end when
    not among the defaults (a `host` beside `:authority`)."""
    replaced = json.loads(replaced)
    headers = [
        (name, replaced.get(name, value))
        for name, value in write_headers("h2-write")
    ]
    headers += [(n, v) for n, v in replaced.items() if n not in dict(headers)]
    return writes(port, [[(n, v) for n, v in headers if v is not None]])


def split_length(port, key):
    """One write declaring 8 bytes, sent as a first DATA frame of those 8
    and, a moment later (the server has read them), a second one of 5 more
    that ends the stream: a malformed request (RFC 9113 §8.1.1)."""
    first, more = b'{"a":10}', b"0000}"
    sock = connect(port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = write_headers(key, body=first)
    conn.send_headers(1, headers)
    conn.send_data(1, first)
    sock.sendall(conn.data_to_send())
    time.sleep(0.3)
    conn.send_data(1, more, end_stream=True)
    sock.sendall(conn.data_to_send())
    status, reset = 0, False
    for _ in range(1_000):
        data = sock.recv(65536)
        if not data:
            break
        events = conn.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.StreamReset):
                reset = True
        sock.sendall(conn.data_to_send())
        if reset or any(isinstance(e, h2.events.StreamEnded) for e in events):
            break
    sock.close()
    return {"status": status, "reset": reset}


def writes(port, streams_headers):
    """A stream per header list at once, each with the body; every answer
    read whole."""
    n = len(streams_headers)
    sock = connect(port)
    # The library would refuse to send a `host` that disagrees with `:authority`.
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    streams = []
    for headers in streams_headers:
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, headers)
        conn.send_data(stream, BODY, end_stream=True)
        streams.append(stream)
    sock.sendall(conn.data_to_send())
    answers = {s: {"headers": {}, "body": b""} for s in streams}
    done = set()
    for _ in range(10_000):
        if len(done) == n:
            break
        data = sock.recv(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                answers[event.stream_id]["headers"] = {
                    k.decode(): v.decode() for k, v in event.headers
                }
            elif isinstance(event, h2.events.DataReceived):
                answers[event.stream_id]["body"] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                done.add(event.stream_id)
        sock.sendall(conn.data_to_send())
    sock.close()
    report = []
    for s in streams:
        headers = answers[s]["headers"]
        report.append(
            {
                "status": int(headers.get(":status", "0")),
                "replayed": headers.get("idempotent-replayed"),
                "header_names": sorted(headers),
                "body": answers[s]["body"].decode(errors="replace"),
            }
        )
    return {"answers": report}


def counts():
    """What [`Raw.count`] counts, none yet."""
    return {"closed": True, "goaway": None, "refused": 0, "reset": 0, "answers": 0,
            "statuses": {}, "settings_acks": 0, "ended": 0}


class Raw:
    """A connection written frame by frame."""

    def __init__(self, port):
        self.sock = connect(port)
        self.encoder = hpack.Encoder()
        # One per connection: the server's header blocks refer to its table.
        self.decoder = hpack.Decoder()
        self.buffer = b""
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())

    def send(self, *frames):
        self.sock.sendall(b"".join(f.serialize() for f in frames))

    def headers(self, stream, headers, end_stream=True, end_headers=True):
        frame = HeadersFrame(stream)
        frame.data = self.encoder.encode(headers)
        frame.flags = set()
        if end_stream:
            frame.flags.add("END_STREAM")
        if end_headers:
            frame.flags.add("END_HEADERS")
        return frame

    def frames(self):
        """Frames the server sends until it closes or goes quiet."""
        while True:
            while len(self.buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
                self.buffer = self.buffer[9 + length :]
                yield frame
            try:
                data = self.sock.recv(65536)
            except (socket.timeout, ConnectionError):
                return
            if not data:
                return
            self.buffer += data

    def until_ping_ack(self, seen=None):
        """Sends a PING and reads every frame up to its ACK: by then the
        server has read everything sent before it. Counts what came (into
        `seen`, if given)."""
        if seen is None:
            seen = counts()
        seen["closed"] = True
        try:
            self.send(PingFrame(0, opaque_data=b"idemgate"))
        except (socket.timeout, ConnectionError):
            return seen
        for _, frame in zip(range(1_000_000), self.frames()):
            if isinstance(frame, PingFrame) and "ACK" in frame.flags:
                seen["closed"] = False
                break
            self.count(frame, seen)
        return seen

    def count(self, frame, seen):
        """Counts a frame the server sent into `seen`."""
        if isinstance(frame, GoAwayFrame):
            seen["goaway"] = frame.error_code
        elif isinstance(frame, RstStreamFrame):
            seen["reset"] += 1
            seen["ended"] += 1
            if frame.error_code == 0x7:
                seen["refused"] += 1
        elif isinstance(frame, HeadersFrame):
            status = dict(self.decoder.decode(frame.data)).get(":status", "?")
            seen["answers"] += 1
            seen["statuses"][status] = seen["statuses"].get(status, 0) + 1
        elif isinstance(frame, SettingsFrame) and "ACK" in frame.flags:
            seen["settings_acks"] += 1
        if "END_STREAM" in frame.flags:
            seen["ended"] += 1


def reset(port, key):
    """A write sent whole, its stream reset before any answer."""
    raw = Raw(port)
    body = DataFrame(1, data=BODY)
    body.flags = {"END_STREAM"}
    raw.send(raw.headers(1, write_headers(key, "/slow?ms=300"), end_stream=False), body,
             RstStreamFrame(1, error_code=CANCEL))
    return raw.until_ping_ack()


def stream_flood(port, n):
    """N writes at once; read until each stream is answered or reset."""
    raw = Raw(port)
    frames = [raw.headers(1 + 2 * i, write_headers(f"flood-{i}", "/tasks?ms=300", b""))
              for i in range(n)]
    raw.send(*frames)
    seen = raw.until_ping_ack()
    for _, frame in zip(range(100_000), raw.frames()):
        raw.count(frame, seen)
        if seen["ended"] >= n:
            break
    return seen


def flood(raw, batches):
    """Sends each batch of frames until the server stops taking them (it
    closed, or stopped reading), then reads up to a PING's answer. Reports
    how many batches went out as `sent`."""
    sent = 0
    try:
        for frames in batches:
            raw.send(*frames)
            sent += 1
    except (socket.timeout, ConnectionError):
        pass
    seen = raw.until_ping_ack()
    seen["sent"] = sent
    return seen


def rapid_reset(port, n):
    raw = Raw(port)
    streams = (1 + 2 * i for i in range(n))
    return flood(raw, ((raw.headers(s, write_headers(f"reset-{s}", "/hold", b"")),
                        RstStreamFrame(s, error_code=CANCEL)) for s in streams))


def reset_accepted(port, n):
    """Each stream reset only after the server read it (a PING answered
    after it): what h2's count of streams reset before they were accepted
    does not see, and the gateway's own stream slots must bound."""
    raw = Raw(port)
    seen = None
    for i in range(n):
        stream = 1 + 2 * i
        answered = seen["answers"] if seen else 0
        raw.send(raw.headers(stream, write_headers(f"accepted-{i}", "/hold", b"")))
        seen = raw.until_ping_ack(seen)
        # A stream past the server's slots is answered at once, by a task
        # of its own that may run after the PING's ACK: a few more round
        # trips for its answer to come before the stream is reset.
        for _ in range(3):
            if seen["closed"] or seen["answers"] > answered:
                break
            seen = raw.until_ping_ack(seen)
        if seen["closed"]:
            break
        raw.send(RstStreamFrame(stream, error_code=CANCEL))
    seen = raw.until_ping_ack(seen)
    return seen


def settings_flood(port, n):
    """N SETTINGS frames, never reading the ACKs each one asks for: a server
    that queued ACKs without bound would take them all; one that stops
    reading while it cannot send stops this client (its send times out)."""
    raw = Raw(port)
    raw.sock.settimeout(2)
    batch = b"".join(SettingsFrame(0, settings={0x4: 65535}).serialize() for _ in range(1000))
    sent, stopped = 0, False
    try:
        for _ in range(n // 1000):
            raw.sock.sendall(batch)
            sent += 1000
    except (socket.timeout, ConnectionError):
        stopped = True
    raw.sock.close()
    return {"sent": sent, "stopped": stopped}


def continuation_flood(port):
    raw = Raw(port)
    first = raw.headers(1, write_headers("continued", "/tasks"), end_stream=True, end_headers=False)
    junk = ContinuationFrame(1, data=raw.encoder.encode([("x-junk", "a" * 16000)]))
    # 64 MiB at most: far past any header list a server should take.
    seen = flood(raw, [[first]] + [[junk]] * 4096)
    seen["sent_bytes"] = max(seen["sent"] - 1, 0) * len(junk.data)
    return seen


def idle(port):
    """Opens a connection and no stream, answering the server's PINGs, and
    reads until the server closes it (or the socket's timeout)."""
    raw = Raw(port)
    seen = counts()
    for _, frame in zip(range(10_000), raw.frames()):
        if isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            raw.send(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]))
        raw.count(frame, seen)
    return seen


def main():
    command, port = sys.argv[1], int(sys.argv[2])
    if command == "same-key":
        report = same_key(port, int(sys.argv[3]), sys.argv[4])
    elif command == "write":
        report = write(port, sys.argv[3])
    elif command == "reset":
        report = reset(port, sys.argv[3])
    elif command == "split-length":
        report = split_length(port, sys.argv[3])
    elif command == "stream-flood":
        report = stream_flood(port, int(sys.argv[3]))
    elif command == "rapid-reset":
        report = rapid_reset(port, int(sys.argv[3]))
    elif command == "reset-accepted":
        report = reset_accepted(port, int(sys.argv[3]))
    elif command == "settings-flood":
        report = settings_flood(port, int(sys.argv[3]))
    elif command == "idle":
        report = idle(port)
    elif command == "continuation-flood":
        report = continuation_flood(port)
    else:
        raise SystemExit(f"unknown command {command}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
