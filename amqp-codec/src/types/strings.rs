//! `shortstr` and `longstr`: byte strings, kept as the bytes received.
//!
//! AMQP strings are octet sequences; RabbitMQ does not insist on UTF-8, so
//! neither does the decoder. Short values (most of them: names, keys, ids)
//! live inline; longer ones in a `Bytes`. Decoding never allocates for an
//! inline string and never touches a reference count for one.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::EncodeError;

/// How many bytes a string keeps inline, without a heap allocation or a
/// reference count: enough for a UUID, a RabbitMQ consumer tag and the usual
/// exchange names, routing keys and content types. Copying that many bytes is
/// cheaper than the atomic increment and decrement a shared slice costs.
const INLINE: usize = 38;
const _: () = assert!(
    INLINE >= 32 && INLINE <= 48,
    "StringStorage::window covers INLINE bytes in three 16-byte words"
);

/// `PREFIX_MASKS[n]` keeps the first `n` bytes of an inline window and
/// zeroes the rest: a fixed-size AND instead of a per-byte comparison.
static PREFIX_MASKS: [[u8; INLINE]; INLINE + 1] = {
    let mut masks = [[0; INLINE]; INLINE + 1];
    let mut n = 0;
    while n <= INLINE {
        let mut i = 0;
        while i < n {
            masks[n][i] = 0xFF;
            i += 1;
        }
        n += 1;
    }
    masks
};

/// The storage behind both string types: short strings inline, longer ones
/// as a (possibly shared) `Bytes`.
#[derive(Clone)]
enum StringStorage {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Bytes),
}

impl StringStorage {
    const EMPTY: StringStorage = StringStorage::Inline {
        len: 0,
        buf: [0; INLINE],
    };

    #[inline]
    fn from_slice(s: &[u8]) -> StringStorage {
        if s.len() <= INLINE {
            let mut buf = [0; INLINE];
            buf[..s.len()].copy_from_slice(s);
            StringStorage::Inline {
                len: s.len() as u8,
                buf,
            }
        } else {
            StringStorage::Heap(Bytes::copy_from_slice(s))
        }
    }

    /// The first `len` bytes of `tail` as an inline string, if `len` fits
    /// inline and `tail` has a whole window: the window is copied and the
    /// bytes past `len` masked to zero (fixed-size moves and an AND).
    #[inline(always)]
    fn window(tail: &[u8], len: usize) -> Option<StringStorage> {
        let window = tail.first_chunk::<INLINE>()?;
        let mask = PREFIX_MASKS.get(len)?;
        // In three 16-byte words (the last overlapping the second), not
        // byte by byte: LLVM unrolls a 38-byte loop into 38 scalar ANDs.
        let word = |bytes: &[u8; INLINE], at: usize| -> u128 {
            let mut w = [0; 16];
            w.copy_from_slice(&bytes[at..at + 16]);
            u128::from_ne_bytes(w)
        };
        let mut buf = [0; INLINE];
        for at in [0, 16, INLINE - 16] {
            let masked = word(window, at) & word(mask, at);
            buf[at..at + 16].copy_from_slice(&masked.to_ne_bytes());
        }
        Some(StringStorage::Inline { len: len as u8, buf })
    }

    #[inline]
    fn from_bytes(b: Bytes) -> StringStorage {
        if b.len() <= INLINE {
            StringStorage::from_slice(&b)
        } else {
            StringStorage::Heap(b)
        }
    }

    #[inline]
    fn as_slice(&self) -> &[u8] {
        match self {
            StringStorage::Inline { len, buf } => &buf[..usize::from(*len)],
            StringStorage::Heap(b) => b,
        }
    }

    /// Whether both hold the same bytes. Every inline string has zeros past
    /// its length (`from_slice` starts from zeros, `window` masks), so two
    /// inline ones compare as their whole windows, in three 16-byte words
    /// (as `window` copies them), without a call to memcmp.
    #[inline]
    fn same_bytes(&self, other: &StringStorage) -> bool {
        match (self, other) {
            (StringStorage::Inline { len: a, buf: x }, StringStorage::Inline { len: b, buf: y }) => {
                let word = |bytes: &[u8; INLINE], at: usize| -> u128 {
                    let mut w = [0; 16];
                    w.copy_from_slice(&bytes[at..at + 16]);
                    u128::from_ne_bytes(w)
                };
                a == b && [0, 16, INLINE - 16].into_iter().all(|at| word(x, at) == word(y, at))
            }
            _ => self.as_slice() == other.as_slice(),
        }
    }

    fn to_bytes(&self) -> Bytes {
        match self {
            StringStorage::Inline { .. } => Bytes::copy_from_slice(self.as_slice()),
            StringStorage::Heap(b) => b.clone(),
        }
    }
}

/// Whether `a` and `b` hold the same bytes, compared here in 8-byte words
/// (the last one overlapping the one before) rather than by a call to
/// libc's `memcmp`. The strings compared on a hot path (a publish's
/// routing key and exchange against the last message's) are short, and on
/// an AVX-512 machine glibc's `memcmp` reads a short string with a masked
/// 32-byte load: under `perf` it took 7% of a confirmed publish's CPU,
/// more than encoding the message. Past `LIBC_FROM` bytes (a long string's
/// wide vector loop pays) it is `memcmp` again.
#[inline]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    const LIBC_FROM: usize = 64;
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n > LIBC_FROM {
        a == b
    } else if n >= 8 {
        let word = |s: &[u8], at: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&s[at..at + 8]);
            u64::from_ne_bytes(w)
        };
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        let word = |s: &[u8], at: usize| {
            let mut w = [0; 4];
            w.copy_from_slice(&s[at..at + 4]);
            u32::from_ne_bytes(w)
        };
        word(a, 0) == word(b, 0) && word(a, n - 4) == word(b, n - 4)
    } else {
        // 0 to 3 bytes: the first, middle and last cover them all.
        n == 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1])
    }
}

macro_rules! byte_string {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name(StringStorage);

        impl $name {
            /// An empty string.
            pub const fn new() -> Self {
                $name(StringStorage::EMPTY)
            }

            /// A string from a `'static` literal, without copying.
            pub const fn from_static(s: &'static str) -> Self {
                $name(StringStorage::Heap(Bytes::from_static(s.as_bytes())))
            }


            /// The raw bytes.
            #[inline]
            pub fn as_bytes(&self) -> &[u8] {
                self.0.as_slice()
            }

            /// The bytes as UTF-8, or `None` if they are not valid UTF-8.
            pub fn as_str(&self) -> Option<&str> {
                std::str::from_utf8(self.as_bytes()).ok()
            }

            /// The bytes as text, with invalid UTF-8 replaced.
            pub fn to_string_lossy(&self) -> std::borrow::Cow<'_, str> {
                String::from_utf8_lossy(self.as_bytes())
            }

            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.as_bytes().len()
            }

            /// Whether the string is empty.
            pub fn is_empty(&self) -> bool {
                self.as_bytes().is_empty()
            }

            /// The bytes as `Bytes` (a copy for short strings, a cheap clone
            /// for long ones).
            pub fn to_bytes(&self) -> Bytes {
                self.0.to_bytes()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.0.same_bytes(&other.0)
            }
        }

        impl Eq for $name {}

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.as_bytes().cmp(other.as_bytes())
            }
        }

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.as_bytes().hash(state)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(StringStorage::from_slice(s.as_bytes()))
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(StringStorage::from_bytes(Bytes::from(s)))
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                $name::from(s.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                same_bytes(self.as_bytes(), other.as_bytes())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                same_bytes(self.as_bytes(), other.as_bytes())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.as_str() {
                    Some(s) => fmt::Debug::fmt(s, f),
                    None => write!(f, "b{:?}", Bytes::copy_from_slice(self.as_bytes())),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_string_lossy())
            }
        }
    };
}

byte_string! {
    /// An AMQP `shortstr`: at most 255 bytes on the wire. Longer values can be
    /// built but fail to encode with [`EncodeError::ShortStringTooLong`].
    ShortString
}

byte_string! {
    /// An AMQP `longstr` (field type `S`): up to 4 GiB of bytes.
    LongString
}

impl ShortString {
    /// A string holding a copy of these bytes (no length check).
    #[inline]
    pub(crate) fn from_slice(bytes: &[u8]) -> Self {
        ShortString(StringStorage::from_slice(bytes))
    }

    /// Sets the string to the first `len` bytes of `tail` (no length check).
    /// Bytes of `tail` past `len` are never kept, but when there are enough
    /// of them a fixed-size window is copied and masked, written straight
    /// into place: no `memcpy` call, no temporary.
    #[inline(always)]
    pub(crate) fn set_prefix(&mut self, tail: &[u8], len: usize) {
        match StringStorage::window(tail, len) {
            Some(repr) => self.0 = repr,
            None => self.set_slow(tail.get(..len).unwrap_or(tail)),
        }
    }

    /// The first `len` bytes of `tail` (no length check), copied as a
    /// window when `tail` is long enough.
    #[inline(always)]
    pub(crate) fn from_prefix(tail: &[u8], len: usize) -> Self {
        match StringStorage::window(tail, len) {
            Some(repr) => ShortString(repr),
            None => ShortString::from_slice(tail.get(..len).unwrap_or(tail)),
        }
    }

    #[cold]
    #[inline(never)]
    fn set_slow(&mut self, bytes: &[u8]) {
        self.0 = StringStorage::from_slice(bytes);
    }

    /// A short string from raw bytes, or `None` if they are longer than 255.
    pub fn from_bytes(bytes: Bytes) -> Option<Self> {
        (bytes.len() <= 255).then(|| ShortString(StringStorage::from_bytes(bytes)))
    }

    pub(crate) fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let bytes = self.as_bytes();
        let len = u8::try_from(bytes.len()).map_err(|_| EncodeError::ShortStringTooLong(bytes.len()))?;
        dst.put_u8(len);
        dst.put_slice(bytes);
        Ok(())
    }
}

impl LongString {
    pub(crate) fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        self.encode_after(dst, None)
    }

    /// Appends a field value's type code if there is one, then the string
    /// with its 32-bit length.
    #[inline(always)]
    pub(crate) fn encode_after(&self, dst: &mut BytesMut, code: Option<u8>) -> Result<(), EncodeError> {
        match &self.0 {
            StringStorage::Inline { len, buf } => {
                let [a, b, c, d] = u32::from(*len).to_be_bytes();
                match code {
                    Some(code) => put_window(dst, &[code, a, b, c, d], buf, usize::from(*len)),
                    None => put_window(dst, &[a, b, c, d], buf, usize::from(*len)),
                }
                Ok(())
            }
            StringStorage::Heap(bytes) => {
                if let Some(code) = code {
                    dst.put_u8(code);
                }
                encode_long_bytes(bytes, dst)
            }
        }
    }
}

/// Appends `head`, then the first `len` bytes of an inline string's `buf`,
/// copied as the whole fixed-size buffer and the excess cut off again:
/// cheaper than a call to copy `len` bytes.
#[inline(always)]
fn put_window(dst: &mut BytesMut, head: &[u8], buf: &[u8; INLINE], len: usize) {
    let end = dst.len() + head.len() + len;
    dst.reserve(head.len() + INLINE);
    dst.put_slice(head);
    dst.put_slice(buf);
    dst.truncate(end);
}

impl LongString {
    /// The first `len` bytes of `tail` (no length check): inline if short
    /// (copied as a window when `tail` is long enough), else a zero-copy
    /// slice of `source` when there is one, which `tail` must lie within.
    #[inline(always)]
    pub(crate) fn from_prefix(tail: &[u8], len: usize, source: Option<&Bytes>) -> Self {
        if let Some(repr) = StringStorage::window(tail, len) {
            return LongString(repr);
        }
        let bytes = tail.get(..len).unwrap_or(tail);
        match source {
            Some(source) if bytes.len() > INLINE => LongString(StringStorage::Heap(source.slice_ref(bytes))),
            _ => LongString(StringStorage::from_slice(bytes)),
        }
    }
}

impl From<Bytes> for LongString {
    fn from(bytes: Bytes) -> Self {
        LongString(StringStorage::from_bytes(bytes))
    }
}

impl From<Vec<u8>> for LongString {
    fn from(bytes: Vec<u8>) -> Self {
        LongString(StringStorage::from_bytes(Bytes::from(bytes)))
    }
}

impl From<&[u8]> for LongString {
    fn from(bytes: &[u8]) -> Self {
        LongString(StringStorage::from_slice(bytes))
    }
}

/// Writes a 32-bit length prefix and the bytes.
pub(crate) fn encode_long_bytes(bytes: &[u8], dst: &mut BytesMut) -> Result<(), EncodeError> {
    let len = u32::try_from(bytes.len()).map_err(|_| EncodeError::TooLong(bytes.len()))?;
    dst.put_u32(len);
    dst.put_slice(bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_compare_equal_however_they_were_built() {
        let tail = b"orders.created and the bytes after it in a read buffer";
        let from_window = ShortString::from_prefix(tail, 14);
        let from_slice = ShortString::from("orders.created");
        let from_static = ShortString::from_static("orders.created");
        let mut set = ShortString::from("something else entirely");
        set.set_prefix(tail, 14);
        for s in [&from_window, &from_static, &set] {
            assert_eq!(*s, from_slice);
            assert_eq!(from_slice, *s);
        }
        // A prefix of the same window is another string.
        assert_ne!(ShortString::from_prefix(tail, 13), from_slice);
        assert_ne!(ShortString::from("orders.createe"), from_slice);
        assert_eq!(ShortString::from_prefix(tail, 0), ShortString::new());
        let long = "x".repeat(INLINE + 1);
        assert_eq!(ShortString::from(long.as_str()), ShortString::from(long.clone()));
        assert_ne!(ShortString::from(long.as_str()), ShortString::from(&long[1..]));
    }

    #[test]
    fn same_bytes_finds_every_difference_at_every_length() {
        let base: Vec<u8> = (0..70u8).map(|i| i.wrapping_mul(37)).collect();
        for n in 0..=base.len() {
            let a = &base[..n];
            let copy = a.to_vec();
            assert!(same_bytes(a, &copy), "{n} bytes, equal");
            if n > 0 {
                assert!(!same_bytes(a, &base[..n - 1]), "{n} against {} bytes", n - 1);
            }
            for at in 0..n {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same_bytes(a, &b), "{n} bytes, differing at {at}");
                assert!(!same_bytes(&b, a), "{n} bytes, differing at {at}, swapped");
            }
        }
        let key = ShortString::from("orders");
        assert!(key == "orders");
        assert!(key != "order");
        assert!(key != "orderz");
    }
}
