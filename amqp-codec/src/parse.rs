//! Crate-internal parsing plumbing: the nom error type, the zero-copy
//! context, and the field-by-field reader the method table is built on.
//!
//! Nothing in here is public: at the crate boundary a [`PError`] becomes an
//! [`crate::Error`]. Parsers run in nom's *complete* mode on a payload that the
//! envelope has already delimited, so running out of input is `Truncated`,
//! never a request for more bytes.

use bytes::Bytes;
use nom::number::complete::{be_u16, be_u32, be_u64, be_u8};

use crate::error::DecodeErrorKind;
use crate::types::{self, FieldTable, LongString, ShortString};

/// The error every internal parser returns: a domain kind, no nom details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PError(pub(crate) DecodeErrorKind);

impl<'a> nom::error::ParseError<&'a [u8]> for PError {
    fn from_error_kind(_input: &'a [u8], _kind: nom::error::ErrorKind) -> Self {
        // In complete mode the only way nom's own combinators fail on the
        // inputs we give them is by running out of bytes.
        PError(DecodeErrorKind::Truncated)
    }

    fn append(_input: &'a [u8], _kind: nom::error::ErrorKind, other: Self) -> Self {
        other
    }
}

/// The result of an internal parser.
pub(crate) type PResult<'a, T> = nom::IResult<&'a [u8], T, PError>;

/// Fails a parser with a domain error kind.
pub(crate) fn fail<T>(kind: DecodeErrorKind) -> Result<T, nom::Err<PError>> {
    Err(nom::Err::Error(PError(kind)))
}

/// Turns a nom error into its domain kind.
pub(crate) fn kind_of(err: nom::Err<PError>) -> DecodeErrorKind {
    match err {
        nom::Err::Error(PError(kind)) | nom::Err::Failure(PError(kind)) => kind,
        nom::Err::Incomplete(_) => DecodeErrorKind::Truncated,
    }
}

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

    #[inline]
    fn run<T>(&mut self, mut parser: impl FnMut(&'a [u8]) -> PResult<'a, T>) -> ReadResult<T> {
        self.bit_index = 8;
        match parser(self.rest) {
            Ok((rest, value)) => {
                self.rest = rest;
                Ok(value)
            }
            Err(err) => Err(kind_of(err)),
        }
    }

    /// `octet`
    #[inline]
    pub(crate) fn octet(&mut self) -> ReadResult<u8> {
        self.run(be_u8)
    }

    /// `short`
    #[inline]
    pub(crate) fn short(&mut self) -> ReadResult<u16> {
        self.run(be_u16)
    }

    /// `long`
    #[inline]
    pub(crate) fn long(&mut self) -> ReadResult<u32> {
        self.run(be_u32)
    }

    /// `longlong`
    #[inline]
    pub(crate) fn longlong(&mut self) -> ReadResult<u64> {
        self.run(be_u64)
    }

    /// `timestamp`
    #[inline]
    pub(crate) fn timestamp(&mut self) -> ReadResult<u64> {
        self.run(be_u64)
    }

    /// `shortstr`
    #[inline]
    pub(crate) fn shortstr(&mut self) -> ReadResult<ShortString> {
        let raw = self.run(types::short_string_raw)?;
        Ok(ShortString::from_slice(raw))
    }

    /// `longstr`
    #[inline]
    pub(crate) fn longstr(&mut self) -> ReadResult<LongString> {
        let raw = self.run(types::long_string_raw)?;
        Ok(LongString::from_slice(raw))
    }

    /// `table`
    #[inline]
    pub(crate) fn table(&mut self) -> ReadResult<FieldTable> {
        self.bit_index = 8;
        let (body, rest) = types::length_prefixed(self.rest)?;
        types::validate_table_body(self.ctx.max_depth, 1, body)?;
        self.rest = rest;
        let raw = match self.source {
            Some(source) if !body.is_empty() => source.slice_ref(body),
            _ => Bytes::copy_from_slice(body),
        };
        Ok(FieldTable::from_validated(raw))
    }

    /// `bit`: the next bit of the current octet, or of a new one.
    #[inline]
    pub(crate) fn bit(&mut self) -> ReadResult<bool> {
        if self.bit_index >= 8 {
            let (rest, octet) = be_u8::<_, PError>(self.rest).map_err(kind_of)?;
            self.rest = rest;
            self.bits = octet;
            self.bit_index = 0;
        }
        let value = self.bits & (1 << self.bit_index) != 0;
        self.bit_index += 1;
        Ok(value)
    }

    /// Succeeds only if every byte was consumed.
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
