//! Cutting text to a size the wire allows (a shortstr is 255 bytes; an
//! error header should stay small) without splitting a character.

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
    use super::prefix_within;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(prefix_within("héllo", 2), "h");
        assert_eq!(prefix_within("héllo", 3), "hé");
        assert_eq!(prefix_within("short", 255), "short");
    }
}
