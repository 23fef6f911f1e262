//! Reading what can be read of a property list the decoder refused, one
//! property at a time: the walk behind [`crate::BasicProperties::salvage`],
//! which `properties.rs` drives in wire order from its table of properties.
//!
//! Properties are read with the decoder's own readers. A headers table whose
//! contents break a rule (an unknown field type, nesting past the limit) but
//! whose 32-bit length still fits is stepped over by that length, keeping the
//! top-level entries that pass on their own, and the walk carries on.
//! Anything that cannot be stepped over (a truncated string, a length that
//! runs past the end, an undefined flag bit) ends the walk: every later
//! property the flag word names is lost.
//!
//! This must never panic, recurse deeper than the nesting limit, or allocate
//! more than the size of its input; and what it reads of a list the decoder
//! accepts must be what the decoder reads. It knows property types, never
//! `BasicProperties`: `properties.rs` imports it, so it must not import that
//! back. It is a cold path: the decoder never calls it.

use bytes::Bytes;

use crate::parse::{ArgReader, ReadField};
use crate::types::{field_value_pair, field_value_pair_by_length, FieldTable, ShortString};

/// The name `lost` gives the flag word when it cannot be used: missing, cut
/// short, setting bits the basic class does not define, or of another class
/// than basic.
pub(crate) const PROPERTY_FLAGS: &str = "property-flags";

/// The walk down a flag word and property list, property by property, in
/// the order the caller asks for them (wire order).
pub(crate) struct Walk<'a> {
    reader: ArgReader<'a>,
    max_depth: usize,
    lost: Vec<&'static str>,
    /// Something could not be stepped over: nothing after it is read.
    stopped: bool,
}

impl<'a> Walk<'a> {
    pub(crate) fn new(reader: ArgReader<'a>, max_depth: usize) -> Self {
        Walk {
            reader,
            max_depth,
            // The flag word and 14 properties at most: never grows past this.
            lost: Vec::with_capacity(15),
            stopped: false,
        }
    }

    /// `property-flags`: the flag word, if there is one. With bits set that
    /// `defined` lacks, it is read but no property is: they may announce
    /// more flag words or properties, and reading on would be guessing.
    pub(crate) fn flags(&mut self, defined: u16) -> Option<u16> {
        match self.reader.short() {
            Ok(flags) => {
                if flags & defined != flags {
                    self.lost.push(PROPERTY_FLAGS);
                    self.stopped = true;
                }
                Some(flags & defined)
            }
            Err(_) => {
                self.lost.push(PROPERTY_FLAGS);
                None
            }
        }
    }

    /// The next property, flagged present, into `slot` (which is `None`).
    pub(crate) fn field<T: Salvage>(&mut self, slot: &mut Option<T>, name: &'static str) {
        if self.stopped {
            self.lost.push(name);
            return;
        }
        match T::salvage(&mut self.reader, self.max_depth) {
            Salvaged::Whole(value) => *slot = Some(value),
            Salvaged::Part(value) => {
                *slot = Some(value);
                self.lost.push(name);
            }
            Salvaged::SteppedOver => self.lost.push(name),
            Salvaged::Stuck => {
                self.lost.push(name);
                self.stopped = true;
            }
        }
    }

    pub(crate) fn into_lost(self) -> Vec<&'static str> {
        self.lost
    }
}

/// What reading one property came to.
pub(crate) enum Salvaged<T> {
    /// Read as the decoder reads it.
    Whole(T),
    /// Partly read (a table's readable entries); the reader is past it.
    Part(T),
    /// Unreadable, but the reader is past it.
    SteppedOver,
    /// Unreadable, and where it ends is unknown.
    Stuck,
}

/// A property type, read for salvage.
pub(crate) trait Salvage: Sized {
    /// Reads the next property. On `Stuck`, the reader may be anywhere.
    fn salvage(reader: &mut ArgReader<'_>, max_depth: usize) -> Salvaged<Self>;
}

/// Types with no length prefix: read whole, or stuck.
macro_rules! salvage_whole_or_stuck {
    ($($ty:ty),*) => {$(
        impl Salvage for $ty {
            fn salvage(reader: &mut ArgReader<'_>, _max_depth: usize) -> Salvaged<Self> {
                let mut value = <$ty>::default();
                match value.read_into(reader) {
                    Ok(()) => Salvaged::Whole(value),
                    Err(_) => Salvaged::Stuck,
                }
            }
        }
    )*};
}

salvage_whole_or_stuck!(u8, u64, ShortString);

impl Salvage for FieldTable {
    fn salvage(reader: &mut ArgReader<'_>, max_depth: usize) -> Salvaged<Self> {
        // A failed read consumes nothing: the length prefix is still next.
        if let Ok(table) = reader.table() {
            return Salvaged::Whole(table);
        }
        let Ok(body) = reader.long_bytes() else {
            return Salvaged::Stuck;
        };
        match readable_entries(body, max_depth) {
            Some(table) => Salvaged::Part(table),
            None => Salvaged::SteppedOver,
        }
    }
}

/// The top-level entries of a table body that pass the table rules on their
/// own (the outermost table is level 1), in wire order, or `None` if there
/// are none. An entry whose value fails but carries a length that fits is
/// passed by; any other failure ends the table there.
fn readable_entries(body: &[u8], max_depth: usize) -> Option<FieldTable> {
    let mut kept = Vec::new();
    let mut rest = body;
    // Every pair is at least a key length and a type code: each turn moves
    // on by two bytes or more, or ends the loop.
    while !rest.is_empty() {
        let (after, keep) = match field_value_pair(max_depth, 1, rest) {
            Ok((after, ())) => (after, true),
            Err(_) => match field_value_pair_by_length(rest) {
                Ok((after, ())) => (after, false),
                Err(_) => break,
            },
        };
        if keep {
            let pair = rest.get(..rest.len().saturating_sub(after.len())).unwrap_or_default();
            kept.extend_from_slice(pair);
        }
        rest = after;
    }
    if kept.is_empty() {
        return None;
    }
    // Each pair passed alone, so the pairs together pass as a table body.
    let kept = Bytes::from(kept);
    Some(FieldTable::from_validated(&kept, Some(&kept)))
}
