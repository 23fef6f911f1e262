//! Crate-internal parsing plumbing: the field-by-field reader the method
//! table and the properties are built on, and its writer twin.
//!
//! Nothing in here is public. Readers run on a payload that the envelope has
//! already delimited, so running out of input is `Truncated`, never a request
//! for more bytes. They are written with plain slice operations, without
//! allocation for anything inline, because they run for every frame.

use bytes::Bytes;

use crate::error::DecodeErrorKind;
use crate::types::{self, FieldTable, LongString, ShortString};

/// What every parser of a payload needs besides the bytes: the nesting limit.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub(crate) max_depth: usize,
}

/// Reads the arguments of a method field by field, packing consecutive
/// `bit` fields into octets as AMQP 0-9-1 §4.2.5.2 requires.
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

    /// The next `N` bytes.
    #[inline(always)]
    fn fixed<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        self.bit_index = 8;
        if self.left < N {
            return Err(DecodeErrorKind::Truncated);
        }
        match self.input.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.input = rest;
                self.left -= N;
                Ok(*head)
            }
            None => Err(DecodeErrorKind::Truncated),
        }
    }

    /// `octet`
    #[inline(always)]
    pub(crate) fn octet(&mut self) -> ReadResult<u8> {
        self.fixed::<1>().map(|[b]| b)
    }

    /// `short`
    #[inline(always)]
    pub(crate) fn short(&mut self) -> ReadResult<u16> {
        self.fixed().map(u16::from_be_bytes)
    }

    /// `long`
    #[inline(always)]
    pub(crate) fn long(&mut self) -> ReadResult<u32> {
        self.fixed().map(u32::from_be_bytes)
    }

    /// `longlong`
    #[inline(always)]
    pub(crate) fn longlong(&mut self) -> ReadResult<u64> {
        self.fixed().map(u64::from_be_bytes)
    }

    /// `shortstr`, written where it will live.
    #[inline(always)]
    pub(crate) fn shortstr_into(&mut self, dst: &mut ShortString) -> ReadResult<()> {
        self.bit_index = 8;
        let Some((&len, tail)) = self.input.split_first() else {
            return Err(DecodeErrorKind::Truncated);
        };
        let len = usize::from(len);
        if self.left <= len {
            return Err(DecodeErrorKind::Truncated);
        }
        dst.set_prefix(tail, len);
        self.skip(1 + len);
        Ok(())
    }

    /// `longstr`: a length past the end of the payload is `BadLength`.
    #[inline]
    pub(crate) fn longstr(&mut self) -> ReadResult<LongString> {
        self.bit_index = 8;
        let (raw, _) = types::length_prefixed(self.rest())?;
        let value = LongString::from(raw);
        self.skip(4 + raw.len());
        Ok(value)
    }

    /// `table`: validated now, entries built on first access.
    #[inline]
    pub(crate) fn table(&mut self) -> ReadResult<FieldTable> {
        self.bit_index = 8;
        let (body, _) = types::length_prefixed(self.rest())?;
        if !body.is_empty() {
            types::validate_table_body(self.ctx.max_depth, 1, body)?;
        }
        let table = FieldTable::from_validated(body, self.source);
        self.skip(4 + body.len());
        Ok(table)
    }

    /// `bit`: the next bit of the current octet, or of a new one.
    #[inline(always)]
    pub(crate) fn bit(&mut self) -> ReadResult<bool> {
        if self.bit_index >= 8 {
            let [octet] = self.fixed::<1>()?;
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

impl ReadField for u8 {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.octet()?;
        Ok(())
    }
}

impl ReadField for u16 {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.short()?;
        Ok(())
    }
}

impl ReadField for u32 {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.long()?;
        Ok(())
    }
}

/// `longlong` and `timestamp`.
impl ReadField for u64 {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.longlong()?;
        Ok(())
    }
}

impl ReadField for bool {
    #[inline(always)]
    fn read_into(&mut self, r: &mut ArgReader<'_>) -> ReadResult<()> {
        *self = r.bit()?;
        Ok(())
    }
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
