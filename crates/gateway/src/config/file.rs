//! The configuration file as written: one `Raw*` type per table, every
//! field optional and every unknown field refused (`deny_unknown_fields`),
//! so a misspelt key is an error naming the file, never a silent default.
//! Nothing here checks a value: that is `validate.rs`, which turns
//! these into the runtime types of [`super::runtime`].

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) server: RawServer,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(super) alerts: Vec<RawAlert>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAlert {
    pub(super) url: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) events: Option<Vec<String>>,
    pub(super) aged_after: Option<String>,
    pub(super) give_up_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_token_env: Option<String>,
    pub(super) tls_cert: Option<String>,
    pub(super) tls_key: Option<String>,
    pub(super) admin_tls_cert: Option<String>,
    pub(super) admin_tls_key: Option<String>,
    pub(super) console_url: Option<String>,
    pub(super) header_read_timeout: Option<String>,
    pub(super) max_header_bytes: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) admin_max_connections: Option<usize>,
    pub(super) buffered_body_budget: Option<String>,
    pub(super) http2_max_concurrent_streams: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) url: Option<String>,
    pub(super) durability: Option<String>,
    pub(super) retention: Option<String>,
    pub(super) encryption_key_env: Option<String>,
    pub(super) previous_key_env: Option<String>,
    pub(super) scope_key_env: Option<String>,
    pub(super) scope_key_file: Option<String>,
    pub(super) lease: Option<String>,
    pub(super) require_synchronous_standby: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<String>,
    pub(super) profile: Option<String>,
    pub(super) path_prefix: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_ca: Option<String>,
    pub(super) upstream_client_cert: Option<String>,
    pub(super) upstream_client_key: Option<String>,
    pub(super) upstream_http2: Option<bool>,
    pub(super) methods: Option<Vec<String>>,
    pub(super) key: Option<String>,
    pub(super) derive_from: Option<Vec<String>>,
    pub(super) derive_window: Option<String>,
    pub(super) scope_headers: Option<Vec<String>>,
    pub(super) allow_anonymous: Option<bool>,
    pub(super) fingerprint_headers: Option<Vec<String>>,
    pub(super) ignore_fields: Option<Vec<String>>,
    pub(super) forward_key_header: Option<String>,
    pub(super) destination_key_header: Option<String>,
    pub(super) destination_key_window: Option<String>,
    pub(super) resend_unknown: Option<bool>,
    pub(super) in_progress: Option<String>,
    pub(super) rotated_keys: Option<String>,
    pub(super) wait_timeout: Option<String>,
    pub(super) max_waiters: Option<usize>,
    pub(super) quota_operations: Option<u32>,
    pub(super) quota_stored_bytes: Option<String>,
    pub(super) quota_window: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) max_upstream_connections: Option<usize>,
    pub(super) upstream_timeout: Option<String>,
    pub(super) late_window: Option<String>,
    pub(super) first_sent_skew: Option<String>,
    pub(super) connect_retries: Option<u32>,
    pub(super) release_statuses: Option<Vec<u16>>,
    pub(super) unknown_statuses: Option<Vec<u16>>,
    pub(super) max_body: Option<String>,
    pub(super) max_stored_response: Option<String>,
    pub(super) store_request_body: Option<bool>,
    pub(super) pause_after_unknown: Option<u32>,
    pub(super) reconcile: Option<RawReconcile>,
    pub(super) mcp: Option<RawMcp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcp {
    pub(super) read_only_tools: Option<Vec<String>>,
    pub(super) protected_tools: Option<Vec<String>>,
    pub(super) key_argument: Option<String>,
    pub(super) reconcile: Option<RawMcpReconcile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpReconcile {
    pub(super) tool: String,
    pub(super) tools: Option<Vec<String>>,
    pub(super) arguments: Option<String>,
    pub(super) found_json_pointer: Option<String>,
    pub(super) absent_json_pointer: Option<String>,
    pub(super) count_json_pointer: Option<String>,
    pub(super) min_age: Option<String>,
    pub(super) confirm_tool: Option<String>,
    pub(super) confirm_arguments: Option<String>,
    pub(super) confirm_absent_json_pointer: Option<String>,
    pub(super) timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReconcile {
    pub(super) url: String,
    pub(super) found_status: Option<u16>,
    pub(super) found_json_pointer: Option<String>,
    pub(super) result_json_pointer: Option<String>,
    pub(super) absent_status: Option<u16>,
    pub(super) absent_json_pointer: Option<String>,
    pub(super) count_json_pointer: Option<String>,
    pub(super) min_age: Option<String>,
    pub(super) confirm_url: Option<String>,
    pub(super) confirm_absent_status: Option<u16>,
    pub(super) confirm_absent_json_pointer: Option<String>,
    pub(super) timeout: Option<String>,
}
