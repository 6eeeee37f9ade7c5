//! The operator console: one HTML page, its stylesheet and its script,
//! compiled into the binary and served by the admin listener at `/`.
//!
//! Invariants: the assets hold no data, so they need no token; everything
//! the page shows it reads from the token-guarded admin API itself, with
//! the token the operator typed (docs/operating.md, "The operator console"). Every
//! asset is answered with a Content-Security-Policy that lets the page load
//! only these same-origin files and call only this listener (no inline
//! script or style, no other origin, no framing, no form submission), with
//! `nosniff` and `no-store`.

use http::Response;
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderValue, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};

use crate::body::{ProxyBody, full};

/// One file of the console.
pub(crate) struct Asset {
    /// The path segment it is served at (`""` is `/`).
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: [Asset; 3] = [
    Asset {
        name: "",
        content_type: "text/html; charset=utf-8",
        body: include_str!("console/index.html"),
    },
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("console/console.css"),
    },
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("console/console.js"),
    },
];

/// `form-action 'none'`: the page's forms are handled by its script; if it
/// failed, a submitted sign-in form must not carry the token into a URL.
const POLICY: &str = "default-src 'self'; object-src 'none'; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// The asset served at the path segment `name`, if any.
pub(crate) fn asset(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.name == name)
}

/// `asset` with the console's headers.
pub fn response(asset: &Asset) -> Response<ProxyBody> {
    let mut response = Response::new(full(asset.body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_its_script_and_style_from_files_only() {
        let page = asset("").map(|a| a.body).unwrap_or_default();
        assert!(page.contains(r#"<script src="console.js" defer></script>"#));
        assert!(page.contains(r#"<link rel="stylesheet" href="console.css">"#));
        // The policy forbids inline code: the page must not need any.
        assert_eq!(page.matches("<script").count(), 1, "one external script");
        for inline in ["<style", " style=", " onclick=", " onload=", "javascript:"] {
            assert!(!page.contains(inline), "inline code: {inline}");
        }
        assert!(asset("console.js").is_some() && asset("console.css").is_some());
        assert!(asset("index.html").is_none() && asset("..").is_none());
    }

    #[test]
    fn the_script_never_writes_markup() {
        let script = asset("console.js").map(|a| a.body).unwrap_or_default();
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!script.contains(sink), "{sink}");
        }
    }
}
