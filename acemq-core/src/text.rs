//! Text from the wire and to it: bytes made a `String` (AMQP strings need
//! not be UTF-8), and text cut to a size the wire allows (a shortstr is 255
//! bytes; an error header should stay small) without splitting a character.

/// `bytes` as an owned `String`, invalid UTF-8 replaced by U+FFFD. Valid
/// text (nearly always) is checked and copied in one go, without the
/// chunk by chunk walk of `String::from_utf8_lossy` nor the formatting
/// machinery `to_string` goes through.
pub(crate) fn owned_lossy(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
pub(crate) fn prefix_within(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::{owned_lossy, prefix_within};

    #[test]
    fn bytes_become_text_with_invalid_sequences_replaced() {
        assert_eq!(owned_lossy(b"orders.created"), "orders.created");
        assert_eq!(owned_lossy("héllo".as_bytes()), "héllo");
        assert_eq!(owned_lossy(b"bad \xff byte"), "bad \u{FFFD} byte");
        assert_eq!(owned_lossy(b""), "");
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(prefix_within("héllo", 2), "h");
        assert_eq!(prefix_within("héllo", 3), "hé");
        assert_eq!(prefix_within("short", 255), "short");
    }
}
