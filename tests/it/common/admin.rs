//! Calls to the admin API.

use super::*;

/// One admin API call with `Authorization: Bearer <token>` (none when
/// `token` is `None`); a non-empty `body` is sent as JSON.
pub async fn admin_call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Response {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(auth) = &authorization {
        headers.push(("authorization", auth.as_str()));
    }
    if !body.is_empty() {
        headers.push(("content-type", "application/json"));
    }
    send(admin, method, path, &headers, body.to_owned()).await
}

/// The admin listener's `GET /metrics` text.
pub async fn scrape_metrics(admin: SocketAddr) -> String {
    let resp = send(admin, "GET", "/metrics", &[], Bytes::new()).await;
    assert_eq!(resp.status, StatusCode::OK, "GET /metrics");
    String::from_utf8(resp.body.to_vec()).expect("metrics are utf-8")
}

/// The value of one series (`name{labels}`, exactly as exposed) in a
/// metrics text, if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
