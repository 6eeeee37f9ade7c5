//! Raw TCP, for malformed or hand-framed requests.

use super::*;

/// A raw HTTP/1.1 response read off a socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The head as text (status line and headers), lowercased.
    pub head: String,
    pub body: Vec<u8>,
    /// Interim 1xx status codes seen before the final response.
    pub interim: Vec<u16>,
}

/// Writes `request` to a new connection and reads one final response
/// (skipping 1xx). `None` when the peer closed or reset before a full head.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let exchange = async {
        // A peer that refuses early may reset while we still write: keep
        // reading whatever it answered.
        let _ = stream.write_all(request).await;
        read_response(&mut stream).await
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .expect("raw exchange timed out")
}

/// Like [`raw_exchange`], but shuts down the write side once `request` is
/// written, as a client with nothing more to say may (tools, shell pipes).
pub async fn half_closed_exchange(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let exchange = async {
        stream.write_all(request).await.expect("write");
        stream.shutdown().await.expect("shutdown write side");
        read_response(&mut stream).await
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .expect("half-closed exchange timed out")
}

/// Reads one final response from `stream` (skipping 1xx).
pub async fn read_response(stream: &mut TcpStream) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let mut interim = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        buf.drain(..head_end);
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line: {head:?}"));
        if (100..200).contains(&status) {
            interim.push(status);
            continue;
        }
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == "content-length")
            .and_then(|(_, v)| v.trim().parse::<usize>().ok());
        let mut body = buf;
        let mut chunk = [0u8; 8192];
        loop {
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        return Some(RawResponse {
            status,
            head,
            body,
            interim,
        });
    }
}

impl RawResponse {
    /// The body as its framing gives it: the chunks' data, joined, when
    /// it came chunked; as read otherwise.
    pub fn content(&self) -> Vec<u8> {
        if !self.head.contains("transfer-encoding: chunked") {
            return self.body.clone();
        }
        let (mut content, mut rest) = (Vec::new(), &self.body[..]);
        while let Some(line_end) = find(rest, b"\r\n") {
            let size = std::str::from_utf8(&rest[..line_end])
                .ok()
                .and_then(|size| usize::from_str_radix(size.trim(), 16).ok())
                .unwrap_or_else(|| panic!("bad chunk size in {:?}", self.body));
            if size == 0 {
                break;
            }
            let data = line_end + 2;
            content.extend_from_slice(&rest[data..data + size]);
            rest = &rest[data + size + 2..];
        }
        content
    }
}

/// Every file in `dir` whose name starts with `prefix`, as bytes (a
/// SQLite store's database, WAL and shared memory files).
pub fn files_starting_with(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) {
            found.push((name, std::fs::read(entry.path()).expect("read file")));
        }
    }
    found
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A raw POST head (no body) with the given extra header lines.
pub fn raw_post_head(path: &str, extra_headers: &[&str]) -> String {
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: idemgate.test\r\n");
    for line in extra_headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head
}

/// A raw POST head for a write by alice: its `content_type`, the
/// `idempotency-key` line as written, then the `more` header lines.
pub fn raw_write_head(path: &str, content_type: &str, key: &str, more: &[&str]) -> String {
    let (content_type, key) = (
        format!("content-type: {content_type}"),
        format!("idempotency-key: {key}"),
    );
    let authorization = format!("authorization: {ALICE}");
    let mut lines = vec![content_type.as_str(), key.as_str(), authorization.as_str()];
    lines.extend_from_slice(more);
    raw_post_head(path, &lines)
}

/// Encodes `body` as one chunk plus the last chunk.
pub fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

/// A loopback port that refuses every connection: a socket bound to it
/// that never listens. It stays bound while the value lives, so no other
/// test's server (a gateway on port 0, say) can take the port meanwhile and
/// answer in its place.
pub struct RefusingPort {
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl RefusingPort {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Frees the port for a server the test starts on it now ("the
    /// destination comes back").
    pub fn release(self) -> SocketAddr {
        self.addr
    }
}

impl std::fmt::Display for RefusingPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.addr.fmt(f)
    }
}

/// A port nothing answers on for as long as the returned value lives.
pub async fn closed_port() -> RefusingPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = socket.local_addr().expect("addr");
    RefusingPort {
        _socket: socket,
        addr,
    }
}

/// A loopback listener whose accept queue is full, so that a connect to
/// it gets no answer to its SYN (Linux drops a SYN while the queue is
/// full) and hangs until the connector's own timeout, as one to an
/// overloaded or firewalled upstream does; until [`SilentPort::serve`].
pub struct SilentPort {
    listener: TcpListener,
    /// The connections that fill the queue, never accepted meanwhile.
    _queued: Vec<TcpStream>,
}

impl SilentPort {
    pub fn addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("silent addr")
    }

    /// "The upstream starts accepting": the fake upstream serves on it
    /// from now on (the connections that filled the queue, sending
    /// nothing, are no requests).
    pub fn serve(self) -> FakeUpstream {
        FakeUpstream::accepting(self.listener)
    }
}

/// A port whose connects hang unanswered ([`SilentPort`]): listening with
/// a backlog of 0, connected to until a connect is not answered within a
/// moment — the queue is full then.
pub async fn silent_port() -> SilentPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    for _ in 0..8 {
        let connect = TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_millis(300), connect).await {
            Ok(Ok(stream)) => queued.push(stream),
            Ok(Err(e)) => panic!("connect to a listening port: {e}"),
            Err(_) => {
                return SilentPort {
                    listener,
                    _queued: queued,
                };
            }
        }
    }
    panic!("a listener with backlog 0 still answered 8 connects: its SYNs are not dropped");
}

/// Asserts the gateway still proxies a plain GET after some abuse.
pub async fn assert_still_serving(gw: &TestGateway) {
    let resp = send(gw.addr(), "GET", "/alive", &[], Bytes::new()).await;
    assert_eq!(resp.status, StatusCode::OK, "gateway stopped serving");
    let health = send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK, "admin stopped serving");
}
