//! Unit tests of `canonical_json.rs`: RFC 8785 forms, exact I-JSON,
//! pointers, and properties against serde_json.

use super::*;

fn canon(text: &str) -> String {
    String::from_utf8(canonicalize(&serde_json::from_str(text).unwrap())).unwrap()
}

#[test]
fn sorts_members_and_drops_whitespace() {
    assert_eq!(
        canon(r#"{ "b": 1, "a": [ 2 , {"d":0,"c":1} ] }"#),
        r#"{"a":[2,{"c":1,"d":0}],"b":1}"#
    );
}

#[test]
fn numbers_are_written_as_ecmascript_does() {
    // Values from RFC 8785 Appendix B.
    assert_eq!(
        canon("[1.0, 0.000001, 1e21, 1e-7, -0, 333333333.33333329, 1E30, 4.50]"),
        "[1,0.000001,1e+21,1e-7,0,333333333.3333333,1e+30,4.5]"
    );
    assert_eq!(
        canon("[9007199254740992, -1.5e-300]"),
        "[9007199254740992,-1.5e-300]"
    );
}

#[test]
fn strings_use_minimal_escapes() {
    assert_eq!(
        canon(r#""\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/""#),
        "\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\""
    );
}

#[test]
fn members_sort_by_utf16_code_units() {
    // U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16, after it in UTF-8.
    assert_eq!(
        canon("{\"\u{FB33}\":1,\"\u{1F600}\":2}"),
        "{\"\u{1F600}\":2,\"\u{FB33}\":1}"
    );
}

#[test]
fn rfc8785_example_object() {
    let text = r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]}"#;
    assert_eq!(
        canon(text),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

#[test]
fn reserialised_payloads_are_equal() {
    assert_eq!(
        canon(r#"{"a":1.0,"b":"x"}"#),
        canon("{\n  \"b\" : \"x\",\n  \"a\" : 1\n}")
    );
}

#[test]
fn pointers_remove_members_and_elements() {
    let mut v: Value =
        serde_json::from_str(r#"{"a":{"b/c":1,"d":2},"e":[1,2,3],"m~n":0}"#).unwrap();
    remove_pointer(&mut v, "/a/b~1c");
    remove_pointer(&mut v, "/e/1");
    remove_pointer(&mut v, "/m~0n");
    remove_pointer(&mut v, "/missing/x");
    remove_pointer(&mut v, "/e/9");
    // Not indices in RFC 6901's form: they name nothing.
    remove_pointer(&mut v, "/e/01");
    remove_pointer(&mut v, "/e/+1");
    assert_eq!(
        String::from_utf8(canonicalize(&v)).unwrap(),
        r#"{"a":{"d":2},"e":[1,3]}"#
    );
}

#[test]
fn exact_i_json_is_admitted() {
    for text in [
        r#"{"a":[1,1.0,1e0,0.1,-0,9007199254740992,1e21,"\u0041\ud83d\ude00"]}"#,
        " [ true , false , null , \"\" , {} , [] ] ",
        "12345678901234567000",
        "0.000001",
        "5e-324",
        "1.7976931348623157e308",
    ] {
        assert_eq!(check_exact(text.as_bytes()), Ok(()), "{text}");
        assert!(parse_exact(text.as_bytes()).is_ok(), "{text}");
    }
}

#[test]
fn departures_from_exact_i_json_are_named() {
    use NotExact::*;
    for (text, why) in [
        (r#"{"a":1,"a":2}"#, DuplicateName),
        (r#"{"a":1,"\u0061":2}"#, DuplicateName),
        (r#"[{"x":{"b":0,"b":0}}]"#, DuplicateName),
        (r#"["\ud800"]"#, LoneSurrogate),
        (r#"["\udc00\ud800"]"#, LoneSurrogate),
        (r#"{"\ud800x":1}"#, LoneSurrogate),
        (r#"["\ud800\u0041"]"#, LoneSurrogate),
        ("9007199254740993", InexactNumber),
        ("-12345678901234567890", InexactNumber),
        ("0.30000000000000001", InexactNumber),
        ("333333333.33333329", InexactNumber),
        ("1e400", InexactNumber),
        ("1e-400", InexactNumber),
        ("1e99999999999999999999999", InexactNumber),
        ("2.4703282292062328e-324", InexactNumber),
        ("", Syntax),
        ("{", Syntax),
        ("[1,]", Syntax),
        ("01", Syntax),
        ("1.", Syntax),
        ("-", Syntax),
        ("1e", Syntax),
        ("[1] x", Syntax),
        ("\"\u{1}\"", Syntax),
        (r#""\x""#, Syntax),
        (r#""\ud800\u00g0""#, Syntax),
        ("{'a':1}", Syntax),
        ("\u{feff}{}", Syntax),
        ("nul", Syntax),
    ] {
        assert_eq!(check_exact(text.as_bytes()), Err(why), "{text}");
        assert_eq!(parse_exact(text.as_bytes()).err(), Some(why), "{text}");
    }
    assert_eq!(check_exact(b"[\"\xff\"]"), Err(Syntax));
}

#[test]
fn nesting_is_bounded_as_serde_json_bounds_it() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for depth in [MAX_DEPTH, MAX_DEPTH + 1] {
        let text = nested(depth);
        let serde = serde_json::from_str::<Value>(&text).is_ok();
        assert_eq!(check_exact(text.as_bytes()).is_ok(), serde, "{depth}");
    }
    // A hostile body is refused, not a stack overflow.
    assert_eq!(
        check_exact(nested(1_000_000).as_bytes()),
        Err(NotExact::Syntax)
    );
}

#[test]
fn mask_raw_writes_each_named_value_null() {
    let text = br#"{"a": [1, {"n": 9007199254740993}], "t~/x": {"d": [2]}, "z": 3}"#;
    let masked = |pointers: &[&str]| {
        let pointers: Vec<String> = pointers.iter().map(|p| p.to_string()).collect();
        mask_raw(text, &pointers).map(|m| String::from_utf8(m).unwrap())
    };
    assert_eq!(
        masked(&["/a/1/n", "/z"]).as_deref(),
        Some(r#"{"a": [1, {"n": null}], "t~/x": {"d": [2]}, "z": null}"#)
    );
    // Array elements by their index as sent; escaped tokens; a container.
    assert_eq!(
        masked(&["/a/0", "/t~0~1x"]).as_deref(),
        Some(r#"{"a": [null, {"n": 9007199254740993}], "t~/x": null, "z": 3}"#)
    );
    // A value inside another masked one goes with it, listed either way.
    for pointers in [["/a", "/a/1/n"], ["/a/1/n", "/a"]] {
        assert_eq!(
            masked(&pointers).as_deref(),
            Some(r#"{"a": null, "t~/x": {"d": [2]}, "z": 3}"#)
        );
    }
    assert_eq!(masked(&["/x", "/a/2", ""]), None, "nothing named");
    // Still JSON, and exact where only a masked value was not.
    let exact = mask_raw(text, &["/a/1/n".to_string()]).unwrap();
    assert_eq!(check_exact(&exact), Ok(()));
    // A name given twice on the way masks nothing there.
    let twice = br#"{"n":1,"n":2,"m":1e400}"#;
    assert_eq!(mask_raw(twice, &["/n".to_string()]), None);
}

#[test]
fn raw_at_finds_the_value_as_sent() {
    let text = br#" {"a": {"b~/c": [10, 9007199254740993 , {"d":null}]}, "e" : "\u0041"} "#;
    let at = |pointer: &str| raw_at(text, pointer).map(|raw| std::str::from_utf8(raw).unwrap());
    assert_eq!(at("/a/b~0~1c/1"), Some("9007199254740993"));
    assert_eq!(at("/a/b~0~1c/2/d"), Some("null"));
    assert_eq!(at("/e"), Some(r#""\u0041""#));
    assert_eq!(at(""), Some(std::str::from_utf8(text).unwrap().trim()));
    for absent in [
        "/x",
        "/a/b~0~1c/3",
        "/a/b~0~1c/01",
        "/a/b~0~1c/-",
        "/e/0",
        "a",
    ] {
        assert_eq!(at(absent), None, "{absent}");
    }
    // A name used twice on the way is ambiguous; elsewhere it does not matter.
    let twice = br#"{"a":{"b":1},"a":{"b":2},"c":{"d":0,"d":1},"e":3}"#;
    assert_eq!(raw_at(twice, "/a/b"), None);
    assert_eq!(raw_at(twice, "/c/d"), None);
    assert_eq!(raw_at(twice, "/e"), Some(&b"3"[..]));
}

#[test]
fn property_the_scanner_reads_json_as_serde_json_does() {
    // Mutated JSON texts: what serde_json reads is never "not JSON" to the
    // scanner, and what the scanner admits serde_json reads.
    let mut rng = fastrand::Rng::with_seed(7493);
    let noise = [
        b'"', b'\\', b'u', b'd', b'8', b'0', b'{', b'}', b'[', b']', b',', b':', b'-', b'.', b'e',
        b'1', b' ',
    ];
    for _ in 0..4000 {
        let mut text = serde_json::to_vec(&arbitrary(&mut rng, 3)).unwrap();
        for _ in 0..rng.usize(0..3) {
            let at = rng.usize(0..=text.len());
            match rng.u8(0..3) {
                0 if at < text.len() => {
                    text.remove(at);
                }
                1 => text.insert(at, noise[rng.usize(0..noise.len())]),
                _ => text.insert(at, rng.u8(..)),
            }
        }
        let serde = serde_json::from_slice::<Value>(&text).is_ok();
        let shown = String::from_utf8_lossy(&text);
        match check_exact(&text) {
            Ok(()) => assert!(serde, "{shown}"),
            Err(NotExact::Syntax) => assert!(!serde, "{shown}"),
            Err(_) => {}
        }
    }
}

/// A random JSON value, `depth` levels deep at most (seeded: repeatable).
fn arbitrary(rng: &mut fastrand::Rng, depth: u32) -> Value {
    match rng.u8(0..if depth == 0 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.bool()),
        2 => match rng.u8(0..3) {
            0 => Value::from(rng.i64(-1_000_000..1_000_000)),
            1 => Value::from(rng.f64() * 10f64.powi(rng.i32(-30..30))),
            _ => Value::from(rng.u64(..)),
        },
        3 => {
            let len = rng.usize(0..8);
            Value::String((0..len).map(|_| random_char(rng)).collect())
        }
        4 => Value::Array(
            (0..rng.usize(0..5))
                .map(|_| arbitrary(rng, depth - 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.usize(0..5))
                .map(|_| {
                    let len = rng.usize(0..6);
                    let name: String = (0..len).map(|_| random_char(rng)).collect();
                    (name, arbitrary(rng, depth - 1))
                })
                .collect(),
        ),
    }
}

/// ASCII, controls, quotes, BMP and astral characters alike.
fn random_char(rng: &mut fastrand::Rng) -> char {
    match rng.u8(0..4) {
        0 => rng.char('\u{0}'..='\u{7f}'),
        1 => ['"', '\\', '\n', '\u{1f}', '/'][rng.usize(0..5)],
        2 => rng.char('\u{80}'..='\u{ffff}'),
        _ => rng.char('\u{10000}'..='\u{10ffff}'),
    }
}

#[test]
fn property_canonical_form_is_stable_and_faithful() {
    let mut rng = fastrand::Rng::with_seed(8785);
    for _ in 0..2000 {
        let value = arbitrary(&mut rng, 4);
        let canonical = canonicalize(&value);
        // Faithful: it parses back to the same value.
        let back: Value = serde_json::from_slice(&canonical).unwrap();
        assert_eq!(canonicalize(&back), canonical, "{value}");
        // Stable: any other serialisation of the value has the same form.
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        let reparsed: Value = serde_json::from_str(&pretty).unwrap();
        assert_eq!(canonicalize(&reparsed), canonical, "{pretty}");
        // Canonical output is compact, sorted, and valid UTF-8.
        assert!(std::str::from_utf8(&canonical).is_ok());
    }
}
