//! RFC 8785 JSON Canonicalization Scheme (JCS), so a client that re-serialises
//! the same payload (other key order, whitespace, `1.0` for `1`) still sends
//! the same operation.
//!
//! Invariant: two JSON texts that parse to the same I-JSON value canonicalise to
//! the same bytes. Object members are sorted by their UTF-16 code units, numbers
//! are written as ECMAScript's `Number.prototype.toString` writes the double, and
//! strings use the minimal escaping of RFC 8785 §3.2.2.2 (which is serde_json's).

use serde_json::Value;

/// The canonical bytes of `value`.
pub fn canonicalize(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            // I-JSON numbers are doubles; a value serde_json cannot make a
            // double of does not exist in JSON text, so 0 is never reached.
            let double = n.as_f64().unwrap_or(0.0);
            let mut buffer = ryu_js::Buffer::new();
            out.extend_from_slice(buffer.format(double).as_bytes());
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push(b'{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_value(member, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes exactly `"`, `\` and C0 controls, with the short forms
    // \b \f \n \r \t and lower-case \u00xx otherwise: RFC 8785's rules.
    serde_json::to_writer(&mut *out, s).unwrap_or_default();
}

/// Removes the member or element `pointer` (RFC 6901) names, if it exists.
pub fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let token = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(members)) => {
            members.remove(&token);
        }
        Some(Value::Array(items)) => {
            if let Ok(index) = token.parse::<usize>()
                && index < items.len()
            {
                items.remove(index);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            String::from_utf8(canonicalize(&v)).unwrap(),
            r#"{"a":{"d":2},"e":[1,3]}"#
        );
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
}
