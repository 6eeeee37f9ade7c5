//! The `route` phase: which `[[routes]]` entry a request belongs to — the
//! longest `path_prefix` that matches on a segment boundary.
//!
//! Invariant: a request's route is the one the upstream's own reading of its
//! path would give. The normal form (`path`) settles every spelling it can;
//! for the ones it cannot (`;` parameters, `%2F`, `%3B`: see
//! [`path::readings`]) [`select_unambiguous`] refuses a path whose readings
//! fall on different routes, instead of guessing which upstream it is.

use crate::config::Route;
use crate::pipeline::path::{self, PathError};

/// Like [`select`] for a path in normal form, but an error if another
/// upstream's reading of `path` ([`path::readings`]) selects another entry:
/// the write would then run under rules it does not get here.
pub fn select_unambiguous<'a, R>(
    routes: &'a [R],
    path: &str,
    route_of: impl Fn(&R) -> &Route,
) -> Result<Option<&'a R>, PathError> {
    let chosen = select(routes, path, &route_of);
    for reading in path::readings(path) {
        let other = select(routes, &reading, &route_of);
        let same = match (chosen, other) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        if !same {
            return Err(PathError::AnotherRouteWhenRead { reading });
        }
    }
    Ok(chosen)
}

/// The entry of `routes` whose route (`route_of`) serves `path`, if any.
pub fn select<'a, R>(
    routes: &'a [R],
    path: &str,
    route_of: impl Fn(&R) -> &Route,
) -> Option<&'a R> {
    routes
        .iter()
        .filter(|r| prefix_matches(&route_of(r).path_prefix, path))
        .max_by_key(|r| route_of(r).path_prefix.len())
}

/// `/api` matches `/api` and `/api/x`, not `/apix`; `/` matches every path.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let text = "[[routes]]\nname = \"all\"\nupstream = \"http://a\"\n\
                    [[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"http://b\"\n";
        let config = Config::from_toml_str(text, "t").unwrap();
        let name = |path| select(&config.routes, path, |r| r).map(|r| r.name.as_str());
        assert_eq!(name("/orders/1"), Some("orders"));
        assert_eq!(name("/orders"), Some("orders"));
        assert_eq!(name("/ordersx"), Some("all"));
        assert_eq!(name("/"), Some("all"));
        let only = "[[routes]]\nname = \"o\"\npath_prefix = \"/api\"\nupstream = \"http://b\"\n";
        let config = Config::from_toml_str(only, "t").unwrap();
        assert!(select(&config.routes, "/other", |r| r).is_none());
    }

    #[test]
    fn a_path_whose_readings_change_its_route_is_refused() {
        let text = "[[routes]]\nname = \"all\"\nupstream = \"http://a\"\n\
                    [[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://b\"\n";
        let config = Config::from_toml_str(text, "t").unwrap();
        let name = |path| {
            select_unambiguous(&config.routes, path, |r| r).map(|r| r.map(|r| r.name.as_str()))
        };
        assert_eq!(name("/api/tasks;v=1"), Ok(Some("api")));
        assert_eq!(name("/api/a%2Fb"), Ok(Some("api")));
        assert_eq!(name("/x;y/z"), Ok(Some("all")));
        assert_eq!(
            name("/api;x/tasks"),
            Err(PathError::AnotherRouteWhenRead {
                reading: "/api/tasks".into()
            })
        );
        assert!(name("/x%2F..%2Fapi/tasks").is_err());
        assert!(name("/api/..;/x").is_err());
        let only = "[[routes]]\nname = \"o\"\npath_prefix = \"/api\"\nupstream = \"http://b\"\n";
        let config = Config::from_toml_str(only, "t").unwrap();
        // No route either way is no ambiguity: 404 as before.
        assert_eq!(
            select_unambiguous(&config.routes, "/x;y", |r| r).map(|r| r.is_some()),
            Ok(false)
        );
        // A route one way and none the other is.
        assert!(select_unambiguous(&config.routes, "/api;x", |r| r).is_err());
    }
}
