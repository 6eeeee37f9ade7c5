//! The `route` phase: which `[[routes]]` entry a request belongs to — the
//! longest `path_prefix` that matches on a segment boundary.
//!
//! Invariant: a request's route is the one the upstream's own reading of its
//! path would give. The normal form (`request_path`) settles every spelling it can;
//! for the ones it cannot, [`select_unambiguous`] refuses a path that another
//! reading puts on another route, instead of guessing which upstream it is:
//! `;` parameters, encoded delimiters (see [`request_path::readings`]), and the
//! [`Spellings`] a route's prefix may be matched in — letters in another
//! case (Express by default, ASP.NET Core and IIS route without regard to
//! it) and a trailing `/` (Express's default routing, and others', takes
//! `/o/prot` for `/o/prot/`).

use crate::config::Route;
use crate::request_path::{self, PathError};

/// Whether a table's prefixes may be matched by a path spelled otherwise
/// than they are — in another case, or without the `/` one ends in —
/// known once, when the table is made: a table where neither can happen
/// (no prefix holds a letter or ends a segment in `/`) costs its requests
/// nothing, and where every prefix is lower-case, a path with no
/// upper-case letter is not compared in another case.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spellings {
    /// Some prefix holds a letter: a path may match it in another case.
    case: bool,
    /// Every prefix is lower-case: only a path with an upper-case letter
    /// matches one in another case.
    lower: bool,
    /// Some prefix but `/` ends in `/`: the path without it may match it.
    slash: bool,
}

impl Spellings {
    /// The spellings the `prefixes` (in normal form) may be matched in.
    pub fn of<'a>(prefixes: impl IntoIterator<Item = &'a str>) -> Self {
        let mut spellings = Spellings {
            lower: true,
            ..Spellings::default()
        };
        for prefix in prefixes {
            spellings.case |= prefix.bytes().any(|b| b.is_ascii_alphabetic());
            spellings.lower &= !prefix.bytes().any(|b| b.is_ascii_uppercase());
            spellings.slash |= prefix.len() > 1 && prefix.ends_with('/');
        }
        spellings
    }

    /// Whether `path` may match a prefix spelled otherwise than it is.
    fn may_match_otherwise(self, path: &str) -> bool {
        let cased = self.case && (!self.lower || path.bytes().any(|b| b.is_ascii_uppercase()));
        cased || (self.slash && !path.ends_with('/'))
    }

    /// `path` spelled as the longest prefix that it matches otherwise, of
    /// an entry of `routes` other than `chosen` (the one its prefix matches
    /// as spelled) and at least as long: an upstream reading it so would
    /// take it for that entry's. `None` when no such prefix matches it.
    fn another<R>(
        self,
        routes: &[R],
        path: &str,
        chosen: Option<&R>,
        route_of: impl Fn(&R) -> &Route,
    ) -> Option<String> {
        if !self.may_match_otherwise(path) {
            return None;
        }
        let floor = chosen.map_or(0, |r| route_of(r).path_prefix.len());
        routes
            .iter()
            .filter(|r| !chosen.is_some_and(|chosen| std::ptr::eq(chosen, *r)))
            .map(|r| route_of(r).path_prefix.as_str())
            .filter(|prefix| prefix.len() >= floor)
            .filter_map(|prefix| Some((prefix.len(), respelled(prefix, path, self.case)?)))
            .max_by_key(|(len, _)| *len)
            .map(|(_, respelled)| respelled)
    }
}

/// `path` spelled to match `prefix` on a segment boundary, if it does
/// with its letters in either case (when `case`) or a `/` added at its
/// end that `prefix` ends with.
fn respelled(prefix: &str, path: &str, case: bool) -> Option<String> {
    let same = |a: &str, b: &str| {
        if case {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    if prefix
        .strip_suffix('/')
        .is_some_and(|bare| !bare.is_empty() && same(bare, path))
    {
        return Some(prefix.to_string());
    }
    let (head, rest) = (path.get(..prefix.len())?, &path[prefix.len()..]);
    let on_boundary = prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/');
    (on_boundary && same(head, prefix)).then(|| format!("{prefix}{rest}"))
}

/// Like [`select`] for a path in normal form, but an error if another
/// upstream's reading of `path` — [`request_path::readings`], or a prefix matched
/// in other [`Spellings`] — selects another entry: the write would then run
/// under rules it does not get here.
pub fn select_unambiguous<'a, R>(
    routes: &'a [R],
    spellings: Spellings,
    path: &str,
    route_of: impl Fn(&R) -> &Route,
) -> Result<Option<&'a R>, PathError> {
    let chosen = select(routes, path, &route_of);
    let refused = |reading| Err(PathError::AnotherRouteWhenRead { reading });
    if let Some(reading) = spellings.another(routes, path, chosen, &route_of) {
        return refused(reading);
    }
    for reading in request_path::readings(path) {
        let other = select(routes, &reading, &route_of);
        let same = match (chosen, other) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        if !same {
            return refused(reading);
        }
        if let Some(respelled) = spellings.another(routes, &reading, chosen, &route_of) {
            return refused(respelled);
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
        let spellings = spellings_of(&config);
        let name = |path| {
            select_unambiguous(&config.routes, spellings, path, |r| r)
                .map(|r| r.map(|r| r.name.as_str()))
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
        let only = |path| select_unambiguous(&config.routes, spellings_of(&config), path, |r| r);
        // No route either way is no ambiguity: 404 as before.
        assert_eq!(only("/x;y").map(|r| r.is_some()), Ok(false));
        // A route one way and none the other is.
        assert!(only("/api;x").is_err());
        assert!(only("/API").is_err());
    }

    fn spellings_of(config: &Config) -> Spellings {
        Spellings::of(config.routes.iter().map(|r| r.path_prefix.as_str()))
    }

    /// Routes at `prefixes`, each named for its prefix, and the name of
    /// the one `path` selects, or the reading that refuses it.
    fn chosen(prefixes: &[&str], path: &str) -> Result<Option<String>, String> {
        let text: String = prefixes
            .iter()
            .enumerate()
            .map(|(n, prefix)| {
                format!("[[routes]]\nname = \"r{n}\"\npath_prefix = \"{prefix}\"\nupstream = \"http://a\"\n")
            })
            .collect();
        let config = Config::from_toml_str(&text, "t").unwrap();
        let chosen = select_unambiguous(&config.routes, spellings_of(&config), path, |r| r);
        match chosen {
            Ok(route) => Ok(route.map(|r| r.path_prefix.clone())),
            Err(PathError::AnotherRouteWhenRead { reading }) => Err(reading),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn a_path_another_case_puts_on_another_route_is_refused() {
        let routes = ["/", "/api"];
        let at = |prefix: &str| Ok(Some(prefix.to_string()));
        assert_eq!(chosen(&routes, "/api/tasks"), at("/api"));
        assert_eq!(chosen(&routes, "/api/Tasks"), at("/api"));
        assert_eq!(chosen(&routes, "/APIs/x"), at("/"));
        assert_eq!(chosen(&routes, "/API/tasks"), Err("/api/tasks".into()));
        assert_eq!(chosen(&routes, "/aPi"), Err("/api".into()));
        assert_eq!(chosen(&routes, "/Api;v=1/x"), Err("/api/x".into()));
        // An upper-case prefix (two that only case tells apart are
        // refused when the config is read).
        assert_eq!(chosen(&["/", "/V1"], "/v1/x"), Err("/V1/x".into()));
        assert_eq!(chosen(&["/", "/V1"], "/V1/x"), at("/V1"));
        // A longer route's prefix in another case is no other route's.
        assert_eq!(chosen(&["/api", "/api/v1"], "/api/V1x"), at("/api"));
        assert_eq!(
            chosen(&["/api", "/api/v1"], "/API/v1/x"),
            Err("/api/v1/x".into())
        );
    }

    #[test]
    fn a_path_a_trailing_slash_puts_on_another_route_is_refused() {
        let routes = ["/o/", "/o/prot/"];
        let at = |prefix: &str| Ok(Some(prefix.to_string()));
        assert_eq!(chosen(&routes, "/o/prot/"), at("/o/prot/"));
        assert_eq!(chosen(&routes, "/o/prot/x"), at("/o/prot/"));
        assert_eq!(chosen(&routes, "/o/protx"), at("/o/"));
        assert_eq!(chosen(&routes, "/o/prot"), Err("/o/prot/".into()));
        assert_eq!(chosen(&routes, "/O/Prot"), Err("/o/prot/".into()));
        assert_eq!(chosen(&routes, "/o/prot;x"), Err("/o/prot/".into()));
        // Without a route beside it, or with `/` the only prefix ending so.
        assert_eq!(chosen(&["/o/prot/"], "/o"), Ok(None));
        assert_eq!(chosen(&["/"], "/anything"), at("/"));
        assert_eq!(chosen(&["/", "/a"], "/a/"), at("/a"));
        // (`/a` beside `/a/` is refused when the config is read.)
    }

    #[test]
    fn spellings_are_known_from_the_prefixes() {
        let of = |prefixes: &[&str]| Spellings::of(prefixes.iter().copied());
        let none = of(&["/", "/1/", "/-"]);
        assert!(!none.case && !none.may_match_otherwise("/API/x/"));
        assert!(none.slash && none.may_match_otherwise("/1"));
        let lower = of(&["/", "/api"]);
        assert!(!lower.may_match_otherwise("/api/x-1/"));
        assert!(lower.may_match_otherwise("/api/X"));
        assert!(of(&["/Api"]).may_match_otherwise("/api/x"));
    }
}
