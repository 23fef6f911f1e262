//! Payload codecs: JSON through serde by default, or your own, and
//! `CodecError`, which keeps a codec's own error whole. A codec only turns
//! values into bytes and back: it never sees a message's properties or the
//! connection.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Turns payloads into bytes and back. Implement it for another format
/// (e.g. protobuf or MessagePack) and give it to the publisher or consumer.
pub trait Codec: Send + Sync + 'static {
    /// The `content-type` this codec writes.
    fn content_type(&self) -> &str;

    /// Encodes a payload.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError>;

    /// Decodes a payload.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

/// A payload that could not be encoded or decoded: the codec's own error,
/// kept whole. It reads as that error does, and is its `source()`, so a
/// caller can downcast it to the codec's type:
///
/// ```
/// use acemq_core::{Codec, Json};
///
/// let err = Json.decode::<u32>(b"not json").unwrap_err();
/// let cause = std::error::Error::source(&err).expect("the codec's error");
/// assert!(cause.downcast_ref::<serde_json::Error>().is_some());
/// assert_eq!(err.to_string(), cause.to_string());
/// ```
///
/// Shared (an [`Arc`]) rather than boxed, so that it clones with
/// [`crate::Error`].
#[derive(Debug, Clone)]
pub struct CodecError(Arc<dyn std::error::Error + Send + Sync>);

impl CodecError {
    /// A codec's error; a `String` or `&str` makes one of a message.
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> CodecError {
        CodecError(Arc::from(error.into()))
    }

    /// The codec's error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for CodecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

thread_local! {
    /// The buffer [`Json`] encodes into on this thread.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most a thread's JSON buffer keeps between messages: one larger
/// message does not leave the thread holding its size.
const SCRATCH_KEPT: usize = 64 * 1024;

/// `value` as JSON, appended to `body`.
fn json_into<T: Serialize>(mut body: Vec<u8>, value: &T) -> Result<Vec<u8>, CodecError> {
    serde_json::to_writer(&mut body, value).map_err(CodecError::new)?;
    Ok(body)
}

/// JSON through serde_json, `application/json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn content_type(&self) -> &str {
        "application/json"
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        // Written into a buffer this thread keeps, which has grown to the
        // size of its messages, then copied out at its exact size: one
        // allocation a message, where writing into a new vector grows it
        // through reallocations (each a copy of what is written so far).
        let scratch = SCRATCH.try_with(|scratch| {
            // Taken already (a `Serialize` impl that encodes JSON itself):
            // that inner encode writes into a vector of its own.
            let Ok(mut buf) = scratch.try_borrow_mut() else {
                return json_into(Vec::with_capacity(256), value);
            };
            buf.clear();
            let body = serde_json::to_writer(&mut *buf, value)
                .map(|()| buf.to_vec())
                .map_err(CodecError::new);
            if buf.capacity() > SCRATCH_KEPT {
                *buf = Vec::new();
            }
            body
        });
        // The thread is ending (its locals are gone): a vector of its own.
        scratch.unwrap_or_else(|_| json_into(Vec::with_capacity(256), value))
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(bytes).map_err(CodecError::new)
    }
}

#[cfg(test)]
mod tests {
    use super::{Codec, Json, SCRATCH_KEPT};

    /// A value whose serialization encodes another value with [`Json`]
    /// while the thread's buffer is in use.
    struct Nested(u32);

    impl serde::Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let inner = Json.encode(&vec![self.0; 3]).map_err(serde::ser::Error::custom)?;
            serializer.serialize_str(std::str::from_utf8(&inner).map_err(serde::ser::Error::custom)?)
        }
    }

    #[test]
    fn every_encode_gives_what_serde_json_gives_whatever_came_before_it_on_the_thread() {
        let long = "x".repeat(SCRATCH_KEPT + 10);
        let values = [
            serde_json::json!({"id": 1, "note": "a longer note than the next one"}),
            serde_json::json!("short"),
            serde_json::json!(long),
            serde_json::json!([1, 2, 3]),
            serde_json::json!({}),
        ];
        for value in &values {
            let body = Json.encode(value).unwrap();
            assert_eq!(body, serde_json::to_vec(value).unwrap());
            assert_eq!(body.capacity(), body.len(), "copied out at its size");
        }
        // An encode inside an encode, on the same thread.
        let nested = Json.encode(&Nested(7)).unwrap();
        assert_eq!(nested, serde_json::to_vec("[7,7,7]").unwrap());
        // A value that does not encode leaves the next one whole.
        let mut bad = std::collections::HashMap::new();
        bad.insert(vec![1u8], 1);
        assert!(Json.encode(&bad).is_err());
        assert_eq!(Json.encode(&values[1]).unwrap(), b"\"short\"");
    }
}
