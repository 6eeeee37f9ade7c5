//! Every default a key of the file has, written once, as the file would
//! spell it: the validator fills a key left out from here (and from
//! nowhere else), and tests/docs.rs checks that docs/configuration.md and
//! `config/idemgate.toml` give these same values. A key that is optional
//! without a default (a quota, a probe, TLS files) has none here.

/// `[server]`.
pub mod server {
    pub const LISTEN: &str = "127.0.0.1:8080";
    pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
    /// Also `idemgate keys --token-env`'s default: the same token.
    pub const ADMIN_TOKEN_ENV: &str = "IDEMGATE_ADMIN_TOKEN";
    pub const HEADER_READ_TIMEOUT: &str = "10s";
    pub const MAX_HEADER_BYTES: &str = "64KiB";
    pub const SHUTDOWN_GRACE: &str = "30s";
    pub const MAX_CONNECTIONS: usize = 4096;
    pub const ADMIN_MAX_CONNECTIONS: usize = 64;
    pub const BUFFERED_BODY_BUDGET: &str = "256MiB";
    pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
}

/// `[store]`.
pub mod store {
    pub const URL: &str = "sqlite://idemgate.db";
    pub const DURABILITY: &str = "full";
    pub const RETENTION: &str = "24h";
    /// PostgreSQL only.
    pub const LEASE: &str = "10s";
    /// PostgreSQL only: docs/replicas.md, "Failover".
    pub const REQUIRE_SYNCHRONOUS_STANDBY: bool = false;
}

/// `[[routes]]`.
pub mod route {
    pub const PROFILE: &str = "idemgate";
    pub const PATH_PREFIX: &str = "/";
    pub const METHODS: &[&str] = &["POST", "PATCH"];
    pub const KEY: &str = "require";
    pub const DERIVE_WINDOW: &str = "10m";
    pub const SCOPE_HEADERS: &[&str] = &["authorization"];
    pub const ALLOW_ANONYMOUS: bool = false;
    pub const FINGERPRINT_HEADERS: &[&str] = &["content-type"];
    pub const FORWARD_KEY_HEADER: &str = "Idempotency-Key";
    /// None: no destination key unless the route names its header.
    pub const DESTINATION_KEY_HEADER: &str = "";
    /// docs/decisions.md, "A destination key".
    pub const RESEND_UNKNOWN: bool = false;
    pub const IN_PROGRESS: &str = "reject";
    /// docs/decisions.md, "A rotated key".
    pub const ROTATED_KEYS: &str = "off";
    pub const WAIT_TIMEOUT: &str = "10s";
    pub const MAX_WAITERS: usize = 256;
    /// Only with `quota_operations` or `quota_stored_bytes`.
    pub const QUOTA_WINDOW: &str = "1m";
    pub const CONNECT_TIMEOUT: &str = "5s";
    /// One for each of `server.max_connections`' default: HTTP/1.1 clients,
    /// an exchange at a time per connection, never wait for one; HTTP/2
    /// clients' streams (up to 100 a connection) are held to it
    /// (docs/deploying.md, "File descriptors").
    pub const MAX_UPSTREAM_CONNECTIONS: usize = 4096;
    pub const UPSTREAM_TIMEOUT: &str = "30s";
    pub const LATE_WINDOW: &str = "60s";
    /// Only read under a profile with a first-sent header (`oasis`).
    pub const FIRST_SENT_SKEW: &str = "5m";
    pub const CONNECT_RETRIES: u32 = 2;
    pub const RELEASE_STATUSES: &[u16] = &[429, 503];
    pub const UNKNOWN_STATUSES: &[u16] = &[502, 504];
    pub const MAX_BODY: &str = "10MiB";
    pub const MAX_STORED_RESPONSE: &str = "1MiB";
    pub const STORE_REQUEST_BODY: bool = false;
    pub const UPSTREAM_HTTP2: bool = false;
    pub const PAUSE_AFTER_UNKNOWN: u32 = 100;
    /// `key` under `profile = "mcp"`: identical keyless tool calls are one.
    pub const MCP_KEY: &str = "derive";
    /// `in_progress` under `profile = "mcp"`: an agent's retry of a call
    /// still running gets its result, not a refusal it would retry again.
    pub const MCP_IN_PROGRESS: &str = "wait";
    /// `rotated_keys` under `profile = "mcp"`: agents mint a key per
    /// attempt (docs/decisions.md, "A rotated key").
    pub const MCP_ROTATED_KEYS: &str = "hold";
}

/// `[routes.reconcile]`.
pub mod reconcile {
    pub const FOUND_STATUS: u16 = 200;
    pub const TIMEOUT: &str = "5s";
    /// How long after an attempt became `unknown` an answer of absence is
    /// believed: the destination may still be committing a write whose
    /// answer was lost, and its index catching up (docs/decisions.md,
    /// "Probe verdicts"). Also `[routes.mcp.reconcile]`'s.
    pub const MIN_AGE: &str = "1m";
}

/// `[routes.mcp.reconcile]` (its `timeout` and `min_age` are
/// `reconcile`'s).
pub mod mcp_reconcile {
    pub const ARGUMENTS: &str = "{}";
}

/// `[[alerts]]` (`events` defaults to every event).
pub mod alert {
    pub const AGED_AFTER: &str = "1h";
    pub const GIVE_UP_AFTER: &str = "24h";
}
