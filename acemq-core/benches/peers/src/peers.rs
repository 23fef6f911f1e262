//! The peers' rows: lapin and amqprs in each scenario, each used as its
//! documentation shows, with the same queue, window, prefetch, bodies and
//! properties as the acemq rows.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use acemq_codec::{BasicProperties, FieldValue};
use acemq_core::amqp::AmqpUrl;

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
/// queue of at most `window` and awaited oldest first. Bodies of `body`
/// bytes.
pub async fn lapin_publish(
    conn: &lapin::Connection,
    queue: &str,
    messages: u64,
    props: Props,
    body: usize,
    window: usize,
) -> Figures {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::{Confirmation, PublisherConfirm};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("lapin confirm.select");
    let properties = lapin_properties(&props.properties());
    let body = vec![b'x'; body];
    let (exchange, routing_key): (lapin::types::ShortString, lapin::types::ShortString) = ("".into(), queue.into());
    let mut in_flight: VecDeque<PublisherConfirm> = VecDeque::with_capacity(window);
    let check = |confirmation: Confirmation| assert!(matches!(confirmation, Confirmation::Ack(None)), "lapin: nacked");
    let (t0, c0) = (Instant::now(), cpu_time());
    for _ in 0..messages {
        if in_flight.len() == window {
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
/// awaited, as lapin's examples do), at prefetch `prefetch`.
pub async fn lapin_consume(conn: &lapin::Connection, queue: &str, messages: u64, prefetch: u16) -> Figures {
    use futures_lite::StreamExt;
    use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.basic_qos(prefetch, BasicQosOptions::default())
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
/// publish number `n` waits until `n - window` is confirmed. Bodies of
/// `body` bytes, a `Vec` each, as its `basic_publish` takes them.
pub async fn amqprs_publish(
    conn: &amqprs::connection::Connection,
    queue: &str,
    messages: u64,
    props: Props,
    body: usize,
    window: usize,
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
    let body = vec![b'x'; body];
    let args = BasicPublishArguments::new("", queue);
    let (t0, c0) = (Instant::now(), cpu_time());
    for n in 1..=messages {
        if n > window as u64 {
            confirms.until(n - window as u64).await;
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
/// its own, at prefetch `prefetch`.
pub async fn amqprs_consume(
    conn: &amqprs::connection::Connection,
    queue: &str,
    messages: u64,
    prefetch: u16,
) -> Figures {
    use amqprs::channel::{BasicAckArguments, BasicCancelArguments, BasicConsumeArguments, BasicQosArguments};
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    ch.basic_qos(BasicQosArguments::new(0, prefetch, false))
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

// ------------------------------------------------ the groups at scale

/// lapin's consumers of many queues on one connection, a channel each (as
/// its documentation has one consumer a channel), every delivery acked on
/// its own (awaited) in a task per consumer; `counts[i]` messages from
/// `queues[i]`, each channel at prefetch `prefetch`.
pub async fn lapin_many_queues(conn: &lapin::Connection, queues: &[String], counts: &[u64], prefetch: u16) -> Figures {
    use futures_lite::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut channels = Vec::with_capacity(queues.len());
    for _ in queues {
        let ch = conn.create_channel().await.expect("lapin channel");
        ch.basic_qos(prefetch, BasicQosOptions::default())
            .await
            .expect("lapin basic.qos");
        channels.push(ch);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (ch, queue)) in channels.iter().zip(queues).enumerate() {
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                format!("peers-lapin-{i}").into(),
                BasicConsumeOptions::default(),
                Default::default(),
            )
            .await
            .expect("lapin basic.consume");
        let count = counts[i];
        tasks.spawn(async move {
            for _ in 0..count {
                let delivery = consumer
                    .next()
                    .await
                    .expect("lapin: the consumer ended")
                    .expect("lapin delivery");
                delivery.ack(BasicAckOptions::default()).await.expect("lapin ack");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a lapin consumer task");
    }
    let figures = Figures::since("lapin many queues", counts.iter().sum(), t0, c0);
    for ch in channels {
        ch.close(200, "bye".into()).await.expect("lapin channel.close");
    }
    figures
}

/// amqprs's consumers of many queues on one connection, a channel each,
/// its receiver API, every delivery acked on its own in a task per
/// consumer.
pub async fn amqprs_many_queues(
    conn: &amqprs::connection::Connection,
    queues: &[String],
    counts: &[u64],
    prefetch: u16,
) -> Figures {
    use amqprs::channel::{BasicAckArguments, BasicConsumeArguments, BasicQosArguments};
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut channels = Vec::with_capacity(queues.len());
    for _ in queues {
        let ch = conn.open_channel(None).await.expect("amqprs channel");
        ch.basic_qos(BasicQosArguments::new(0, prefetch, false))
            .await
            .expect("amqprs basic.qos");
        channels.push(ch);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (ch, queue)) in channels.iter().zip(queues).enumerate() {
        let args = BasicConsumeArguments::new(queue, &format!("peers-amqprs-{i}"))
            .manual_ack(true)
            .finish();
        let (_, mut rx) = ch.basic_consume_rx(args).await.expect("amqprs basic.consume");
        let (ch, count) = (ch.clone(), counts[i]);
        tasks.spawn(async move {
            for _ in 0..count {
                let message = rx.recv().await.expect("amqprs: the consumer ended");
                let deliver = message.deliver.expect("a basic.deliver");
                ch.basic_ack(BasicAckArguments::new(deliver.delivery_tag(), false))
                    .await
                    .expect("amqprs ack");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("an amqprs consumer task");
    }
    let figures = Figures::since("amqprs many queues", counts.iter().sum(), t0, c0);
    for ch in channels {
        ch.close().await.expect("amqprs channel.close");
    }
    figures
}

/// lapin from `tasks` tasks sharing one channel in confirm mode, each
/// awaiting `basic_publish` and then its `PublisherConfirm`, as lapin's
/// documentation publishes.
pub async fn lapin_tasks(conn: &lapin::Connection, queue: &str, messages: u64, tasks: u64) -> Figures {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("lapin confirm.select");
    let properties = lapin_properties(&Props::Envelope.properties());
    let body: Arc<[u8]> = vec![b'x'; BODY].into();
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (ch, properties, body) = (ch.clone(), properties.clone(), body.clone());
        let routing_key: lapin::types::ShortString = queue.into();
        let share = messages / tasks + u64::from(task < messages % tasks);
        set.spawn(async move {
            for _ in 0..share {
                let confirm = ch
                    .basic_publish(
                        "".into(),
                        routing_key.clone(),
                        BasicPublishOptions::default(),
                        &body,
                        properties.clone(),
                    )
                    .await
                    .expect("lapin basic.publish")
                    .await
                    .expect("lapin confirm");
                assert!(matches!(confirm, lapin::Confirmation::Ack(None)), "lapin: nacked");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("a lapin publishing task");
    }
    let figures = Figures::since("lapin tasks", messages, t0, c0);
    ch.close(200, "bye".into()).await.expect("lapin channel.close");
    figures
}

/// The broker's confirms of one channel for many waiters: the highest tag
/// confirmed (confirms on one queue come in order), watched.
struct WatchedConfirms {
    confirmed: tokio::sync::watch::Sender<u64>,
    nacked: AtomicBool,
}

struct WatchCallback(Arc<WatchedConfirms>);

#[async_trait::async_trait]
impl amqprs::callbacks::ChannelCallback for WatchCallback {
    async fn close(
        &mut self,
        _: &amqprs::channel::Channel,
        close: amqprs::CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        eprintln!("amqprs: channel closed by the broker: {close}");
        self.0.nacked.store(true, Ordering::Release);
        self.0.confirmed.send_modify(|_| {});
        Ok(())
    }

    async fn cancel(&mut self, _: &amqprs::channel::Channel, _: amqprs::Cancel) -> Result<(), amqprs::error::Error> {
        Ok(())
    }

    async fn flow(&mut self, _: &amqprs::channel::Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _: &amqprs::channel::Channel, ack: amqprs::Ack) {
        self.0.confirmed.send_modify(|c| *c = (*c).max(ack.delivery_tag()));
    }

    async fn publish_nack(&mut self, _: &amqprs::channel::Channel, _: amqprs::Nack) {
        self.0.nacked.store(true, Ordering::Release);
        self.0.confirmed.send_modify(|_| {});
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

/// amqprs from `tasks` tasks sharing one channel in confirm mode. Its
/// `basic_publish` returns no tag and its confirms come to a channel
/// callback (its documented confirm API), so each task publishes under a
/// lock that numbers the publishes in the order the channel sends them,
/// then waits for the callback's confirmed tag to reach its number.
pub async fn amqprs_tasks(conn: &amqprs::connection::Connection, queue: &str, messages: u64, tasks: u64) -> Figures {
    use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments};
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    let confirms = Arc::new(WatchedConfirms {
        confirmed: tokio::sync::watch::channel(0).0,
        nacked: AtomicBool::new(false),
    });
    ch.register_callback(WatchCallback(confirms.clone()))
        .await
        .expect("amqprs callback");
    ch.confirm_select(ConfirmSelectArguments::default())
        .await
        .expect("amqprs confirm.select");
    let properties = amqprs_properties(&Props::Envelope.properties());
    let args = BasicPublishArguments::new("", queue);
    let numbered = Arc::new(tokio::sync::Mutex::new(0u64));
    let (t0, c0) = (Instant::now(), cpu_time());
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (ch, properties, args) = (ch.clone(), properties.clone(), args.clone());
        let (confirms, numbered) = (confirms.clone(), numbered.clone());
        let share = messages / tasks + u64::from(task < messages % tasks);
        set.spawn(async move {
            let mut confirmed = confirms.confirmed.subscribe();
            for _ in 0..share {
                let tag = {
                    let mut last = numbered.lock().await;
                    ch.basic_publish(properties.clone(), vec![b'x'; BODY], args.clone())
                        .await
                        .expect("amqprs basic.publish");
                    *last += 1;
                    *last
                };
                confirmed
                    .wait_for(|&c| c >= tag || confirms.nacked.load(Ordering::Acquire))
                    .await
                    .expect("amqprs confirms");
                assert!(!confirms.nacked.load(Ordering::Acquire), "amqprs: nacked or closed");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("an amqprs publishing task");
    }
    let figures = Figures::since("amqprs tasks", messages, t0, c0);
    ch.close().await.expect("amqprs channel.close");
    figures
}

/// `n` lapin connections, opened one after the other.
pub async fn lapin_connections(addr: &AmqpUrl, n: usize) -> Vec<lapin::Connection> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(lapin_connect(addr).await);
    }
    all
}

pub async fn lapin_close_all(all: Vec<lapin::Connection>) {
    for conn in all {
        lapin_close(&conn).await;
    }
}

/// `n` amqprs connections, opened one after the other.
pub async fn amqprs_connections(addr: &AmqpUrl, n: usize) -> Vec<amqprs::connection::Connection> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(amqprs_connect(addr).await);
    }
    all
}

pub async fn amqprs_close_all(all: Vec<amqprs::connection::Connection>) {
    for conn in all {
        conn.close().await.expect("amqprs closes");
    }
}

/// `n` idle lapin consumers of `queue` on `conn`, a channel each.
pub async fn lapin_consumers(
    conn: &lapin::Connection,
    queue: &str,
    n: usize,
) -> Vec<(lapin::Channel, lapin::Consumer)> {
    use lapin::options::BasicConsumeOptions;
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let ch = conn.create_channel().await.expect("lapin channel");
        let consumer = ch
            .basic_consume(
                queue.into(),
                format!("peers-lapin-idle-{i}").into(),
                BasicConsumeOptions::default(),
                Default::default(),
            )
            .await
            .expect("lapin basic.consume");
        all.push((ch, consumer));
    }
    all
}

pub async fn lapin_close_consumers(all: Vec<(lapin::Channel, lapin::Consumer)>) {
    for (ch, consumer) in all {
        drop(consumer);
        ch.close(200, "bye".into()).await.expect("lapin channel.close");
    }
}

/// `n` idle amqprs consumers of `queue` on `conn`, a channel each.
pub async fn amqprs_consumers(
    conn: &amqprs::connection::Connection,
    queue: &str,
    n: usize,
) -> Vec<(
    amqprs::channel::Channel,
    tokio::sync::mpsc::UnboundedReceiver<amqprs::channel::ConsumerMessage>,
)> {
    use amqprs::channel::BasicConsumeArguments;
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let ch = conn.open_channel(None).await.expect("amqprs channel");
        let args = BasicConsumeArguments::new(queue, &format!("peers-amqprs-idle-{i}"))
            .manual_ack(true)
            .finish();
        let (_, rx) = ch.basic_consume_rx(args).await.expect("amqprs basic.consume");
        all.push((ch, rx));
    }
    all
}

pub async fn amqprs_close_consumers(
    all: Vec<(
        amqprs::channel::Channel,
        tokio::sync::mpsc::UnboundedReceiver<amqprs::channel::ConsumerMessage>,
    )>,
) {
    for (ch, rx) in all {
        drop(rx);
        ch.close().await.expect("amqprs channel.close");
    }
}

/// lapin holding `n` deliveries of `queue` unacked (prefetch `n`); the
/// channel and the deliveries, to release with [`lapin_release`].
pub async fn lapin_hold(
    conn: &lapin::Connection,
    queue: &str,
    n: usize,
) -> (lapin::Channel, Vec<lapin::message::Delivery>) {
    use futures_lite::StreamExt;
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.basic_qos(n as u16, BasicQosOptions::default())
        .await
        .expect("lapin basic.qos");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "peers-lapin-hold".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await
        .expect("lapin basic.consume");
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        held.push(
            consumer
                .next()
                .await
                .expect("lapin: the consumer ended")
                .expect("lapin delivery"),
        );
    }
    (ch, held)
}

/// Acks what [`lapin_hold`] holds (one ack with `multiple`) and closes its
/// channel.
pub async fn lapin_release((ch, held): (lapin::Channel, Vec<lapin::message::Delivery>)) {
    use lapin::options::BasicAckOptions;
    let last = held.last().expect("held deliveries").delivery_tag;
    ch.basic_ack(last, BasicAckOptions { multiple: true })
        .await
        .expect("lapin ack");
    drop(held);
    ch.close(200, "bye".into()).await.expect("lapin channel.close");
}

/// amqprs holding `n` deliveries of `queue` unacked (prefetch `n`).
pub async fn amqprs_hold(
    conn: &amqprs::connection::Connection,
    queue: &str,
    n: usize,
) -> (amqprs::channel::Channel, Vec<amqprs::channel::ConsumerMessage>) {
    use amqprs::channel::{BasicConsumeArguments, BasicQosArguments};
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    ch.basic_qos(BasicQosArguments::new(0, n as u16, false))
        .await
        .expect("amqprs basic.qos");
    let args = BasicConsumeArguments::new(queue, "peers-amqprs-hold")
        .manual_ack(true)
        .finish();
    let (_, mut rx) = ch.basic_consume_rx(args).await.expect("amqprs basic.consume");
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        held.push(rx.recv().await.expect("amqprs: the consumer ended"));
    }
    (ch, held)
}

/// Acks what [`amqprs_hold`] holds and closes its channel.
pub async fn amqprs_release((ch, held): (amqprs::channel::Channel, Vec<amqprs::channel::ConsumerMessage>)) {
    use amqprs::channel::BasicAckArguments;
    let last = held
        .last()
        .and_then(|m| m.deliver.as_ref())
        .expect("held deliveries")
        .delivery_tag();
    ch.basic_ack(BasicAckArguments::new(last, true))
        .await
        .expect("amqprs ack");
    drop(held);
    ch.close().await.expect("amqprs channel.close");
}

/// lapin's set-up: connect, open a channel, `confirm.select`; how long
/// it took (the close after it is not timed).
pub async fn lapin_setup(addr: &AmqpUrl) -> std::time::Duration {
    use lapin::options::ConfirmSelectOptions;
    let t0 = Instant::now();
    let conn = lapin_connect(addr).await;
    let ch = conn.create_channel().await.expect("lapin channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("lapin confirm.select");
    let took = t0.elapsed();
    lapin_close(&conn).await;
    took
}

/// amqprs's set-up, as [`lapin_setup`].
pub async fn amqprs_setup(addr: &AmqpUrl) -> std::time::Duration {
    use amqprs::channel::ConfirmSelectArguments;
    let t0 = Instant::now();
    let conn = amqprs_connect(addr).await;
    let ch = conn.open_channel(None).await.expect("amqprs channel");
    ch.confirm_select(ConfirmSelectArguments::default())
        .await
        .expect("amqprs confirm.select");
    let took = t0.elapsed();
    drop(ch);
    conn.close().await.expect("amqprs closes");
    took
}
