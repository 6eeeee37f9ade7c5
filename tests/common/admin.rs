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
