//! Payload codecs: JSON through serde by default, or your own.

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

/// A payload that could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

/// JSON through serde_json, `application/json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn content_type(&self) -> &str {
        "application/json"
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        // Room for a typical message up front, rather than growing from
        // nothing through several reallocations.
        let mut body = Vec::with_capacity(256);
        serde_json::to_writer(&mut body, value).map_err(|e| CodecError(e.to_string()))?;
        Ok(body)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(bytes).map_err(|e| CodecError(e.to_string()))
    }
}
