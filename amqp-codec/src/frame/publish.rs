//! [`PublishEncoder`]: `basic.publish` messages, with the method and header
//! frames of the last message kept and copied when the next one repeats them.

use std::sync::{Arc, Weak};

use bytes::{BufMut, BytesMut};

use super::{
    check_frame_max, encode_bodies, encode_header, encode_method, reserve_content, FRAME_BODY, FRAME_END,
    FRAME_OVERHEAD,
};
use crate::error::EncodeError;
use crate::method::{BasicPublish, Method};
use crate::properties::BasicProperties;
use crate::types::same_bytes;

/// Where the body size sits in a content header frame: after the 7-byte
/// frame head, the class id and the weight.
const BODY_SIZE_AT: usize = 7 + 2 + 2;

/// Encodes `basic.publish` messages as [`super::encode_content`] does, byte
/// for byte, but keeps the last message's method frame and content header
/// frame. A publisher sends the same exchange, routing key and flags many
/// times over, often with the same properties: the next message then copies
/// those frames (the header with its body size patched) instead of encoding
/// them again.
///
/// The method frame is reused when the channel and every field of the
/// `basic.publish` are equal. The header frame is reused when the channel
/// is the same and the properties are the same [`Arc`] (an `Arc`'s value
/// cannot change while it is shared), or equal ones without headers:
/// - properties someone else holds too are known by address only: the
///   encoder holds a [`Weak`], which keeps their allocation, not their
///   value, alive, so a later `Arc` can never be taken for them;
/// - properties made for this one message (nobody else holds the `Arc`, or
///   they are given by reference, [`PropertiesRef::Given`], e.g. a
///   `BasicProperties` a publisher gave by value) are kept until the next
///   message is encoded (a copy of them, when given by reference), and
///   compared with it field by field, the fields that vary between
///   messages first. Headers are not compared: a table can be equal and
///   encode otherwise (`0.0` and `-0.0`).
///
/// ```
/// use std::sync::Arc;
/// use acemq_codec::{encode_content, BasicProperties, BasicPublish, PublishEncoder};
/// let publish = BasicPublish { routing_key: "orders".into(), ..Default::default() };
/// let props = Arc::new(BasicProperties { delivery_mode: Some(2), ..Default::default() });
/// let mut encoder = PublishEncoder::new();
/// let (mut kept, mut fresh) = (bytes::BytesMut::new(), bytes::BytesMut::new());
/// for body in [&b"first"[..], b"second, longer"] {
///     encoder.encode(1, &publish, &props, body, 131_072, &mut kept).unwrap();
///     encode_content(1, &publish.clone().into(), &props, body, 131_072, &mut fresh).unwrap();
/// }
/// assert_eq!(kept, fresh);
/// ```
#[derive(Debug, Default)]
pub struct PublishEncoder {
    method: Option<KeptMethod>,
    header: Option<KeptHeader>,
    /// The kept method frame, header frame and the head of a body frame in
    /// one buffer, for a message whose body takes one frame: one copy
    /// instead of four. Empty when it must be built again.
    prefix: Vec<u8>,
    /// The larger of the two kept frames' sizes, once `prefix` is built.
    prefix_need: usize,
    /// Where in `prefix` the header's body size sits.
    body_size_at: usize,
}

/// The properties of a message to encode, as [`PublishEncoder`] may keep
/// them to compare with the next message's.
///
/// ```
/// use std::sync::Arc;
/// use acemq_codec::{BasicProperties, PropertiesRef};
/// let shared = Arc::new(BasicProperties::default());
/// assert!(matches!(PropertiesRef::from(&shared), PropertiesRef::Shared(_)));
/// assert!(matches!(PropertiesRef::from(&*shared), PropertiesRef::Given(_)));
/// ```
#[derive(Debug, Clone, Copy)]
pub enum PropertiesRef<'a> {
    /// Shared: known by address while others hold them too.
    Shared(&'a Arc<BasicProperties>),
    /// Given for this message only: compared by value, copied if kept.
    Given(&'a BasicProperties),
}

impl PropertiesRef<'_> {
    /// The properties.
    #[inline]
    pub fn get(&self) -> &BasicProperties {
        match self {
            PropertiesRef::Shared(shared) => shared,
            PropertiesRef::Given(given) => given,
        }
    }
}

impl<'a> From<&'a Arc<BasicProperties>> for PropertiesRef<'a> {
    #[inline]
    fn from(shared: &'a Arc<BasicProperties>) -> Self {
        PropertiesRef::Shared(shared)
    }
}

impl<'a> From<&'a BasicProperties> for PropertiesRef<'a> {
    #[inline]
    fn from(given: &'a BasicProperties) -> Self {
        PropertiesRef::Given(given)
    }
}

/// One message to encode.
struct Message<'a> {
    channel: u16,
    publish: &'a BasicPublish,
    properties: PropertiesRef<'a>,
    body: &'a [u8],
}

#[derive(Debug)]
struct KeptMethod {
    channel: u16,
    publish: BasicPublish,
    frame: Vec<u8>,
}

#[derive(Debug)]
struct KeptHeader {
    channel: u16,
    properties: KeptProperties,
    frame: Vec<u8>,
}

/// The properties a kept header frame was encoded from.
#[derive(Debug)]
enum KeptProperties {
    /// Held by others too: known by address (see [`PublishEncoder`]).
    Shared(Weak<BasicProperties>),
    /// Compared by value: properties made for one message, a copy of ones
    /// given by reference, or an equal `Arc` given since (held strongly,
    /// so their value cannot change).
    Owned(Arc<BasicProperties>),
    /// Given by reference with headers: never compared (see
    /// [`PublishEncoder`]), so the next message is encoded again.
    Unkept,
}

impl KeptProperties {
    fn new(properties: PropertiesRef<'_>) -> Self {
        match properties {
            PropertiesRef::Shared(shared) if Arc::strong_count(shared) == 1 && shared.headers.is_none() => {
                KeptProperties::Owned(shared.clone())
            }
            PropertiesRef::Shared(shared) => KeptProperties::Shared(Arc::downgrade(shared)),
            PropertiesRef::Given(given) if given.headers.is_none() => KeptProperties::Owned(Arc::new(given.clone())),
            PropertiesRef::Given(_) => KeptProperties::Unkept,
        }
    }

    /// Whether `properties` encode as these did. Owned ones that are equal
    /// but another `Arc` are swapped for it: a publisher that gives the
    /// same `Arc` from now on is then known by address, not compared.
    #[inline(always)]
    fn matches(&mut self, properties: PropertiesRef<'_>) -> bool {
        match (self, properties) {
            (KeptProperties::Shared(weak), PropertiesRef::Shared(shared)) => {
                std::ptr::eq(weak.as_ptr(), Arc::as_ptr(shared))
            }
            (KeptProperties::Owned(kept), PropertiesRef::Shared(shared)) => {
                Arc::ptr_eq(kept, shared) || Self::swap_equal(kept, shared)
            }
            (KeptProperties::Owned(kept), PropertiesRef::Given(given)) => kept.encodes_like(given),
            (KeptProperties::Shared(_) | KeptProperties::Unkept, _) => false,
        }
    }

    #[cold]
    #[inline(never)]
    fn swap_equal(kept: &mut Arc<BasicProperties>, properties: &Arc<BasicProperties>) -> bool {
        if !kept.encodes_like(properties) {
            return false;
        }
        *kept = properties.clone();
        true
    }
}

impl PublishEncoder {
    /// An encoder with nothing kept yet.
    pub fn new() -> Self {
        PublishEncoder::default()
    }

    /// Appends the `basic.publish` method frame, the content header and the
    /// body split into frames of at most `frame_max` bytes (0 = no limit).
    /// On error nothing is appended.
    pub fn encode<'p>(
        &mut self,
        channel: u16,
        publish: &BasicPublish,
        properties: impl Into<PropertiesRef<'p>>,
        body: &[u8],
        frame_max: u32,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let properties = properties.into();
        let method_kept = matches!(&self.method, Some(kept) if kept.channel == channel && kept.publish == *publish);
        let header_kept = self.header_kept(channel, properties);
        if method_kept && header_kept && self.copy_prefix(body, frame_max, dst) {
            return Ok(());
        }
        let start = dst.len();
        let message = Message {
            channel,
            publish,
            properties,
            body,
        };
        let result = self.encode_inner(&message, frame_max, (method_kept, header_kept), dst);
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    /// [`PublishEncoder::encode`] for a `basic.publish` given by its
    /// exchange, routing key and `mandatory` flag (`immediate` off, as
    /// RabbitMQ requires): the same bytes, but a message that repeats the
    /// last one's method is compared with it as it is given, without first
    /// building a [`BasicPublish`] to compare.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use acemq_codec::{BasicProperties, BasicPublish, PublishEncoder};
    /// let props = Arc::new(BasicProperties::default());
    /// let publish = BasicPublish { exchange: "shop".into(), routing_key: "orders".into(), ..Default::default() };
    /// let (mut by_route, mut by_method) = (PublishEncoder::new(), PublishEncoder::new());
    /// let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
    /// for _ in 0..2 {
    ///     by_route.encode_route(1, "shop", "orders", false, &props, b"hi", 4096, &mut a).unwrap();
    ///     by_method.encode(1, &publish, &props, b"hi", 4096, &mut b).unwrap();
    /// }
    /// assert_eq!(a, b);
    /// ```
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn encode_route<'p>(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: impl Into<PropertiesRef<'p>>,
        body: &[u8],
        frame_max: u32,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let properties = properties.into();
        if self.route_kept(channel, exchange, routing_key, mandatory, properties)
            && self.copy_prefix(body, frame_max, dst)
        {
            return Ok(());
        }
        self.encode_route_fresh(
            channel,
            exchange,
            routing_key,
            mandatory,
            properties,
            body,
            frame_max,
            dst,
        )
    }

    /// Whether the kept method and header frames are this message's.
    #[inline(always)]
    fn route_kept(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: PropertiesRef<'_>,
    ) -> bool {
        let Some(method) = &self.method else {
            return false;
        };
        let kept = &method.publish;
        method.channel == channel
            && kept.mandatory == mandatory
            && !kept.immediate
            && kept.reserved_1 == 0
            && same_bytes(kept.routing_key.as_bytes(), routing_key.as_bytes())
            && same_bytes(kept.exchange.as_bytes(), exchange.as_bytes())
            && self.header_kept(channel, properties)
    }

    /// Whether the kept header frame is that of `properties` on `channel`.
    #[inline(always)]
    fn header_kept(&mut self, channel: u16, properties: PropertiesRef<'_>) -> bool {
        match &mut self.header {
            Some(kept) => kept.channel == channel && kept.properties.matches(properties),
            None => false,
        }
    }

    /// [`PublishEncoder::encode_route`] when the kept frames cannot be
    /// copied as they are: out of line, so that the copy stays small.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn encode_route_fresh(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: PropertiesRef<'_>,
        body: &[u8],
        frame_max: u32,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let publish = BasicPublish {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory,
            ..Default::default()
        };
        self.encode(channel, &publish, properties, body, frame_max, dst)
    }

    /// Copies the message whose method and header frames are both kept (on
    /// its channel), when its body takes exactly one frame and every frame
    /// fits `frame_max`: the prefix, the body and the end byte, with the two
    /// sizes patched. `false` if it does not apply (nothing is written then).
    #[inline(always)]
    fn copy_prefix(&mut self, body: &[u8], frame_max: u32, dst: &mut BytesMut) -> bool {
        let limit = if frame_max == 0 { usize::MAX } else { frame_max as usize };
        if self.prefix.is_empty() && !self.build_prefix() {
            return false;
        }
        if body.is_empty() || body.len().saturating_add(FRAME_OVERHEAD).max(self.prefix_need) > limit {
            return false;
        }
        let at = dst.len();
        dst.reserve(self.prefix.len() + body.len() + 1);
        dst.extend_from_slice(&self.prefix);
        let size_at = at + self.body_size_at;
        dst[size_at..size_at + 8].copy_from_slice(&(body.len() as u64).to_be_bytes());
        let body_head_at = at + self.prefix.len() - 4;
        dst[body_head_at..body_head_at + 4].copy_from_slice(&(body.len() as u32).to_be_bytes());
        dst.extend_from_slice(body);
        dst.put_u8(FRAME_END);
        true
    }

    /// Builds the prefix from the kept frames; `false` if one is missing.
    #[cold]
    #[inline(never)]
    fn build_prefix(&mut self) -> bool {
        let (Some(method), Some(header)) = (&self.method, &self.header) else {
            return false;
        };
        self.prefix.extend_from_slice(&method.frame);
        self.prefix.extend_from_slice(&header.frame);
        self.prefix
            .extend_from_slice(&super::frame_head(FRAME_BODY, header.channel, 0));
        self.prefix_need = method.frame.len().max(header.frame.len());
        self.body_size_at = method.frame.len() + BODY_SIZE_AT;
        true
    }

    fn encode_inner(
        &mut self,
        &Message {
            channel,
            publish,
            properties,
            body,
        }: &Message<'_>,
        frame_max: u32,
        (method_kept, header_kept): (bool, bool),
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let max_body = reserve_content(body.len(), frame_max, dst)?;

        let method_at = dst.len();
        match &self.method {
            Some(kept) if method_kept => dst.put_slice(&kept.frame),
            _ => {
                self.prefix.clear();
                encode_method(channel, &Method::BasicPublish(publish.clone()), dst)?;
                let frame = refill(self.method.take().map(|kept| kept.frame), &dst[method_at..]);
                self.method = Some(KeptMethod {
                    channel,
                    publish: publish.clone(),
                    frame,
                });
            }
        }
        check_frame_max(dst.len() - method_at, frame_max)?;

        let header_at = dst.len();
        match &self.header {
            Some(kept) if header_kept => {
                dst.put_slice(&kept.frame);
                dst[header_at + BODY_SIZE_AT..header_at + BODY_SIZE_AT + 8]
                    .copy_from_slice(&(body.len() as u64).to_be_bytes());
            }
            _ => {
                self.prefix.clear();
                encode_header(channel, BasicPublish::CLASS_ID, body.len(), properties.get(), dst)?;
                let frame = refill(self.header.take().map(|kept| kept.frame), &dst[header_at..]);
                self.header = Some(KeptHeader {
                    channel,
                    properties: KeptProperties::new(properties),
                    frame,
                });
            }
        }
        check_frame_max(dst.len() - header_at, frame_max)?;

        encode_bodies(channel, body, max_body, dst)
    }
}

/// `bytes` in the vector a kept frame had, if any: a publisher that changes
/// its routing key every time pays a copy, not an allocation.
fn refill(old: Option<Vec<u8>>, bytes: &[u8]) -> Vec<u8> {
    let mut frame = old.unwrap_or_default();
    frame.clear();
    frame.extend_from_slice(bytes);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_content, FieldTable, FieldValue};

    fn fresh(channel: u16, publish: &BasicPublish, props: &BasicProperties, body: &[u8], frame_max: u32) -> BytesMut {
        let mut out = BytesMut::new();
        encode_content(channel, &publish.clone().into(), props, body, frame_max, &mut out).unwrap();
        out
    }

    #[test]
    fn every_change_between_publishes_gives_the_bytes_a_fresh_encode_gives() {
        let mut headers = FieldTable::new();
        headers.insert("x-acemq-attempt", FieldValue::I32(2));
        let a = Arc::new(BasicProperties {
            delivery_mode: Some(2),
            headers: Some(headers),
            ..Default::default()
        });
        let b = Arc::new(BasicProperties {
            message_id: Some("m-2".into()),
            ..Default::default()
        });
        let orders = BasicPublish {
            routing_key: "orders".into(),
            ..Default::default()
        };
        let mandatory = BasicPublish {
            mandatory: true,
            ..orders.clone()
        };
        let elsewhere = BasicPublish {
            exchange: "billing".into(),
            ..orders.clone()
        };
        let long_body = vec![7u8; 10_000];
        // (channel, method, properties, body, frame_max): each step changes one thing.
        type Step<'a> = (u16, &'a BasicPublish, &'a Arc<BasicProperties>, &'a [u8], u32);
        let steps: Vec<Step> = vec![
            (1, &orders, &a, b"one", 131_072),
            (1, &orders, &a, b"one", 131_072),
            (1, &orders, &a, b"a longer body", 131_072),
            (1, &orders, &a, &long_body, 4096),
            (2, &orders, &a, b"other channel", 131_072),
            (2, &mandatory, &a, b"mandatory", 131_072),
            (2, &elsewhere, &a, b"exchange", 131_072),
            (2, &elsewhere, &b, b"properties", 131_072),
            (2, &elsewhere, &a, b"back", 131_072),
            (2, &elsewhere, &a, b"", 0),
        ];
        let mut encoder = PublishEncoder::new();
        // The same steps by route, and by method and by route in turn.
        let (mut by_route, mut mixed) = (PublishEncoder::new(), PublishEncoder::new());
        for (i, (channel, publish, props, body, frame_max)) in steps.into_iter().enumerate() {
            let expected = fresh(channel, publish, props, body, frame_max);
            let mut kept = BytesMut::new();
            encoder
                .encode(channel, publish, props, body, frame_max, &mut kept)
                .unwrap();
            assert_eq!(kept, expected, "step {i}");
            let (exchange, key) = (
                publish.exchange.as_str().unwrap(),
                publish.routing_key.as_str().unwrap(),
            );
            let mut routed = BytesMut::new();
            by_route
                .encode_route(
                    channel,
                    exchange,
                    key,
                    publish.mandatory,
                    props,
                    body,
                    frame_max,
                    &mut routed,
                )
                .unwrap();
            assert_eq!(routed, expected, "step {i} by route");
            let mut both = BytesMut::new();
            if i % 2 == 0 {
                mixed
                    .encode(channel, publish, props, body, frame_max, &mut both)
                    .unwrap();
            } else {
                mixed
                    .encode_route(
                        channel,
                        exchange,
                        key,
                        publish.mandatory,
                        props,
                        body,
                        frame_max,
                        &mut both,
                    )
                    .unwrap();
            }
            assert_eq!(both, expected, "step {i} in turn");
        }
    }

    #[test]
    fn a_kept_method_with_immediate_or_a_ticket_is_not_copied_for_a_route() {
        let props = Arc::new(BasicProperties::default());
        let route = BasicPublish {
            routing_key: "orders".into(),
            ..Default::default()
        };
        let odd = [
            BasicPublish {
                immediate: true,
                ..route.clone()
            },
            BasicPublish {
                reserved_1: 7,
                ..route.clone()
            },
        ];
        for kept in &odd {
            let mut encoder = PublishEncoder::new();
            encoder
                .encode(1, kept, &props, b"x", 131_072, &mut BytesMut::new())
                .unwrap();
            let mut routed = BytesMut::new();
            encoder
                .encode_route(1, "", "orders", false, &props, b"x", 131_072, &mut routed)
                .unwrap();
            assert_eq!(routed, fresh(1, &route, &props, b"x", 131_072), "after {kept:?}");
        }
    }

    #[test]
    fn properties_made_for_one_message_are_compared_by_value_and_the_last_one_given_is_kept() {
        let publish = BasicPublish::default();
        let mut encoder = PublishEncoder::new();
        let made = |id: &str, expiration: Option<&str>| {
            Arc::new(BasicProperties {
                message_id: Some(id.into()),
                expiration: expiration.map(Into::into),
                ..Default::default()
            })
        };
        // Each differs from the last in one field, or in none.
        let all = [
            made("first", None),
            made("first", None),
            made("second", None),
            made("second", Some("60000")),
            made("second", Some("60000")),
            made("second", Some("6000")),
        ];
        for (i, props) in all.iter().enumerate() {
            let mut kept = BytesMut::new();
            encoder.encode(1, &publish, props, b"x", 131_072, &mut kept).unwrap();
            assert_eq!(kept, fresh(1, &publish, props, b"x", 131_072), "message {i}");
            // The encoder holds the one it was given last, equal or not: the
            // next publish of the same `Arc` is known by its address.
            assert_eq!(Arc::strong_count(props), 2, "message {i} is the one kept");
        }
        // Every earlier one is let go.
        let counts: Vec<usize> = all.iter().map(Arc::strong_count).collect();
        assert_eq!(counts, [1, 1, 1, 1, 1, 2]);
        // Properties someone else holds as well are never kept alive.
        let shared = made("shared", None);
        let also = shared.clone();
        encoder
            .encode(1, &publish, &shared, b"x", 131_072, &mut BytesMut::new())
            .unwrap();
        assert_eq!(Arc::strong_count(&all[5]), 1, "replaced, so let go");
        drop(also);
        assert_eq!(Arc::strong_count(&shared), 1, "known by a Weak only");
    }

    #[test]
    fn properties_given_by_reference_or_shared_in_any_order_give_the_bytes_a_fresh_encode_gives() {
        let publish = BasicPublish::default();
        let mut headers = FieldTable::new();
        headers.insert("x-acemq-attempt", FieldValue::I32(1));
        let plain = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let other = BasicProperties {
            message_id: Some("other".into()),
            ..plain.clone()
        };
        let with_headers = BasicProperties {
            headers: Some(headers),
            ..plain.clone()
        };
        let shared = Arc::new(plain.clone());
        // Each step: given by reference (true) or as the shared Arc (false).
        let steps: [(&BasicProperties, bool); 9] = [
            (&plain, true),
            (&plain, true),
            (&other, true),
            (&plain, false),
            (&plain, true),
            (&with_headers, true),
            (&with_headers, true),
            (&plain, true),
            (&plain, false),
        ];
        let mut encoder = PublishEncoder::new();
        for (i, (props, by_reference)) in steps.into_iter().enumerate() {
            let mut out = BytesMut::new();
            if by_reference {
                encoder.encode(1, &publish, props, b"x", 131_072, &mut out).unwrap();
            } else {
                encoder.encode(1, &publish, &shared, b"x", 131_072, &mut out).unwrap();
            }
            assert_eq!(out, fresh(1, &publish, props, b"x", 131_072), "step {i}");
        }
    }

    #[test]
    fn equal_properties_with_headers_are_encoded_again() {
        let publish = BasicPublish::default();
        let mut encoder = PublishEncoder::new();
        for zero in [0.0, -0.0] {
            let mut headers = FieldTable::new();
            headers.insert("x", FieldValue::F64(zero));
            let props = Arc::new(BasicProperties {
                headers: Some(headers),
                ..Default::default()
            });
            let mut kept = BytesMut::new();
            encoder.encode(1, &publish, &props, b"x", 131_072, &mut kept).unwrap();
            assert_eq!(kept, fresh(1, &publish, &props, b"x", 131_072), "{zero:?}");
        }
    }

    #[test]
    fn a_frame_too_large_appends_nothing_and_the_next_publish_is_whole() {
        let publish = BasicPublish {
            routing_key: "q".into(),
            ..Default::default()
        };
        let big = Arc::new(BasicProperties {
            correlation_id: Some("c".repeat(200).as_str().into()),
            message_id: Some("m".repeat(200).as_str().into()),
            app_id: Some("a".repeat(200).as_str().into()),
            ..Default::default()
        });
        let mut encoder = PublishEncoder::new();
        let mut out = BytesMut::from(&b"kept"[..]);
        // The header frame is over 600 bytes: more than a frame_max of 300.
        assert!(matches!(
            encoder.encode(1, &publish, &big, b"x", 300, &mut out),
            Err(EncodeError::FrameTooLarge { .. })
        ));
        assert_eq!(&out[..], b"kept");
        // The same again is refused again, though its frames are now kept.
        assert!(encoder.encode(1, &publish, &big, b"x", 300, &mut out).is_err());
        assert_eq!(&out[..], b"kept");
        let small = Arc::new(BasicProperties::default());
        encoder.encode(1, &publish, &small, b"x", 300, &mut out).unwrap();
        assert_eq!(&out[4..], &fresh(1, &publish, &small, b"x", 300)[..]);
    }
}
