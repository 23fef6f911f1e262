//! The nom plumbing every parser in the crate stands on: the internal error
//! type and result, failing with a domain kind, and big-endian numbers.
//!
//! This is the bottom layer. It imports nothing of the crate but `error`, and
//! must never import `types`, `parse`, `frame` or anything else that parses:
//! they all import it, so importing one of them back would make a cycle.
//! Nothing in here is public: at the crate boundary a [`PError`] becomes a
//! [`DecodeErrorKind`] and then an [`crate::Error`]. Parsers run nom's
//! *complete* parsers on a payload that the frame decoder has already delimited,
//! so running out of input is `Truncated`, never a request for more bytes.

use crate::error::DecodeErrorKind;

/// The error every internal parser returns: a domain kind, no nom details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PError(pub(crate) DecodeErrorKind);

impl<'a> nom::error::ParseError<&'a [u8]> for PError {
    #[inline]
    fn from_error_kind(_input: &'a [u8], _kind: nom::error::ErrorKind) -> Self {
        // In complete mode the only way nom's own parsers fail on the inputs
        // we give them is by running out of bytes.
        PError(DecodeErrorKind::Truncated)
    }

    #[inline]
    fn append(_input: &'a [u8], _kind: nom::error::ErrorKind, other: Self) -> Self {
        other
    }
}

/// The result of an internal parser.
pub(crate) type PResult<'a, T> = nom::IResult<&'a [u8], T, PError>;

/// Fails a parser with a domain error kind.
#[inline]
pub(crate) fn fail<T>(kind: DecodeErrorKind) -> Result<T, nom::Err<PError>> {
    Err(nom::Err::Error(PError(kind)))
}

/// Turns a nom error into its domain kind.
#[inline]
pub(crate) fn kind_of(err: nom::Err<PError>) -> DecodeErrorKind {
    match err {
        nom::Err::Error(PError(kind)) | nom::Err::Failure(PError(kind)) => kind,
        nom::Err::Incomplete(_) => DecodeErrorKind::Truncated,
    }
}

/// Big-endian numbers as nom parsers that take their width with
/// `nom::bytes::complete::take` and read it in one load. nom 7's own
/// `be_u16`..`be_f64` build the value a byte at a time, which shows on a
/// path that runs for every field of every frame; the behaviour (complete
/// input, `Truncated` when short) is the same.
pub(crate) mod num {
    use nom::bytes::complete::take;

    use super::{PError, PResult};
    use crate::error::DecodeErrorKind;

    macro_rules! be {
        ($($(#[$doc:meta])* $name:ident -> $ty:ty;)*) => {$(
            $(#[$doc])*
            #[inline(always)]
            pub(crate) fn $name(i: &[u8]) -> PResult<'_, $ty> {
                const WIDTH: usize = std::mem::size_of::<$ty>();
                let (rest, bytes) = take(WIDTH)(i)?;
                match <[u8; WIDTH]>::try_from(bytes) {
                    Ok(bytes) => Ok((rest, <$ty>::from_be_bytes(bytes))),
                    Err(_) => Err(nom::Err::Error(PError(DecodeErrorKind::Truncated))),
                }
            }
        )*};
    }

    be! {
        /// A big-endian `u16`.
        be_u16 -> u16;
        /// A big-endian `u32`.
        be_u32 -> u32;
        /// A big-endian `u64`.
        be_u64 -> u64;
        /// A big-endian `i8`.
        be_i8 -> i8;
        /// A big-endian `i16`.
        be_i16 -> i16;
        /// A big-endian `i32`.
        be_i32 -> i32;
        /// A big-endian `i64`.
        be_i64 -> i64;
        /// A big-endian IEEE 754 `f32`.
        be_f32 -> f32;
        /// A big-endian IEEE 754 `f64`.
        be_f64 -> f64;
    }
}
