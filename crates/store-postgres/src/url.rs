//! The one reading of a `postgres://` store URL: `check-config` validates
//! a URL with [`postgres_options`] and `serve` and `migrate` connect with
//! what it returns, so a URL one accepts the other can open.
//!
//! A URL names one server or, as libpq reads it, several in its authority
//! (`postgres://user@h1:5432,h2:5433/db`, a missing port being 5432).
//! Everything else in it (user, password, database, `sslmode`,
//! `options[…]`, …) is read by the driver (sqlx) and holds for every
//! server alike. The store writes only to a primary, whatever the URL
//! says (`primary`), so `target_session_attrs` may be
//! left out or be `read-write` or `primary`, all three meaning that; a URL
//! asking for any other kind of server is refused, and so is one whose
//! `host`, `hostaddr` or `port` parameter would name other servers than
//! its authority.
//!
//! TLS is the driver's too (rustls, trusting the public webpki roots plus
//! `sslrootcert`), as libpq reads its settings except where the driver
//! cannot follow: `sslmode=allow` (the driver never tries TLS after a
//! clear attempt), `sslpassword` (it reads no encrypted key) and
//! `sslrootcert=system` (it has the webpki roots, not the system's store)
//! are refused, so that no URL passes `check-config` and then fails at
//! `serve`; and `sslmode=require` with a root certificate is read as
//! `verify-ca`, as libpq reads it (the driver alone would not verify).

use percent_encoding::percent_decode_str;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The servers a store URL names, in its order (at least one), each with
/// the URL's other options.
#[derive(Debug, Clone)]
pub struct PostgresServers(Vec<PgConnectOptions>);

impl PostgresServers {
    pub fn servers(&self) -> &[PgConnectOptions] {
        &self.0
    }

    /// Each server's options as `change` makes them.
    pub fn map(self, change: impl Fn(PgConnectOptions) -> PgConnectOptions) -> Self {
        PostgresServers(self.0.into_iter().map(change).collect())
    }
}

/// The servers `url` names, or why the store cannot open it.
pub fn postgres_options(url: &str) -> Result<PostgresServers, String> {
    read(url).map_err(|reason| format!("not a PostgreSQL URL the store can open: {reason}"))
}

fn read(url: &str) -> Result<PostgresServers, String> {
    let (scheme, rest) = ["postgres://", "postgresql://"]
        .into_iter()
        .find_map(|scheme| Some((scheme, url.strip_prefix(scheme)?)))
        .ok_or("expected postgres://…")?;
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    // The user part ends at the authority's last `@` (a password's own is
    // percent-encoded).
    let (user, hosts) = authority.split_at(authority.rfind('@').map_or(0, |at| at + 1));
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.len() > 1 && hosts.contains(&"") {
        return Err("an empty host in the URL's list of hosts".into());
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut kept = Vec::new();
    // libpq's environment variable, which the driver reads too, unless
    // the URL names one.
    let mut root_cert = std::env::var("PGSSLROOTCERT").ok();
    let (mut client_cert, mut client_key) = (false, false);
    let mut files = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value);
        let key = decode(key);
        if matches!(
            key.as_str(),
            "sslrootcert"
                | "ssl-root-cert"
                | "ssl-ca"
                | "sslcert"
                | "ssl-cert"
                | "sslkey"
                | "ssl-key"
        ) && value != "system"
        {
            files.push((key.clone(), value.clone()));
        }
        client_cert |= matches!(key.as_str(), "sslcert" | "ssl-cert");
        client_key |= matches!(key.as_str(), "sslkey" | "ssl-key");
        match key.as_str() {
            "target_session_attrs" => session_attrs(&value)?,
            "sslpassword" => {
                return Err(
                    "sslpassword: encrypted client keys are not supported; give \
                     `sslkey` an unencrypted PEM key (PKCS#8, PKCS#1 or SEC1) that only \
                     idemgate's user can read"
                        .into(),
                );
            }
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                root_cert = Some(value);
                kept.push(pair);
            }
            key @ ("host" | "hostaddr" | "port") if hosts.len() > 1 || value.contains(',') => {
                return Err(format!(
                    "`{key}=` would name other servers than the URL's hosts; \
                     list them in the URL: postgres://user@host1:5432,host2:5432/db"
                ));
            }
            _ => kept.push(pair),
        }
    }
    for (key, file) in &files {
        readable(key, file)?;
    }
    if client_cert != client_key {
        return Err(
            "a client certificate takes both `sslcert` and `sslkey`: the driver uses \
             neither alone"
                .into(),
        );
    }
    let query = match kept.is_empty() {
        true => String::new(),
        false => format!("?{}", kept.join("&")),
    };
    let several = hosts.len() > 1;
    let servers = hosts
        .into_iter()
        .map(|host| {
            format!("{scheme}{user}{host}{path}{query}")
                .parse::<PgConnectOptions>()
                .map_err(|e| match several {
                    true => format!("host `{host}`: {e}"),
                    false => e.to_string(),
                })
                .and_then(|server| tls(server, root_cert.as_deref()))
        })
        .collect::<Result<_, _>>()?;
    Ok(PostgresServers(servers))
}

/// `server` with its TLS as libpq would make it (`root_cert`: the
/// `sslrootcert` it trusts besides the webpki roots), or why the driver
/// cannot make it so.
fn tls(server: PgConnectOptions, root_cert: Option<&str>) -> Result<PgConnectOptions, String> {
    if root_cert == Some("system") {
        return Err(
            "sslrootcert=system: idemgate trusts the public (webpki) roots built \
             into it, not the system's store; leave sslrootcert out to use them, or name \
             a PEM file of the CA that signed the server's certificate"
                .into(),
        );
    }
    match (server.get_ssl_mode(), root_cert) {
        (PgSslMode::Allow, _) => Err("sslmode=allow: the driver never retries over TLS, \
             so this connects in clear or not at all; use disable for clear, or \
             verify-full (or require) for TLS"
            .into()),
        // libpq: "if a root CA file exists, the behavior of sslmode=require
        // will be the same as that of verify-ca"; the driver would accept
        // any certificate.
        (PgSslMode::Require, Some(_)) => Ok(server.ssl_mode(PgSslMode::VerifyCa)),
        _ => Ok(server),
    }
}

/// Whether the file `value` that the URL's `key` names can be read, as
/// the driver will read it only when it connects (its error then names
/// no file).
fn readable(key: &str, value: &str) -> Result<(), String> {
    std::fs::File::open(value)
        .map(drop)
        .map_err(|e| format!("{key}={value}: the file cannot be read: {e}"))
}

/// `text` percent-decoded as the driver reads a query (`+` is a space,
/// bytes that are not UTF-8 replaced).
fn decode(text: &str) -> String {
    percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Whether `target_session_attrs=value` asks for a server the store can
/// write to.
fn session_attrs(value: &str) -> Result<(), String> {
    match value {
        "read-write" | "primary" => Ok(()),
        other => Err(format!(
            "target_session_attrs={other}: the store writes, so it connects only to a \
             primary; use read-write or primary, or leave it out"
        )),
    }
}

/// The query parameters that carry a secret (libpq's, which sqlx reads).
const SECRET_PARAMETERS: [&str; 2] = ["password", "sslpassword"];

/// `url` with its passwords replaced by `***`, for messages and logs: the
/// one in its userinfo and those given as query parameters
/// (`?password=`, `?sslpassword=`).
pub fn redact_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut redacted = redact_userinfo(base);
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                // The name as the driver reads it: `pass%77ord` is a password.
                Some((name, _))
                    if SECRET_PARAMETERS
                        .iter()
                        .any(|s| decode(name).eq_ignore_ascii_case(s)) =>
                {
                    format!("{name}=***")
                }
                _ => pair.to_string(),
            })
            .collect();
        redacted.push('?');
        redacted.push_str(&pairs.join("&"));
    }
    redacted
}

/// `url` (without its query) with the password of its userinfo, if any,
/// replaced by `***`.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(url: &str) -> Vec<(String, u16)> {
        postgres_options(url)
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .servers()
            .iter()
            .map(|server| (server.get_host().to_string(), server.get_port()))
            .collect()
    }

    #[test]
    fn several_hosts_are_read_as_libpq_reads_them() {
        let url = "postgres://gw:s%40cret@h1:5433,h2,h3:6000/orders?target_session_attrs=read-write&sslmode=disable";
        assert_eq!(
            hosts(url),
            [
                ("h1".into(), 5433),
                ("h2".into(), 5432),
                ("h3".into(), 6000)
            ]
        );
        for server in postgres_options(url).unwrap().servers() {
            assert_eq!(server.get_username(), "gw");
            assert_eq!(server.get_database(), Some("orders"));
            assert!(matches!(
                server.get_ssl_mode(),
                sqlx::postgres::PgSslMode::Disable
            ));
        }
        assert_eq!(hosts("postgresql://db/x"), [("db".into(), 5432)]);
        assert_eq!(
            hosts("postgres://db:5/x?target_session_attrs=primary"),
            [("db".into(), 5)]
        );
    }

    #[test]
    fn urls_naming_servers_the_store_cannot_write_to_are_refused() {
        for (url, reason) in [
            (
                "postgres://h1,h2/db?target_session_attrs=read-only",
                "target_session_attrs=read-only",
            ),
            ("postgres://db/x?target_session_attrs=any", "primary"),
            ("postgres://h1,,h2/db", "an empty host"),
            ("postgres://h1,h2/db?port=5433", "`port=`"),
            ("postgres://db/x?host=h1,h2", "`host=`"),
            ("postgres://h1:5432,h2:nope/db", "host `h2:nope`"),
            ("postgres://db:nope/x", "invalid port"),
            (
                "postgres://gw:s3cret@h1,h2/db?target_session_attrs=standby",
                "standby",
            ),
            ("mysql://db/x", "expected postgres"),
        ] {
            let error = postgres_options(url).expect_err(url);
            assert!(
                !error.contains("s3cret"),
                "a password is never echoed: {error}"
            );
            assert!(
                error.starts_with("not a PostgreSQL URL the store can open: ")
                    && error.contains(reason),
                "{url}: {error}"
            );
        }
    }

    fn ssl_mode(url: &str) -> PgSslMode {
        let servers = postgres_options(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        servers.servers()[0].get_ssl_mode()
    }

    #[test]
    fn tls_modes_are_read_as_libpq_reads_them() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        let ca = ca.path().display().to_string();
        for (query, mode) in [
            ("sslmode=disable", PgSslMode::Disable),
            ("sslmode=prefer", PgSslMode::Prefer),
            ("sslmode=require", PgSslMode::Require),
            ("sslmode=verify-ca", PgSslMode::VerifyCa),
            ("sslmode=verify-full", PgSslMode::VerifyFull),
            // A root certificate makes `require` verify the CA, as in libpq.
            ("sslmode=require&sslrootcert=CA", PgSslMode::VerifyCa),
            ("sslrootcert=CA&sslmode=require", PgSslMode::VerifyCa),
            ("sslmode=verify-full&sslrootcert=CA", PgSslMode::VerifyFull),
        ] {
            let url = format!("postgres://gw@db/x?{}", query.replace("CA", &ca));
            assert_eq!(
                format!("{:?}", ssl_mode(&url)),
                format!("{mode:?}"),
                "{url}"
            );
        }
    }

    /// The files a URL names are read when `check-config` reads it, not
    /// first when the driver connects (whose error names no file); a
    /// client certificate takes its key.
    #[test]
    fn tls_files_are_read_with_the_url() {
        let cert = tempfile::NamedTempFile::new().unwrap();
        let cert = cert.path().display().to_string();
        for (query, reason) in [
            (
                "sslrootcert=/nonexistent/ca.pem",
                "sslrootcert=/nonexistent/ca.pem",
            ),
            (
                "sslcert=CERT&sslkey=/nonexistent/k.pem",
                "sslkey=/nonexistent/k.pem",
            ),
            ("sslcert=CERT", "takes both"),
            ("sslkey=CERT", "takes both"),
        ] {
            let url = format!(
                "postgres://gw@db/x?sslmode=verify-full&{}",
                query.replace("CERT", &cert)
            );
            let error = postgres_options(&url).expect_err(&url);
            assert!(error.contains(reason), "{url}: {error}");
        }
        let both = format!("postgres://gw@db/x?sslmode=verify-full&sslcert={cert}&sslkey={cert}");
        assert!(postgres_options(&both).is_ok());
    }

    /// A secret parameter is one by the name the driver reads.
    #[test]
    fn a_password_under_an_encoded_name_is_redacted() {
        let url = "postgres://gw@db/x?sslmode=require&pass%77ord=S3cret&PASSWORD=T0p";
        let redacted = redact_url(url);
        assert!(
            !redacted.contains("S3cret") && !redacted.contains("T0p"),
            "{redacted}"
        );
    }

    #[test]
    fn tls_settings_the_driver_cannot_follow_are_refused() {
        for (url, reason) in [
            ("postgres://gw@db/x?sslmode=allow", "sslmode=allow"),
            ("postgres://gw@h1,h2/x?sslmode=ALLOW", "sslmode=allow"),
            (
                "postgres://gw@db/x?sslmode=verify-full&sslkey=k.pem&sslpassword=s3cret",
                "encrypted client keys",
            ),
            (
                "postgres://gw@db/x?sslmode=verify-full&sslrootcert=system",
                "sslrootcert=system",
            ),
        ] {
            let error = postgres_options(url).expect_err(url);
            assert!(
                !error.contains("s3cret"),
                "a password is never echoed: {error}"
            );
            assert!(
                error.starts_with("not a PostgreSQL URL the store can open: ")
                    && error.contains(reason),
                "{url}: {error}"
            );
        }
    }
}
