//! Crate-internal: the field-by-field reader of method arguments and
//! properties that the method table and the properties are built on, with
//! its writer twin, and the context every payload parser is given.
//!
//! This sits above `types` (it reads and writes their strings and tables)
//! and above `wire` (the nom plumbing); neither may import it, and a type
//! that needs to parse takes what it needs from `wire`. Readers run nom's
//! *complete* parsers on a payload that the frame decoder has already delimited,
//! so running out of input is `Truncated`, never a request for more bytes.
//! They allocate nothing for anything inline, because they run for every
//! frame.

use bytes::Bytes;
use nom::number::complete::be_u8;

use crate::error::DecodeErrorKind;
use crate::types::{self, FieldTable, LongString, ShortString};
use crate::wire::PResult;

// The nom plumbing lives in `wire`; `frame/` and `properties.rs` still name
// it through here.
pub(crate) use crate::wire::{kind_of, num, PError};

/// What every parser of a payload needs besides the bytes: the nesting limit,
/// and whether the bytes were validated already.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub(crate) max_depth: usize,
    /// The bytes passed this crate's validation before (a property list
    /// decoded on first access): tables are not checked again.
    pub(crate) validated: bool,
}

/// Reads the arguments of a method field by field, packing consecutive
/// `bit` fields into octets as section 4.2.5.2 of the AMQP 0-9-1 specification requires.
pub(crate) struct ArgReader<'a> {
    ctx: Ctx,
    /// The buffer the input lies in, when there is one to share: tables are
    /// then zero-copy slices of it, else copies.
    source: Option<&'a Bytes>,
    /// The unread payload, followed by whatever bytes come after the payload
    /// in the same buffer (the slack). Reads never go past the payload; a
    /// short string may copy a whole window that runs into the slack.
    input: &'a [u8],
    /// How many bytes of `input` are payload (never more than its length).
    left: usize,
    /// The octet bits are being taken from, and the next bit's index (8 = none left).
    bits: u8,
    bit_index: u8,
}

type ReadResult<T> = Result<T, DecodeErrorKind>;

impl<'a> ArgReader<'a> {
    /// A reader of the first `len` bytes of `input` (fewer if `input` is
    /// shorter); the bytes after them are slack. With a `source`, `input`
    /// must lie within it, and tables are zero-copy slices of it.
    #[inline]
    pub(crate) fn new(ctx: Ctx, source: Option<&'a Bytes>, input: &'a [u8], len: usize) -> Self {
        ArgReader {
            ctx,
            source,
            input,
            left: len.min(input.len()),
            bits: 0,
            bit_index: 8,
        }
    }

    /// The unread payload.
    #[inline(always)]
    fn rest(&self) -> &'a [u8] {
        self.input.get(..self.left).unwrap_or_default()
    }

    /// Moves past `n` bytes of payload (at most what is left).
    #[inline(always)]
    fn skip(&mut self, n: usize) {
        let n = n.min(self.left);
        self.input = self.input.get(n..).unwrap_or_default();
        self.left -= n;
    }

    /// The unread payload (never the slack), for a nom parser; pass it and
    /// the parser's result to [`ArgReader::consumed`]. The parser is called
    /// directly rather than passed in: a function item passed as a value
    /// goes through a `FnMut` shim that the compiler does not always inline.
    #[inline(always)]
    fn unread(&mut self) -> &'a [u8] {
        self.bit_index = 8;
        self.rest()
    }

    /// Moves past what a nom parser consumed of `unread` and returns its
    /// value, or turns its error into a domain kind.
    #[inline(always)]
    fn consumed<T>(&mut self, unread: &'a [u8], result: PResult<'a, T>) -> ReadResult<T> {
        match result {
            Ok((after, value)) => {
                self.skip(unread.len() - after.len());
                Ok(value)
            }
            Err(err) => Err(kind_of(err)),
        }
    }

    /// `octet`
    #[inline(always)]
    pub(crate) fn octet(&mut self) -> ReadResult<u8> {
        let i = self.unread();
        self.consumed(i, be_u8(i))
    }

    /// `short`
    #[inline(always)]
    pub(crate) fn short(&mut self) -> ReadResult<u16> {
        let i = self.unread();
        self.consumed(i, num::be_u16(i))
    }

    /// `long`
    #[inline(always)]
    pub(crate) fn long(&mut self) -> ReadResult<u32> {
        let i = self.unread();
        self.consumed(i, num::be_u32(i))
    }

    /// `longlong`
    #[inline(always)]
    pub(crate) fn longlong(&mut self) -> ReadResult<u64> {
        let i = self.unread();
        self.consumed(i, num::be_u64(i))
    }

    /// `shortstr`, written where it will live. nom reads the length and
    /// checks the string lies within the payload; the string itself is then
    /// copied as a fixed window that may run on into the slack (see
    /// [`ShortString::set_prefix`]).
    #[inline(always)]
    pub(crate) fn shortstr_into(&mut self, dst: &mut ShortString) -> ReadResult<()> {
        let tail = self.input.get(1..).unwrap_or_default();
        let i = self.unread();
        let len = self.consumed(i, types::short_string_len(i))?;
        dst.set_prefix(tail, len);
        Ok(())
    }

    /// `longstr`: a length past the end of the payload is `BadLength`.
    #[inline]
    pub(crate) fn longstr(&mut self) -> ReadResult<LongString> {
        let i = self.unread();
        let raw = self.consumed(i, types::long_bytes(i))?;
        Ok(LongString::from(raw))
    }

    /// A 32-bit length and the bytes it covers, unchecked: how a value
    /// that failed its own rules is stepped over when its length still
    /// fits the payload.
    #[inline]
    pub(crate) fn long_bytes(&mut self) -> ReadResult<&'a [u8]> {
        let i = self.unread();
        self.consumed(i, types::long_bytes(i))
    }

    /// `table`: validated now, entries built on first access.
    #[inline]
    pub(crate) fn table(&mut self) -> ReadResult<FieldTable> {
        let i = self.unread();
        let body = if self.ctx.validated {
            self.consumed(i, types::long_bytes(i))?
        } else {
            self.consumed(i, types::table_body(self.ctx.max_depth, 1, i))?
        };
        Ok(FieldTable::from_validated(body, self.source))
    }

    /// `bit`: the next bit of the current octet, or of a new one.
    #[inline(always)]
    pub(crate) fn bit(&mut self) -> ReadResult<bool> {
        if self.bit_index >= 8 {
            let octet = self.octet()?;
            self.bits = octet;
            self.bit_index = 0;
        }
        let value = self.bits & (1 << self.bit_index) != 0;
        self.bit_index += 1;
        Ok(value)
    }

    /// Succeeds only if every byte was consumed.
    #[inline(always)]
    pub(crate) fn finish(self) -> ReadResult<()> {
        if self.left == 0 {
            Ok(())
        } else {
            Err(DecodeErrorKind::TrailingBytes(self.left))
        }
    }
}

/// A field type the reader can decode in place.
pub(crate) trait ReadField {
    /// Decodes the next field into `self`.
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()>;
}

/// `ReadField` for the types whose reader returns the value.
macro_rules! read_field_by_value {
    ($($(#[$doc:meta])* $ty:ty => $read:ident;)*) => {$(
        $(#[$doc])*
        impl ReadField for $ty {
            #[inline(always)]
            fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
                *self = r.$read()?;
                Ok(())
            }
        }
    )*};
}

read_field_by_value! {
    u8 => octet;
    u16 => short;
    u32 => long;
    /// `longlong` and `timestamp`.
    u64 => longlong;
    bool => bit;
}

impl ReadField for ShortString {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        r.shortstr_into(self)
    }
}

impl ReadField for LongString {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.longstr()?;
        Ok(())
    }
}

impl ReadField for FieldTable {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.table()?;
        Ok(())
    }
}

/// Writes the arguments of a method field by field, packing consecutive
/// `bit` fields into octets (the mirror of [`ArgReader`]).
pub(crate) struct ArgWriter<'a> {
    dst: &'a mut bytes::BytesMut,
    /// Where the octet bits are being packed into sits, and the next bit's index (8 = none open).
    bit_at: usize,
    bit_index: u8,
}

type WriteResult = Result<(), crate::error::EncodeError>;

impl<'a> ArgWriter<'a> {
    pub(crate) fn new(dst: &'a mut bytes::BytesMut) -> Self {
        ArgWriter {
            dst,
            bit_at: 0,
            bit_index: 8,
        }
    }

    #[inline]
    pub(crate) fn octet(&mut self, v: &u8) -> WriteResult {
        use bytes::BufMut;
        self.bit_index = 8;
        self.dst.put_u8(*v);
        Ok(())
    }

    #[inline]
    pub(crate) fn short(&mut self, v: &u16) -> WriteResult {
        use bytes::BufMut;
        self.bit_index = 8;
        self.dst.put_u16(*v);
        Ok(())
    }

    #[inline]
    pub(crate) fn long(&mut self, v: &u32) -> WriteResult {
        use bytes::BufMut;
        self.bit_index = 8;
        self.dst.put_u32(*v);
        Ok(())
    }

    #[inline]
    pub(crate) fn longlong(&mut self, v: &u64) -> WriteResult {
        use bytes::BufMut;
        self.bit_index = 8;
        self.dst.put_u64(*v);
        Ok(())
    }

    #[inline]
    pub(crate) fn shortstr(&mut self, v: &ShortString) -> WriteResult {
        self.bit_index = 8;
        v.encode(self.dst)
    }

    #[inline]
    pub(crate) fn longstr(&mut self, v: &LongString) -> WriteResult {
        self.bit_index = 8;
        v.encode(self.dst)
    }

    #[inline]
    pub(crate) fn table(&mut self, v: &FieldTable) -> WriteResult {
        self.bit_index = 8;
        v.encode(self.dst)
    }

    #[inline]
    pub(crate) fn bit(&mut self, v: &bool) -> WriteResult {
        use bytes::BufMut;
        if self.bit_index >= 8 {
            self.bit_at = self.dst.len();
            self.dst.put_u8(0);
            self.bit_index = 0;
        }
        if *v {
            self.dst[self.bit_at] |= 1 << self.bit_index;
        }
        self.bit_index += 1;
        Ok(())
    }
}
