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
    /// The buffer `rest` lies in, when there is one to share: tables are
    /// then zero-copy slices of it, else copies.
    source: Option<&'a Bytes>,
    rest: &'a [u8],
    /// The octet bits are being taken from, and the next bit's index (8 = none left).
    bits: u8,
    bit_index: u8,
}

type ReadResult<T> = Result<T, DecodeErrorKind>;

impl<'a> ArgReader<'a> {
    pub(crate) fn new(ctx: Ctx, input: &'a [u8]) -> Self {
        ArgReader {
            ctx,
            source: None,
            rest: input,
            bits: 0,
            bit_index: 8,
        }
    }

    /// A reader of `input`, which must lie within `source`: tables are
    /// zero-copy slices of `source`.
    pub(crate) fn shared(ctx: Ctx, source: &'a Bytes, input: &'a [u8]) -> Self {
        ArgReader {
            ctx,
            source: Some(source),
            rest: input,
            bits: 0,
            bit_index: 8,
        }
    }

    /// The next `N` bytes.
    #[inline(always)]
    fn fixed<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        self.bit_index = 8;
        match self.rest.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.rest = rest;
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

    /// `timestamp`
    #[inline(always)]
    pub(crate) fn timestamp(&mut self) -> ReadResult<u64> {
        self.longlong()
    }

    /// `shortstr`
    #[inline(always)]
    pub(crate) fn shortstr(&mut self) -> ReadResult<ShortString> {
        self.bit_index = 8;
        let Some((&len, tail)) = self.rest.split_first() else {
            return Err(DecodeErrorKind::Truncated);
        };
        let len = usize::from(len);
        let Some(rest) = tail.get(len..) else {
            return Err(DecodeErrorKind::Truncated);
        };
        self.rest = rest;
        Ok(ShortString::from_prefix(tail, len))
    }

    /// `longstr`: a length past the end of the payload is `BadLength`.
    #[inline]
    pub(crate) fn longstr(&mut self) -> ReadResult<LongString> {
        self.bit_index = 8;
        let (raw, rest) = types::length_prefixed(self.rest)?;
        self.rest = rest;
        Ok(LongString::from(raw))
    }

    /// `table`: validated now, entries built on first access.
    #[inline]
    pub(crate) fn table(&mut self) -> ReadResult<FieldTable> {
        self.bit_index = 8;
        let (body, rest) = types::length_prefixed(self.rest)?;
        if body.is_empty() {
            self.rest = rest;
            return Ok(FieldTable::new());
        }
        types::validate_table_body(self.ctx.max_depth, 1, body)?;
        self.rest = rest;
        let raw = match self.source {
            Some(source) => source.slice_ref(body),
            None => Bytes::copy_from_slice(body),
        };
        Ok(FieldTable::from_validated(raw))
    }

    /// `bit`: the next bit of the current octet, or of a new one.
    #[inline(always)]
    pub(crate) fn bit(&mut self) -> ReadResult<bool> {
        if self.bit_index >= 8 {
            let Some((&octet, rest)) = self.rest.split_first() else {
                return Err(DecodeErrorKind::Truncated);
            };
            self.rest = rest;
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
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeErrorKind::TrailingBytes(self.rest.len()))
        }
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
