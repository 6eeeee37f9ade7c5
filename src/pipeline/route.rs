//! The `route` phase: which `[[routes]]` entry a request belongs to — the
//! longest `path_prefix` that matches on a segment boundary.

use crate::config::Route;

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
}
