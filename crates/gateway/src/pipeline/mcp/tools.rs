//! What an MCP server says of its own tools: which are read-only, as the
//! `tools/list` answers passing through its route report them
//! (`annotations.readOnlyHint`).
//!
//! Invariants: an annotation is a hint from the server, so it only decides
//! for a tool the route's `[routes.mcp]` names in neither list
//! (`pipeline::mcp::call`); what is learned is the endpoint's, as one
//! caller reaches it (the path below the route's prefix, with its query
//! and the caller's scope, which is how calls are told apart too): one
//! route may front several servers, and one server's read-only `sync`
//! says nothing of another's; a server may list its tools otherwise for
//! another tenant or user (a query or a credential naming them), and one
//! caller's read-only hint must not leave another's write unprotected;
//! the latest list an endpoint answers that names a tool
//! decides for it there, so a tool whose hint is withdrawn is protected
//! again; what is learned is kept in memory per route, never stored.

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::BytesMut;
use http::Response;
use http_body_util::BodyExt;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::body::{Prefixed, ProxyBody, full, stream};
use crate::config::Route;
use crate::pipeline::sse;

/// Each endpoint's tools, and whether its latest listing said
/// `readOnlyHint: true`.
#[derive(Debug, Default)]
pub struct Learned {
    read_only: RwLock<HashMap<(String, String), bool>>,
}

/// Tools remembered per route at most, of all its endpoints and callers: a
/// server listing more, or callers listing under ever new queries, cannot
/// grow the map without bound. A full map forgets one entry for each new
/// one, so the latest listings are always learned; a forgotten read-only
/// hint only protects its tool's calls again until it is listed again.
const MAX_TOOLS: usize = 4096;

impl Learned {
    /// Whether `endpoint`'s latest listing of `tool` hinted it read-only.
    pub fn read_only(&self, endpoint: &str, tool: &str) -> bool {
        let learned = self.read_only.read().unwrap_or_else(|e| e.into_inner());
        let key = (endpoint.to_string(), tool.to_string());
        learned.get(&key).copied().unwrap_or(false)
    }

    /// Notes the tools an answer to `tools/list` from `endpoint` lists: a
    /// JSON-RPC response, or an event stream holding one.
    pub fn note_list(&self, endpoint: &str, answer: &[u8]) {
        let messages = match serde_json::from_slice::<Value>(answer) {
            Ok(message) => vec![message],
            Err(_) => sse::messages(answer)
                .iter()
                .filter_map(|data| serde_json::from_str(data).ok())
                .collect(),
        };
        let mut learned = self.read_only.write().unwrap_or_else(|e| e.into_inner());
        for message in messages {
            let Some(tools) = message.pointer("/result/tools").and_then(Value::as_array) else {
                continue;
            };
            for tool in tools {
                let Some(name) = tool.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let read_only =
                    tool.pointer("/annotations/readOnlyHint") == Some(&Value::Bool(true));
                let key = (endpoint.to_string(), name.to_string());
                let full = learned.len() >= MAX_TOOLS && !learned.contains_key(&key);
                if let Some(forgotten) = full.then(|| learned.keys().next().cloned()).flatten() {
                    learned.remove(&forgotten);
                }
                learned.insert(key, read_only);
            }
        }
    }
}

/// The endpoint a listing from `uri` by the caller of `scope` (its
/// digest) speaks for, and a call there asks about: its path below the
/// route's `prefix`, then a digest of its query and of `scope` — a token
/// a query or a credential carries is never kept.
pub fn listed_at(uri: &http::Uri, prefix: &str, scope: &str) -> String {
    let path = uri.path();
    let below = path.strip_prefix(prefix).unwrap_or(path);
    let caller = Sha256::new()
        .chain_update(uri.query().unwrap_or_default())
        .chain_update([0])
        .chain_update(scope)
        .finalize();
    format!("{below} {}", hex::encode(&caller[..16]))
}

/// The answer to a `tools/list` passing through `route` from `endpoint`,
/// noted in `learned` when it is read whole within the route's
/// `max_stored_response` and `upstream_timeout`; answered as it came
/// either way (a larger one streamed on, unread).
pub async fn read_listing(
    response: Response<ProxyBody>,
    route: &Route,
    (learned, endpoint): (&Learned, &str),
) -> Response<ProxyBody> {
    let (parts, body) = response.into_parts();
    let mut body = body;
    let mut read = BytesMut::new();
    let deadline = tokio::time::Instant::now() + route.upstream_timeout;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            // Cut, late or failed: what was read goes on first, then the rest.
            _ => return Response::from_parts(parts, stream(Prefixed::new(read.freeze(), body))),
        };
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
        }
        if read.len() > route.max_stored_response {
            return Response::from_parts(parts, stream(Prefixed::new(read.freeze(), body)));
        }
    }
    let read = read.freeze();
    learned.note_list(endpoint, &read);
    Response::from_parts(parts, full(read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_listing_decides() {
        let learned = Learned::default();
        learned.note_list(
            "",
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"list_tasks","annotations":{"readOnlyHint":true}},
            {"name":"create_task","annotations":{"readOnlyHint":false}},
            {"name":"plain"}]}}"#,
        );
        assert!(learned.read_only("", "list_tasks"));
        assert!(!learned.read_only("", "create_task"));
        assert!(!learned.read_only("", "plain"));
        assert!(!learned.read_only("", "unlisted"));
        // Listed again without the hint, over an event stream.
        learned.note_list(
            "",
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"tools\":[{\"name\":\"list_tasks\"}]}}\n\n",
        );
        assert!(!learned.read_only("", "list_tasks"));
    }

    /// Two servers behind one route, each with a tool `sync`: one's
    /// read-only hint made the other's write unprotected.
    #[test]
    fn what_an_endpoint_lists_is_its_own() {
        let learned = Learned::default();
        let sync = |read_only: bool| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[
                {{"name":"sync","annotations":{{"readOnlyHint":{read_only}}}}}]}}}}"#
            )
        };
        learned.note_list("/github", sync(false).as_bytes());
        learned.note_list("/jira", sync(true).as_bytes());
        assert!(learned.read_only("/jira", "sync"));
        assert!(!learned.read_only("/github", "sync"), "the other server's");
        assert!(
            !learned.read_only("", "sync"),
            "the prefix's own is another endpoint"
        );
    }

    /// Listings under ever new queries (or by ever new callers) filled the
    /// map, and no later caller's hints were learned: the latest are.
    #[test]
    fn a_full_map_still_learns_the_latest_listing() {
        let learned = Learned::default();
        let read_only = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"lookup","annotations":{"readOnlyHint":true}}]}}"#;
        for n in 0..MAX_TOOLS + 10 {
            learned.note_list(&format!("/?n={n}"), read_only);
        }
        learned.note_list("/mine", read_only);
        assert!(learned.read_only("/mine", "lookup"));
        let kept = learned.read_only.read().unwrap().len();
        assert_eq!(kept, MAX_TOOLS);
    }

    /// A listing a server answers one caller speaks for that caller:
    /// another query (a tenant, a token) or another scope (a credential)
    /// is another endpoint, and neither the query nor the scope is kept.
    #[test]
    fn an_endpoint_is_reached_by_one_caller() {
        let at =
            |uri: &'static str, scope: &str| listed_at(&http::Uri::from_static(uri), "/mcp", scope);
        assert_eq!(at("/mcp/jira?t=1", "a"), at("/mcp/jira?t=1", "a"));
        assert_ne!(at("/mcp/jira?t=1", "a"), at("/mcp/jira?t=2", "a"));
        assert_ne!(at("/mcp/jira?t=1", "a"), at("/mcp/jira?t=1", "b"));
        assert_ne!(at("/mcp/jira", "a"), at("/mcp/github", "a"));
        // The query and the scope are not read as each other.
        assert_ne!(at("/mcp/jira?a", ""), at("/mcp/jira", "a"));
        let endpoint = at("/mcp/jira?token=secret-u1", "a");
        assert!(endpoint.starts_with("/jira "), "{endpoint}");
        assert!(!endpoint.contains("secret"), "{endpoint}");
    }
}
