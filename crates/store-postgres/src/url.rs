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

use percent_encoding::percent_decode_str;
use sqlx::postgres::PgConnectOptions;

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
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value);
        match decode(key).as_str() {
            "target_session_attrs" => session_attrs(&value)?,
            key @ ("host" | "hostaddr" | "port") if hosts.len() > 1 || value.contains(',') => {
                return Err(format!(
                    "`{key}=` would name other servers than the URL's hosts; \
                     list them in the URL: postgres://user@host1:5432,host2:5432/db"
                ));
            }
            _ => kept.push(pair),
        }
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
        })
        .collect::<Result<_, _>>()?;
    Ok(PostgresServers(servers))
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
                Some((name, _))
                    if SECRET_PARAMETERS
                        .iter()
                        .any(|s| name.eq_ignore_ascii_case(s)) =>
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
}
