//! The client side of a walk through an in-process gateway (`idemgate
//! demo`, `idemgate rehearse`): writes through the proxy listener as an
//! automation sends them, an operator's calls to the admin API, and what
//! each got.
//!
//! Invariant: the headers every proxied request carries (the route's
//! credentials, in a rehearsal) are sent and never shown: [`Answer`]
//! holds only what came back.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A request that got no answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CallError(String);

impl CallError {
    pub fn new(error: impl std::fmt::Display) -> CallError {
        CallError(error.to_string())
    }
}

/// What the client got for one request.
#[derive(Debug, Clone)]
pub struct Answer {
    pub(crate) status: StatusCode,
    /// `Idempotent-Replayed: true`.
    pub(crate) replayed: bool,
    /// The `Idempotency-Key` the gateway announced, if any.
    pub(crate) key: Option<String>,
    pub(crate) body: String,
}

impl Answer {
    /// The problem's name (`outcome-unknown`) when idemgate answered an
    /// error itself.
    /// On an MCP route it is the tool result's `dev.idemgate/problem`.
    pub fn problem(&self) -> Option<String> {
        let value = self.message()?;
        if let Some(name) = value["result"]["_meta"]["dev.idemgate/problem"].as_str() {
            return Some(name.to_string());
        }
        let name = value["type"]
            .as_str()?
            .strip_prefix("urn:idemgate:problem:")?;
        Some(name.to_string())
    }

    /// Whether this answer repeats `other`: the same status and body, but
    /// for a replay's own marker in an MCP result (`_meta`).
    pub fn repeats(&self, other: &Answer) -> bool {
        let result = |answer: &Answer| {
            let mut value = answer.message()?;
            let result = value.get_mut("result")?.as_object_mut()?;
            if let Some(Value::Object(meta)) = result.get_mut("_meta") {
                meta.remove("dev.idemgate/replayed");
                if meta.is_empty() {
                    result.remove("_meta");
                }
            }
            Some(value)
        };
        self.status == other.status
            && (self.body == other.body || result(self).is_some_and(|r| Some(r) == result(other)))
    }

    /// The body as JSON: the body itself, or an event stream's last
    /// message (an MCP answer streamed after relayed events).
    fn message(&self) -> Option<Value> {
        serde_json::from_str::<Value>(&self.body).ok().or_else(|| {
            let messages = idemgate::pipeline::sse::messages(self.body.as_bytes());
            serde_json::from_str(messages.last()?).ok()
        })
    }

    /// `201 {"id":1}`, or `409 outcome-unknown` for an error idemgate answered.
    pub fn summary(&self) -> String {
        match self.problem() {
            Some(name) => format!("{} {name}", self.status.as_u16()),
            None => format!("{} {}", self.status.as_u16(), self.body),
        }
    }

    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// A gateway's two listeners, as its client and its operator reach them.
#[derive(Clone)]
pub(crate) struct GatewayClient {
    client: Client<HttpConnector, Full<Bytes>>,
    gateway: SocketAddr,
    admin: SocketAddr,
    admin_token: String,
    /// Sent with every proxied request (credentials: never shown).
    headers: HeaderMap,
}

impl GatewayClient {
    /// A client of the gateway on `gateway` (plain HTTP) whose admin
    /// listener is `admin`, every proxied request carrying `headers`.
    pub fn new(
        gateway: SocketAddr,
        admin: SocketAddr,
        admin_token: String,
        headers: HeaderMap,
    ) -> GatewayClient {
        GatewayClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            gateway,
            admin,
            admin_token,
            headers,
        }
    }

    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// A JSON write (or any request) from the automation, with `key` as
    /// its `Idempotency-Key` if any.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Answer, CallError> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.gateway))
            .header("content-type", "application/json");
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.fetch(request, body).await
    }

    /// A keyed POST of `body` to `path`.
    pub async fn post(&self, path: &str, key: &str, body: &str) -> Result<Answer, CallError> {
        self.send(Method::POST, path, Some(key), body).await
    }

    /// An operator's call to the admin API.
    pub async fn admin(&self, method: Method, path: &str, body: &str) -> Result<Answer, CallError> {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.admin))
            .header("authorization", format!("Bearer {}", self.admin_token))
            .header("content-type", "application/json");
        self.fetch(request, body).await
    }

    /// The state the client's status lookup (`GET /.idemgate/operations/KEY`)
    /// gives, asked until it is `until` or `attempts` lookups, 50 ms
    /// apart, have passed; the last one seen.
    pub(crate) async fn state_until(
        &self,
        key: &str,
        until: &str,
        attempts: u32,
    ) -> Result<String, CallError> {
        let mut state = String::new();
        for _ in 0..attempts.max(1) {
            let status = self
                .send(
                    Method::GET,
                    &format!("/.idemgate/operations/{key}"),
                    None,
                    "",
                )
                .await?;
            state = status.json()["state"].as_str().unwrap_or("").to_string();
            if state == until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(state)
    }

    async fn fetch(
        &self,
        request: http::request::Builder,
        body: &str,
    ) -> Result<Answer, CallError> {
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(CallError::new)?;
        let response = self.client.request(request).await.map_err(CallError::new)?;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
        let key = header("idempotency-key");
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(CallError::new)?
            .to_bytes();
        Ok(Answer {
            status,
            replayed,
            key,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// Awaits every future concurrently (each in a task of its own), failing
/// with the first error.
pub async fn join_all<T, E, F>(futures: impl Iterator<Item = F>) -> Result<Vec<T>, E>
where
    F: std::future::Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: From<CallError> + Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(handle.await.map_err(|e| E::from(CallError::new(e)))??);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &str, replayed: bool) -> Answer {
        Answer {
            status: StatusCode::OK,
            replayed,
            key: None,
            body: body.into(),
        }
    }

    #[test]
    fn an_mcp_answer_reads_alike_streamed_or_not() {
        let result =
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}"#;
        let streamed = answer(
            &format!(
                "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"p\"}}\n\nevent: message\ndata: {result}\n\n"
            ),
            false,
        );
        let replay = answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}],"_meta":{"dev.idemgate/replayed":true}}}"#,
            true,
        );
        assert!(replay.repeats(&streamed));
        let held = answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true,"_meta":{"dev.idemgate/problem":"outcome-unknown"}}}"#,
            false,
        );
        assert_eq!(held.problem().as_deref(), Some("outcome-unknown"));
        assert_eq!(streamed.problem(), None);
    }
}
