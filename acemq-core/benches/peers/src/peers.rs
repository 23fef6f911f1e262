//! The peers' rows: lapin and amqprs in each scenario, each used as its
//! documentation shows, with the same queue, window, prefetch, bodies and
//! properties as the acemq rows.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use acemq_core::amqp::AmqpUrl;
use acemq_codec::{BasicProperties, FieldValue};

use super::floor::{cpu_time, Figures};
use super::{header_values, Latency, Props, Sampler, BODY, WINDOW};

// ---------------------------------------------------------------- lapin

/// lapin's properties for ours (the fields the groups use).
fn lapin_properties(props: &BasicProperties) -> lapin::BasicProperties {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let mut out = lapin::BasicProperties::default();
    if let Some(v) = &props.content_type {
        out = out.with_content_type(v.as_str().expect("UTF-8").into());
    }
    if let Some(v) = props.delivery_mode {
        out = out.with_delivery_mode(v);
    }
    if let Some(v) = props.timestamp {
        out = out.with_timestamp(v);
    }
    if let Some(v) = &props.message_id {
        out = out.with_message_id(v.as_str().expect("UTF-8").into());
    }
    if let Some(v) = &props.correlation_id {
        out = out.with_correlation_id(v.as_str().expect("UTF-8").into());
    }
    if props.headers.is_some() {
        let mut headers = FieldTable::default();
        for (name, value) in header_values(props) {
            let value = match value {
                FieldValue::I32(i) => AMQPValue::LongInt(i),
                FieldValue::Timestamp(t) => AMQPValue::Timestamp(t),
                FieldValue::LongString(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
                other => panic!("no lapin header value for {other:?}"),
            };
            headers.insert(name.into(), value);
        }
        out = out.with_headers(headers);
    }
    out
}

pub async fn lapin_connect(addr: &AmqpUrl) -> lapin::Connection {
    use lapin::uri::{AMQPAuthority, AMQPUri, AMQPUserInfo};
    let (host, port) = addr.hosts.first().expect("a host").clone();
    let uri = AMQPUri {
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: addr.username.clone(),
                password: addr.password.expose().to_string(),
            },
            host,
            port,
        },
        vhost: addr.vhost.clone(),
        ..Default::default()
    };
    lapin::Connection::connect_uri(uri, lapin::ConnectionProperties::default())
        .await
        .expect("lapin connects")
}

pub async fn lapin_close(conn: &lapin::Connection) {
    conn.close(200, "bye".into()).await.expect("lapin closes");
}

/// Confirmed publishing as lapin's API has it: `basic_publish` resolves
/// once its I/O thread has written the frames, to a `PublisherConfirm`
/// that resolves with the broker's confirm; the confirms are kept in a
/// queue of at most [`WINDOW`] and awaited oldest first.
pub async fn lapin_publish(conn: &lapin::Connection, queue: &str, messages: u64, props: Props) -> Figures {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::{Confirmation, PublisherConfirm};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("lapin confirm.select");
    let properties = lapin_properties(&props.properties());
    let body = vec![b'x'; BODY];
    let (exchange, routing_key): (lapin::types::ShortString, lapin::types::ShortString) = ("".into(), queue.into());
    let mut in_flight: VecDeque<PublisherConfirm> = VecDeque::with_capacity(WINDOW);
    let check = |confirmation: Confirmation| assert!(matches!(confirmation, Confirmation::Ack(None)), "lapin: nacked");
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        if in_flight.len() == WINDOW {
            check(in_flight.pop_front().unwrap().await.expect("lapin confirm"));
        }
        let confirm = ch
            .basic_publish(
                exchange.clone(),
                routing_key.clone(),
                BasicPublishOptions::default(),
                &body,
                properties.clone(),
            )
            .await
            .expect("lapin basic.publish");
        in_flight.push_back(confirm);
    }
    for confirm in in_flight {
        check(confirm.await.expect("lapin confirm"));
    }
    let figures = Figures::since("lapin publish", messages, t0, c0);
    ch.close(200, "bye".into()).await.expect("lapin channel.close");
    figures
}

/// lapin's consumer stream, every delivery acked on its own (the ack
/// awaited, as lapin's examples do).
pub async fn lapin_consume(conn: &lapin::Connection, queue: &str, messages: u64) -> Figures {
    use futures_lite::StreamExt;
    use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.basic_qos(WINDOW as u16, BasicQosOptions::default())
        .await
        .expect("lapin basic.qos");
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "peers-lapin".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .expect("lapin basic.consume");
    for _ in 0..messages {
        let delivery = consumer
            .next()
            .await
            .expect("lapin: the consumer ended")
            .expect("lapin delivery");
        delivery.ack(BasicAckOptions::default()).await.expect("lapin ack");
    }
    let figures = Figures::since("lapin consume", messages, t0, c0);
    ch.basic_cancel("peers-lapin".into(), BasicCancelOptions::default())
        .await
        .expect("lapin basic.cancel");
    ch.close(200, "bye".into()).await.expect("lapin channel.close");
    figures
}

pub async fn lapin_latency(conn: &lapin::Connection, queue: &str, warmup: usize, samples: usize) -> Latency {
    use futures_lite::StreamExt;
    use lapin::options::BasicQosOptions;
    use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions};
    let publisher = conn.create_channel().await.expect("lapin channel");
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.basic_qos(WINDOW as u16, BasicQosOptions::default())
        .await
        .expect("lapin basic.qos");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "peers-lapin-latency".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .expect("lapin basic.consume");
    let properties = lapin_properties(&super::minimal_properties());
    let body = vec![b'x'; BODY];
    let (exchange, routing_key): (lapin::types::ShortString, lapin::types::ShortString) = ("".into(), queue.into());
    let mut sampler = Sampler::new(warmup, samples);
    while sampler.more() {
        let t0 = Instant::now();
        publisher
            .basic_publish(
                exchange.clone(),
                routing_key.clone(),
                BasicPublishOptions::default(),
                &body,
                properties.clone(),
            )
            .await
            .expect("lapin basic.publish");
        let delivery = consumer
            .next()
            .await
            .expect("lapin: the consumer ended")
            .expect("lapin delivery");
        sampler.push(t0.elapsed());
        delivery.ack(BasicAckOptions::default()).await.expect("lapin ack");
    }
    let latency = sampler.finish();
    ch.basic_cancel("peers-lapin-latency".into(), BasicCancelOptions::default())
        .await
        .expect("lapin basic.cancel");
    ch.close(200, "bye".into()).await.expect("lapin channel.close");
    publisher.close(200, "bye".into()).await.expect("lapin channel.close");
    latency
}

// --------------------------------------------------------------- amqprs

/// amqprs's properties for ours (the fields the groups use).
fn amqprs_properties(props: &BasicProperties) -> amqprs::BasicProperties {
    use amqprs::{FieldName, FieldTable, FieldValue as V};
    let mut out = amqprs::BasicProperties::default();
    if let Some(v) = &props.content_type {
        out.with_content_type(v.as_str().expect("UTF-8"));
    }
    if let Some(v) = props.delivery_mode {
        out.with_delivery_mode(v);
    }
    if let Some(v) = props.timestamp {
        out.with_timestamp(v);
    }
    if let Some(v) = &props.message_id {
        out.with_message_id(v.as_str().expect("UTF-8"));
    }
    if let Some(v) = &props.correlation_id {
        out.with_correlation_id(v.as_str().expect("UTF-8"));
    }
    if props.headers.is_some() {
        let mut headers = FieldTable::new();
        for (name, value) in header_values(props) {
            let value = match value {
                FieldValue::I32(i) => V::I(i),
                FieldValue::Timestamp(t) => V::T(t),
                FieldValue::LongString(s) => V::S(s.as_str().expect("UTF-8").try_into().expect("a long string")),
                other => panic!("no amqprs header value for {other:?}"),
            };
            let name: FieldName = name.as_str().try_into().expect("a short string");
            headers.insert(name, value);
        }
        out.with_headers(headers);
    }
    out.finish()
}

pub async fn amqprs_connect(addr: &AmqpUrl) -> amqprs::connection::Connection {
    use amqprs::connection::{Connection, OpenConnectionArguments};
    let (host, port) = addr.hosts.first().expect("a host");
    let args = OpenConnectionArguments::new(host, *port, &addr.username, addr.password.expose())
        .virtual_host(&addr.vhost)
        .finish();
    Connection::open(&args).await.expect("amqprs connects")
}

/// The broker's confirms as amqprs hands them over: to a channel callback.
#[derive(Default)]
struct Confirms {
    /// The highest delivery tag confirmed: confirms on one queue come in
    /// order, so it covers every publish before it (as the floor reads it).
    confirmed: AtomicU64,
    nacked: AtomicBool,
    changed: tokio::sync::Notify,
}

struct ConfirmCallback(Arc<Confirms>);

#[async_trait::async_trait]
impl amqprs::callbacks::ChannelCallback for ConfirmCallback {
    async fn close(
        &mut self,
        _: &amqprs::channel::Channel,
        close: amqprs::CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        eprintln!("amqprs: channel closed by the broker: {close}");
        self.0.nacked.store(true, Ordering::Release);
        self.0.changed.notify_one();
        Ok(())
    }

    async fn cancel(&mut self, _: &amqprs::channel::Channel, _: amqprs::Cancel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }

    async fn flow(&mut self, _: &amqprs::channel::Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _: &amqprs::channel::Channel, ack: amqprs::Ack) {
        self.0.confirmed.fetch_max(ack.delivery_tag(), Ordering::AcqRel);
        self.0.changed.notify_one();
    }

    async fn publish_nack(&mut self, _: &amqprs::channel::Channel, _: amqprs::Nack) {
        self.0.nacked.store(true, Ordering::Release);
        self.0.changed.notify_one();
    }

    async fn publish_return(
        &mut self,
        _: &amqprs::channel::Channel,
        _: amqprs::Return,
        _: amqprs::BasicProperties,
        _: Vec<u8>,
    ) {
    }
}

impl Confirms {
    /// Waits until at least `tag` is confirmed.
    async fn until(&self, tag: u64) {
        loop {
            assert!(!self.nacked.load(Ordering::Acquire), "amqprs: nacked or closed");
            if self.confirmed.load(Ordering::Acquire) >= tag {
                return;
            }
            self.changed.notified().await;
        }
    }
}

/// Confirmed publishing as amqprs's API has it: `basic_publish` hands the
/// frames to its writer task, the confirms arrive at a channel callback;
/// publish number `n` waits until `n - WINDOW` is confirmed.
pub async fn amqprs_publish(
    conn: &amqprs::connection::Connection,
    queue: &str,
    messages: u64,
    props: Props,
) -> Figures {
    use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments};
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    let confirms = Arc::new(Confirms::default());
    ch.register_callback(ConfirmCallback(confirms.clone()))
        .await
        .expect("amqprs callback");
    ch.confirm_select(ConfirmSelectArguments::default())
        .await
        .expect("amqprs confirm.select");
    let properties = amqprs_properties(&props.properties());
    let body = vec![b'x'; BODY];
    let args = BasicPublishArguments::new("", queue);
    let (t0, c0) = (Instant::now(), cpu_time());
    for n in 1..=messages {
        if n > WINDOW as u64 {
            confirms.until(n - WINDOW as u64).await;
        }
        ch.basic_publish(properties.clone(), body.clone(), args.clone())
            .await
            .expect("amqprs basic.publish");
    }
    confirms.until(messages).await;
    let figures = Figures::since("amqprs publish", messages, t0, c0);
    ch.close().await.expect("amqprs channel.close");
    figures
}

/// amqprs's consumer as a receiver of messages, every delivery acked on
/// its own.
pub async fn amqprs_consume(conn: &amqprs::connection::Connection, queue: &str, messages: u64) -> Figures {
    use amqprs::channel::{BasicAckArguments, BasicCancelArguments, BasicConsumeArguments, BasicQosArguments};
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    ch.basic_qos(BasicQosArguments::new(0, WINDOW as u16, false))
        .await
        .expect("amqprs basic.qos");
    let (t0, c0) = (Instant::now(), cpu_time());
    let args = BasicConsumeArguments::new(queue, "peers-amqprs")
        .manual_ack(true)
        .finish();
    let (tag, mut rx) = ch.basic_consume_rx(args).await.expect("amqprs basic.consume");
    for _ in 0..messages {
        let message = rx.recv().await.expect("amqprs: the consumer ended");
        let deliver = message.deliver.expect("a basic.deliver");
        ch.basic_ack(BasicAckArguments::new(deliver.delivery_tag(), false))
            .await
            .expect("amqprs ack");
    }
    let figures = Figures::since("amqprs consume", messages, t0, c0);
    ch.basic_cancel(BasicCancelArguments::new(&tag))
        .await
        .expect("amqprs basic.cancel");
    ch.close().await.expect("amqprs channel.close");
    figures
}

pub async fn amqprs_latency(
    conn: &amqprs::connection::Connection,
    queue: &str,
    warmup: usize,
    samples: usize,
) -> Latency {
    use amqprs::channel::BasicQosArguments;
    use amqprs::channel::{BasicAckArguments, BasicCancelArguments, BasicConsumeArguments, BasicPublishArguments};
    let publisher = conn.open_channel(None).await.expect("amqprs channel");
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    ch.basic_qos(BasicQosArguments::new(0, WINDOW as u16, false))
        .await
        .expect("amqprs basic.qos");
    let args = BasicConsumeArguments::new(queue, "peers-amqprs-latency")
        .manual_ack(true)
        .finish();
    let (tag, mut rx) = ch.basic_consume_rx(args).await.expect("amqprs basic.consume");
    let properties = amqprs_properties(&super::minimal_properties());
    let body = vec![b'x'; BODY];
    let publish = BasicPublishArguments::new("", queue);
    let mut sampler = Sampler::new(warmup, samples);
    while sampler.more() {
        let t0 = Instant::now();
        publisher
            .basic_publish(properties.clone(), body.clone(), publish.clone())
            .await
            .expect("amqprs basic.publish");
        let message = rx.recv().await.expect("amqprs: the consumer ended");
        sampler.push(t0.elapsed());
        let deliver = message.deliver.expect("a basic.deliver");
        ch.basic_ack(BasicAckArguments::new(deliver.delivery_tag(), false))
            .await
            .expect("amqprs ack");
    }
    let latency = sampler.finish();
    ch.basic_cancel(BasicCancelArguments::new(&tag))
        .await
        .expect("amqprs basic.cancel");
    ch.close().await.expect("amqprs channel.close");
    publisher.close().await.expect("amqprs channel.close");
    latency
}
