//! Lower-case hex text of digests and MACs, as the store and the logs keep
//! them. Every request makes a few (its scope's MAC, its fingerprint, its
//! body's digest), so it goes through a fixed buffer: `hex::encode` builds
//! its `String` one `char` at a time, which showed in profiles of the
//! replay path.

/// The most bytes [`of`] encodes through its buffer (a SHA-256 or an
/// HMAC-SHA-256); longer input takes `hex::encode`'s way.
const BUFFERED: usize = 32;

/// `bytes` as lower-case hex, two digits a byte.
pub fn of(bytes: &[u8]) -> String {
    let mut text = [0u8; 2 * BUFFERED];
    let Some(text) = text.get_mut(..2 * bytes.len()) else {
        return hex::encode(bytes);
    };
    // Hex digits are ASCII: the slice is UTF-8.
    match hex::encode_to_slice(bytes, text).map(|()| std::str::from_utf8(text)) {
        Ok(Ok(text)) => text.to_string(),
        _ => hex::encode(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_writes_what_hex_encode_writes_at_every_length() {
        let bytes: Vec<u8> = (0..=255u8).rev().collect();
        for len in [0, 1, 16, 31, 32, 33, 64, 256] {
            assert_eq!(of(&bytes[..len]), hex::encode(&bytes[..len]), "{len} bytes");
        }
        assert_eq!(of(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }
}
