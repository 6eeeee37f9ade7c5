//! Phase 0, beside the path: the request's method in one spelling.
//!
//! Methods are case-sensitive (RFC 9110 §9.1), but many upstreams read
//! `post` as `POST` (Werkzeug and Django upper-case it, Fetch sends
//! `patch` as written): a write spelled `post` would otherwise not be one
//! the route intercepts, and would be passed through, unprotected, to an
//! upstream that performs it as a `POST` each time it is retried.
//!
//! The same holds for an extension method a route names among its
//! `methods` (`PURGE`, `MKCOL`): Werkzeug and Django upper-case those too.
//!
//! Invariant: after [`normalize`], a request whose method is a standard
//! method (RFC 9110 §9.3 and `PATCH`, RFC 5789) in any case carries it
//! upper-case, and once its route is chosen ([`normalize_for`]), one the
//! route names in any case carries it as named (upper-case), so the route
//! intercepts it, the fingerprint reads it and the upstream gets it so;
//! any other method keeps its spelling. `HEAD` and `CONNECT` are left out: hyper frames the answer to a `head` it parsed
//! as another method, and no route takes either as a write. `CONNECT`, in
//! any case, is refused ([`refuse_tunnel`]): it asks for a tunnel, which a
//! reverse proxy does not make, and hyper would turn a 2xx answer to it
//! into one, the answer's body lost.

use http::{Method, Request};

/// The standard methods, upper-case, but for `HEAD` and `CONNECT`.
const STANDARD: [Method; 7] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// A method the gateway does not serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error(
        "CONNECT asks for a tunnel, which the gateway does not make (it is a reverse proxy); nothing was sent"
    )]
    Tunnel,
}

/// Refuses `CONNECT`, spelled in any case.
pub fn refuse_tunnel(method: &Method) -> Result<(), MethodError> {
    if method
        .as_str()
        .eq_ignore_ascii_case(Method::CONNECT.as_str())
    {
        return Err(MethodError::Tunnel);
    }
    Ok(())
}

/// Brings an extension method one of the route's `methods` names (`PURGE`,
/// `MKCOL`), spelled in another case, into the route's spelling, in place.
pub fn normalize_for<B>(methods: &[Method], request: &mut Request<B>) {
    let method = request.method();
    if methods.contains(method) {
        return;
    }
    let spelled = method.as_str();
    if let Some(named) = methods
        .iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(spelled))
    {
        *request.method_mut() = named.clone();
    }
}

/// Brings a standard method spelled in another case into upper case, in
/// place.
pub fn normalize<B>(request: &mut Request<B>) {
    let method = request.method();
    // hyper parses the standard methods, upper-case, into their own
    // variants: only another spelling is an extension method here.
    if STANDARD.contains(method) || method == Method::HEAD || method == Method::CONNECT {
        return;
    }
    let spelled = method.as_str();
    if let Some(standard) = STANDARD
        .iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(spelled))
    {
        *request.method_mut() = standard.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(method: &str) -> String {
        let mut request = Request::builder().method(method).body(()).unwrap();
        normalize(&mut request);
        request.method().as_str().to_string()
    }

    #[test]
    fn a_standard_method_in_any_case_is_upper_case() {
        for (sent, read) in [
            ("post", "POST"),
            ("Post", "POST"),
            ("patch", "PATCH"),
            ("dElEtE", "DELETE"),
            ("head", "head"),
            ("connect", "connect"),
            ("POST", "POST"),
            ("purge", "purge"),
            ("PROPFIND", "PROPFIND"),
        ] {
            assert_eq!(normal(sent), read, "{sent}");
        }
    }

    #[test]
    fn a_method_a_route_names_is_spelled_as_it_names_it() {
        let named = [Method::POST, Method::from_bytes(b"PURGE").unwrap()];
        for (sent, read) in [
            ("purge", "PURGE"),
            ("Purge", "PURGE"),
            ("PURGE", "PURGE"),
            ("mkcol", "mkcol"),
            ("GET", "GET"),
        ] {
            let mut request = Request::builder().method(sent).body(()).unwrap();
            normalize_for(&named, &mut request);
            assert_eq!(request.method().as_str(), read, "{sent}");
        }
    }

    #[test]
    fn connect_in_any_case_is_refused() {
        for method in ["CONNECT", "connect", "Connect"] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(refuse_tunnel(&method), Err(MethodError::Tunnel));
        }
        assert_eq!(refuse_tunnel(&Method::POST), Ok(()));
    }
}
