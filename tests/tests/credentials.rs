//! Credentials: `connection.update-secret` (the low-level
//! `Connection::update_secret` and `Conn::update_secret` on both of a
//! `Conn`'s connections), a credentials provider asked before every dial
//! and on a schedule, recovery after the old password stopped working, and
//! no password in any error or `Debug` (a property test over URL shapes).
//! On acemq-memory and RabbitMQ 3.10 and 4.0.
//!
//! Each password-changing scenario has a user of its own: on RabbitMQ one
//! made with `rabbitmqctl add_user` and deleted at the end (also when the
//! scenario fails), on acemq-memory a broker of its own with that user,
//! whose password [`acemq_memory::Faults::change_password`] changes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::QueueDeclare;
use acemq_core::amqp::{self, AmqpUrl, Credentials, CredentialsError, CredentialsProvider, Secret};
use acemq_core::{Config, Conn, Error, RecoveryEvent};
use acemq_tests::chaos;
use acemq_tests::{brokers, deadline, unique, Broker, RabbitVersion, RecoveryLog};
use proptest::prelude::*;
use tokio::time::Instant;

/// A user of one scenario: made on the broker, its password changed there,
/// deleted when dropped.
struct TestUser {
    name: String,
    /// The URL to reach the broker as this user, with `password` in it.
    host_url: String,
    memory: Option<acemq_memory::Broker>,
    memory_name: Option<String>,
    rabbit: Option<RabbitVersion>,
}

impl TestUser {
    async fn create(b: &Broker, password: &str) -> TestUser {
        let name = unique("acemq-creds-user");
        match b.version() {
            None => {
                let broker_name = unique("creds");
                let user = acemq_memory::User::new(name.clone(), password);
                let memory = acemq_memory::Broker::named_with(&broker_name, || {
                    acemq_memory::BrokerConfig::for_version(acemq_memory::RabbitMqVersion::V3_10).with_user(user)
                });
                TestUser {
                    host_url: format!("memory://{broker_name}/"),
                    name,
                    memory: Some(memory),
                    memory_name: Some(broker_name),
                    rabbit: None,
                }
            }
            Some(version) => {
                chaos::ctl(version, &["add_user", &name, password]).await;
                chaos::ctl(version, &["set_permissions", "-p", "/", &name, ".*", ".*", ".*"]).await;
                let parsed: AmqpUrl = b.url.parse().unwrap();
                let (host, port) = &parsed.hosts[0];
                TestUser {
                    host_url: format!("amqp://{host}:{port}/"),
                    name,
                    memory: None,
                    memory_name: None,
                    rabbit: Some(version),
                }
            }
        }
    }

    /// `amqp://NAME:PASSWORD@host:port/` (or `memory://` without credentials
    /// checked by the URL: the provider or the URL gives them).
    fn url(&self, password: &str) -> String {
        match &self.memory_name {
            Some(_) => self
                .host_url
                .clone()
                .replacen("memory://", &format!("memory://{}:{password}@", self.name), 1),
            None => self
                .host_url
                .replacen("amqp://", &format!("amqp://{}:{password}@", self.name), 1),
        }
    }

    /// As `rabbitmqctl change_password` does: open connections stay, the
    /// next login needs the new one.
    async fn change_password(&self, password: &str) {
        match (&self.memory, self.rabbit) {
            (Some(memory), _) => assert!(memory.faults().change_password(&self.name, password)),
            (None, Some(version)) => {
                chaos::ctl(version, &["change_password", &self.name, password]).await;
            }
            _ => unreachable!("a user is on one broker"),
        }
    }

    /// Closes every connection of this user from the broker's side (320):
    /// both of a `Conn`'s. RabbitMQ lists a connection a moment after it is
    /// open, so this waits (at most 15 s) until both are listed, lest one
    /// stay open and never need recovering.
    async fn force_close(&self) {
        match (&self.memory, self.rabbit) {
            (Some(memory), _) => memory.faults().close_all("closed by the acemq credentials suite"),
            (None, Some(version)) => {
                let name = self.name.as_str();
                chaos::close_when_listed(version, "user", 2, "closed by the acemq credentials suite", |line| {
                    line.split_whitespace().nth(1) == Some(name)
                })
                .await;
            }
            _ => unreachable!("a user is on one broker"),
        }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if let Some(version) = self.rabbit {
            acemq_tests::rabbitmqctl(version, &["delete_user", &self.name]);
        }
        if let Some(name) = &self.memory_name {
            acemq_memory::Broker::forget_named(name);
        }
    }
}

/// A provider that gives whatever `current` holds and counts its calls.
#[derive(Clone)]
struct Provider {
    current: Arc<Mutex<Result<String, String>>>,
    calls: Arc<AtomicUsize>,
}

impl Provider {
    fn new(secret: &str) -> Provider {
        Provider {
            current: Arc::new(Mutex::new(Ok(secret.to_string()))),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn set(&self, secret: Result<&str, &str>) {
        *self.current.lock().unwrap() = secret.map(str::to_string).map_err(str::to_string);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn arc(&self) -> Arc<dyn CredentialsProvider> {
        let this = self.clone();
        Arc::new(move || {
            let this = this.clone();
            async move {
                this.calls.fetch_add(1, Ordering::SeqCst);
                // A token fetch takes I/O: the dial waits for it.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let current = this.current.lock().unwrap().clone();
                current.map(Credentials::new).map_err(CredentialsError)
            }
        })
    }
}

/// How long a recovery may take here.
const MINUTE: Duration = Duration::from_secs(60);

/// `config` reporting to `events`, redialling quickly.
fn quick(events: &RecoveryLog, config: Config) -> Config {
    let mut config = events.config(config);
    config.recovery_delay_max = Duration::from_millis(200);
    config.engine.connection_timeout = Duration::from_secs(10);
    config
}

/// A confirmed publish into a queue of its own works on `conn`.
async fn publishes(conn: &Conn, what: &str) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let q = unique("creds-q");
    ch.queue_declare(QueueDeclare {
        queue: q.as_str().into(),
        auto_delete: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: declare: {e}"));
    conn.publisher::<u32>("", &q)
        .send(&7)
        .await
        .unwrap_or_else(|e| panic!("{what}: publish: {e}"));
    let _ = ch.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn update_secret_is_answered_on_both_connections_and_on_a_low_level_connection() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            conn.update_secret("guest")
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            publishes(&conn, &format!("{:?} after update-secret", b.kind)).await;
            // Again and again: each gets its own answer.
            for _ in 0..3 {
                conn.update_secret(Secret::new("guest")).await.unwrap();
            }
            assert!(conn.is_connected());
            conn.close().await.unwrap();

            let low = b.connect().await;
            let (a, c) = tokio::join!(
                low.update_secret(Secret::new("guest"), "first"),
                low.update_secret(Secret::new("guest"), "second")
            );
            a.unwrap();
            c.unwrap();
            assert!(!low.is_closed());
            low.close().await.unwrap();
            // On a closed connection it fails at once.
            assert!(matches!(
                low.update_secret(Secret::new("guest"), "late").await,
                Err(amqp::Error::ConnectionClosed(_))
            ));
        }
    })
    .await
}

/// RabbitMQ's internal backend hands the new secret to no one (its
/// credentials never expire): any secret is accepted on an authenticated
/// connection and checked by nobody; acemq-memory does the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_secret_is_accepted_unchecked_as_by_the_internal_backend() {
    deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            conn.update_secret(Secret::new("not-the-password"), "wrong on purpose")
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            let ch = conn.channel().await.unwrap();
            ch.queue_declare(QueueDeclare {
                exclusive: true,
                ..Default::default()
            })
            .await
            .unwrap();
            assert!(!conn.is_closed(), "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_after_a_password_change_dials_with_the_providers_current_secret() {
    deadline(async {
        for b in brokers().await {
            let user = TestUser::create(&b, "first-password").await;
            let provider = Provider::new("first-password");
            let events = RecoveryLog::default();
            // The URL's password is wrong: only the provider's is used.
            let config = quick(&events, Config::default().with_credentials(provider.arc()));
            let conn = Conn::open(&user.url("not-used"), config)
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            assert_eq!(provider.calls(), 2, "{:?}: asked before each of the two dials", b.kind);
            publishes(&conn, "before the change").await;

            user.change_password("second-password").await;
            // The old password no longer logs in.
            let refused = amqp::Connection::open(&user.url("first-password"), amqp::Config::default()).await;
            assert!(
                matches!(&refused, Err(e) if e.reply_code() == Some(403)),
                "{:?}: {refused:?}",
                b.kind
            );
            provider.set(Ok("second-password"));
            let asked_before = provider.calls();
            user.force_close().await;
            events
                .wait(&format!("{:?}: both connections recovered", b.kind), MINUTE, |_| {
                    events.recovered_on("publish") >= 1 && events.recovered_on("consume") >= 1
                })
                .await;
            assert!(
                provider.calls() >= asked_before + 2,
                "{:?}: the provider is asked again before each redial ({} then {})",
                b.kind,
                asked_before,
                provider.calls()
            );
            publishes(&conn, "after the recovery").await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_redials_with_the_secret_last_given_to_update_secret() {
    deadline(async {
        for b in brokers().await {
            let user = TestUser::create(&b, "old-password").await;
            let events = RecoveryLog::default();
            let conn = Conn::open(&user.url("old-password"), quick(&events, Config::default()))
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            user.change_password("new-password").await;
            conn.update_secret("new-password").await.unwrap();
            user.force_close().await;
            events
                .wait("both connections recovered", MINUTE, |_| {
                    events.recovered_on("publish") >= 1 && events.recovered_on("consume") >= 1
                })
                .await;
            publishes(&conn, &format!("{:?} after the recovery", b.kind)).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A provider that fails: the first dial fails with its typed error; a
/// recovery retries with backoff until it gives credentials again.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_provider_fails_the_dial_and_recovery_retries_until_it_answers() {
    deadline(async {
        for b in brokers().await {
            let user = TestUser::create(&b, "pw-one").await;
            let provider = Provider::new("pw-one");
            provider.set(Err("the identity provider is down"));
            let events = RecoveryLog::default();
            let config = quick(&events, Config::default().with_credentials(provider.arc()));
            let err = Conn::open(&user.url("x"), config.clone()).await.unwrap_err();
            assert!(
                matches!(&err, Error::Engine(amqp::Error::Credentials(CredentialsError(why))) if why == "the identity provider is down"),
                "{:?}: {err:?}",
                b.kind
            );

            provider.set(Ok("pw-one"));
            let conn = Conn::open(&user.url("x"), config).await.unwrap();
            provider.set(Err("the identity provider is down"));
            user.force_close().await;
            events
                .wait("a retry after the provider failed", MINUTE, |e| {
                    e.iter().any(|e| matches!(e, RecoveryEvent::Retrying { error, attempt, .. } if *attempt >= 2 && error.contains("identity provider is down")))
                })
                .await;
            assert!(!conn.is_connected());
            provider.set(Ok("pw-one"));
            events
                .wait("both connections recovered", MINUTE, |_| {
                    events.recovered_on("publish") >= 1 && events.recovered_on("consume") >= 1
                })
                .await;
            publishes(&conn, &format!("{:?} after the provider came back", b.kind)).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_refresh_asks_the_provider_on_schedule_and_keeps_both_connections() {
    deadline(async {
        for b in brokers().await {
            let provider = Provider::new("guest");
            let config = Config::default()
                .with_credentials(provider.arc())
                .with_credentials_refresh(Duration::from_millis(100));
            let conn = b.conn_with(config).await;
            assert_eq!(provider.calls(), 2);
            let until = Instant::now() + Duration::from_secs(20);
            while provider.calls() < 6 {
                assert!(Instant::now() < until, "{:?}: {} calls", b.kind, provider.calls());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(conn.is_connected());
            publishes(&conn, &format!("{:?} after refreshes", b.kind)).await;
            conn.close().await.unwrap();
            // Closed: the schedule stops.
            let after_close = provider.calls();
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert!(
                provider.calls() <= after_close + 1,
                "{:?}: the refresh stops with the Conn",
                b.kind
            );

            let without_provider = Config::default().with_credentials_refresh(Duration::from_secs(1));
            let err = Conn::open(&b.url, without_provider).await.unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err:?}");
        }
    })
    .await
}

/// A refused login names no part of the password, nor does anything the
/// failed dial says.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_login_and_its_debug_name_no_password() {
    deadline(async {
        for b in brokers().await {
            let user = TestUser::create(&b, "right-pw").await;
            let secret = "Wr0ng-Secret-7731";
            for url in [user.url(secret), user.url(&format!("{secret}%zz"))] {
                let err = Conn::open(&url, Config::default()).await.unwrap_err();
                let shown = format!("{err} {err:?}");
                assert!(!shown.contains("Wr0ng-Secret"), "{:?}: {shown}", b.kind);
            }
            let provider = Provider::new(secret);
            let config = Config::default().with_credentials(provider.arc());
            assert!(!format!("{config:?}").contains(secret));
            let err = Conn::open(&user.url("x"), config).await.unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("Wr0ng-Secret"), "{:?}: {shown}", b.kind);
            let credentials = Credentials::new(secret).with_username("u");
            assert!(!format!("{credentials:?}").contains(secret));
        }
    })
    .await
}

// ----------------------------------------------------------- the property ---

/// Characters a password may have, the URL's delimiters among them.
fn password() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            8 => proptest::char::range('a', 'z'),
            2 => proptest::char::range('A', 'Z'),
            2 => proptest::char::range('0', '9'),
            3 => proptest::sample::select(vec!['%', '/', '?', '@', ':', '#', '[', ']', ',', '&', '=', '-', '.', ' ', 'é']),
        ],
        4..20,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// Percent-encodes every byte that is not an unreserved character.
fn escaped(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A URL around `pw`, by `shape`: well formed and broken in the places a
/// user gets wrong (the password unescaped, a bad escape, a forgotten `@` or
/// scheme, a bad port, option or vhost beside a good password).
fn url_around(shape: u8, pw: &str, raw: bool) -> String {
    let p = if raw { pw.to_string() } else { escaped(pw) };
    match shape % 12 {
        0 => format!("amqp://user:{p}@broker.example:5672/vh"),
        1 => format!("amqps://user:{p}@broker.example/"),
        2 => format!("amqp://user:{p}@broker.example:notaport/"),
        3 => format!("amqp://user:{p}@broker.example/a/b"),
        4 => format!("amqp://user:{p}@broker.example/?heartbeat=soon"),
        5 => format!("amqp://user:{p}@broker.example/?bogus_option=1"),
        // A forgotten `@host`: with an unescaped `@` in the password this
        // is a URL with a host, which no parser can tell apart.
        6 => format!("amqp://user:{}x/", escaped(pw)),
        7 => format!("user:{p}@broker.example"),
        8 => format!("amqq://user:{p}@broker.example"),
        9 => format!("amqp://user:{p}%@broker.example/"),
        10 => format!("amqp://user:{p}@[::1/"),
        _ => format!("amqp://user:{p}@h1,h2:99999/?auth_mechanism=kerberos"),
    }
}

/// What acemq shows of `url`: the parse error's text and `Debug`, or the
/// parsed URL's `Display` and `Debug` and those of the error a dial with
/// TLS settings gives it as `amqp://` (refused before the network).
fn shown(url: &str) -> Vec<String> {
    match url.parse::<AmqpUrl>() {
        Err(err) => vec![err.to_string(), format!("{err:?}")],
        Ok(parsed) => {
            let mut config = amqp::Config::default();
            config.tls = amqp::TlsConfig::new().with_server_name("broker.example");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let plain = parsed.to_string().replacen("amqps://", "amqp://", 1);
            let mut plain: AmqpUrl = plain.parse().unwrap();
            plain.password = parsed.password.clone();
            let err = runtime
                .block_on(amqp::Connection::open_url(&plain, config))
                .unwrap_err();
            assert!(matches!(err, amqp::Error::NotTls { .. }), "{err:?}");
            vec![
                parsed.to_string(),
                format!("{parsed:?}"),
                err.to_string(),
                format!("{err:?}"),
            ]
        }
    }
}

/// Everything acemq says about URLs whatever their password: the texts
/// [`shown`] gives for every shape, escaped and raw, around passwords of
/// none of the characters [`password`] draws from. A piece of a password
/// found in one of these is a word of the messages, not a leak.
fn vocabulary() -> &'static str {
    static VOCABULARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VOCABULARY.get_or_init(|| {
        let mut all = String::new();
        for reference in ["QXQXQXQX", "QX%QX/QX@Q", "QX%zQX?Q#X"] {
            for shape in 0..12 {
                for raw in [false, true] {
                    for text in shown(&url_around(shape, reference, raw)) {
                        all.push_str(&text);
                        all.push('\n');
                    }
                }
            }
        }
        all
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the password and the URL's shape, parsing either succeeds
    /// with the password in its place, or fails with an error whose text
    /// and `Debug` hold no part of it as long as four characters; the
    /// parsed URL's `Display` and `Debug` hold none either, nor does a dial
    /// that refuses it before the network (TLS settings with `amqp://`).
    /// (A piece that is also elsewhere in the URL, or a word of acemq's
    /// messages about URLs, tells nothing and is not looked for.)
    #[test]
    fn no_error_or_debug_shows_a_password(pw in password(), shape in 0u8..12, raw in any::<bool>()) {
        let url = url_around(shape, &pw, raw);
        let p = if raw && shape % 12 != 6 { pw.clone() } else { escaped(&pw) };
        let rest = url.replacen(&p, "", 1);
        // Only a password that is not also elsewhere in the URL tells
        // whether an error quoted the password.
        prop_assume!(!rest.contains(&pw) && !rest.contains(&p));
        let pieces: Vec<String> = {
            let chars: Vec<char> = pw.chars().collect();
            (0..chars.len().saturating_sub(3))
                .map(|i| chars[i..i + 4].iter().collect::<String>())
                .filter(|piece| !rest.contains(piece.as_str()) && !vocabulary().contains(piece.as_str()))
                .collect()
        };
        for text in shown(&url) {
            let leak = pieces.iter().find(|piece| text.contains(piece.as_str()));
            prop_assert!(leak.is_none(), "{url:?} shows {leak:?}: {text}");
        }
        // Escaped, the password comes back whole; unescaped, a `%` and two
        // hex digits in it are an escape.
        if let (Ok(parsed), false) = (url.parse::<AmqpUrl>(), raw) {
            prop_assert_eq!(parsed.password.expose(), pw.as_str(), "{:?}", url);
        }
    }
}

// ------------------------------------------- a broker with expiring tokens ---

/// A fake broker that behaves like RabbitMQ's OAuth 2 backend for
/// `update-secret`: `accept` is the one token it takes (`update-secret-ok`);
/// any other closes the connection with 530, as RabbitMQ does; `silent`
/// answers nothing. Every login's password and every secret it is sent go
/// to the returned receiver, in order.
async fn token_broker(accept: &'static str, silent: bool) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use acemq_codec::*;
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("amqp://app:initial@{}/", listener.local_addr().unwrap());
    let (seen, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut accepted = 0u32;
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted += 1;
            let id = accepted;
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::new();
                let decoder = FrameDecoder::new(131_072);
                let mut header = [0u8; 8];
                if stream.read_exact(&mut header).await.is_err() {
                    return;
                }
                let mut out = BytesMut::new();
                let start = ConnectionStart {
                    version_major: 0,
                    version_minor: 9,
                    mechanisms: "PLAIN".into(),
                    locales: "en_US".into(),
                    ..Default::default()
                };
                Frame::Method(0, start.into()).encode(&mut out).unwrap();
                stream.write_all(&out).await.unwrap();
                loop {
                    let frame = loop {
                        if let Some(frame) = decoder.decode(&mut buf).unwrap() {
                            break frame;
                        }
                        match stream.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    };
                    let reply: Option<Method> = match frame {
                        Frame::Method(0, Method::ConnectionStartOk(ok)) => {
                            let response = ok.response.as_bytes().to_vec();
                            let password = response.rsplit(|b| *b == 0).next().unwrap_or_default();
                            let _ = seen.send(format!("login:{}", String::from_utf8_lossy(password)));
                            Some(
                                ConnectionTune {
                                    channel_max: 16,
                                    frame_max: 131_072,
                                    heartbeat: 0,
                                }
                                .into(),
                            )
                        }
                        Frame::Method(0, Method::ConnectionOpen(_)) => Some(ConnectionOpenOk::default().into()),
                        Frame::Method(0, Method::ConnectionUpdateSecret(m)) => {
                            let secret = String::from_utf8_lossy(m.new_secret.as_bytes()).into_owned();
                            let _ = seen.send(format!("update:{secret}"));
                            let _ = seen.send(format!("on:{id}"));
                            match (silent, secret == accept) {
                                (true, _) => None,
                                (false, true) => Some(ConnectionUpdateSecretOk {}.into()),
                                (false, false) => Some(
                                    ConnectionClose {
                                        reply_code: 530,
                                        reply_text: "NOT_ALLOWED - New secret was refused by one of the backends"
                                            .into(),
                                        class_id: 10,
                                        method_id: 70,
                                    }
                                    .into(),
                                ),
                            }
                        }
                        Frame::Method(0, Method::ConnectionClose(_)) => Some(ConnectionCloseOk {}.into()),
                        Frame::Method(ch, m @ (Method::ChannelOpen(_) | Method::ConfirmSelect(_))) if ch > 0 => {
                            let ok: Method = match m {
                                Method::ChannelOpen(_) => ChannelOpenOk::default().into(),
                                _ => ConfirmSelectOk {}.into(),
                            };
                            let mut out = BytesMut::new();
                            Frame::Method(ch, ok).encode(&mut out).unwrap();
                            stream.write_all(&out).await.unwrap();
                            None
                        }
                        _ => None,
                    };
                    if let Some(method) = reply {
                        let mut out = BytesMut::new();
                        Frame::Method(0, method).encode(&mut out).unwrap();
                        if stream.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, rx)
}

/// Like RabbitMQ's OAuth 2 backend: the token it takes is answered, a
/// refused one closes the connection with 530 and the call says so; a
/// broker that never answers fails the call after `call_timeout`, and the
/// connection goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_secret_is_a_530_close_and_an_unanswered_one_times_out() {
    deadline(async {
        let (url, mut seen) = token_broker("good-token", false).await;
        let provider = Provider::new("first-token");
        let config = amqp::Config::default()
            .with_credentials(provider.arc())
            .with_call_timeout(Duration::from_millis(300));
        let conn = amqp::Connection::open(&url, config.clone()).await.unwrap();
        assert_eq!(
            seen.recv().await.unwrap(),
            "login:first-token",
            "the provider's secret logs in"
        );
        conn.update_secret(Secret::new("good-token"), "refresh").await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), "update:good-token");
        assert_eq!(seen.recv().await.unwrap(), "on:1");
        let err = conn
            .update_secret(Secret::new("expired-token"), "refresh")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, amqp::Error::ConnectionClosed(amqp::CloseReason::ByServer(r)) if r.code == 530),
            "{err:?}"
        );
        assert!(!err.to_string().contains("expired-token"), "{err}");
        assert!(conn.is_closed());

        let (url, _seen) = token_broker("good-token", true).await;
        let conn = amqp::Connection::open(&url, config).await.unwrap();
        let started = Instant::now();
        let err = conn
            .update_secret(Secret::new("good-token"), "refresh")
            .await
            .unwrap_err();
        assert!(matches!(err, amqp::Error::NoReply { .. }), "{err:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert!(
            !conn.is_closed(),
            "an unanswered update-secret leaves the connection up"
        );
        conn.channel().await.unwrap();
        conn.close().await.unwrap();
    })
    .await
}

async fn next_line(seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("the fake broker reports within 10 s")
        .expect("the fake broker is alive")
}

/// The schedule sends the provider's secret on both of the `Conn`'s
/// connections: the broker sees each secret twice, once per connection.
#[tokio::test(flavor = "multi_thread")]
async fn the_refresh_sends_each_fresh_secret_on_both_connections() {
    deadline(async {
        let (url, mut seen) = token_broker("token-2", false).await;
        let provider = Provider::new("token-1");
        let config = Config::default()
            .with_credentials(provider.arc())
            .with_credentials_refresh(Duration::from_millis(200));
        let conn = Conn::open(&url, config).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), "login:token-1");
        assert_eq!(seen.recv().await.unwrap(), "login:token-1");
        provider.set(Ok("token-2"));
        let mut on = std::collections::BTreeMap::<String, u32>::new();
        while on.len() < 2 || on.values().any(|n| *n < 2) {
            let update = next_line(&mut seen).await;
            let connection = next_line(&mut seen).await;
            if update == "update:token-1" {
                continue; // sent before the provider changed
            }
            assert_eq!(update, "update:token-2");
            *on.entry(connection).or_default() += 1;
        }
        assert_eq!(on.len(), 2, "{on:?}");
        assert!(conn.is_connected());
        conn.close().await.unwrap();
    })
    .await
}

/// A call the broker's close fails says the connection is closed, and
/// `is_closed` agrees the moment the call returns (the failure was once
/// routed before the connection was marked closed). A race, so tried many
/// times.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_failed_by_the_brokers_close_finds_the_connection_closed() {
    deadline(async {
        let config = amqp::Config::default().with_credentials(Provider::new("first-token").arc());
        for round in 0..200 {
            let (url, _seen) = token_broker("good-token", false).await;
            let conn = amqp::Connection::open(&url, config.clone()).await.unwrap();
            let err = conn
                .update_secret(Secret::new("expired-token"), "refresh")
                .await
                .unwrap_err();
            assert!(
                matches!(&err, amqp::Error::ConnectionClosed(_)),
                "round {round}: {err:?}"
            );
            assert!(conn.is_closed(), "round {round}: {err} yet not closed");
            assert!(conn.close_reason().is_some(), "round {round}");
        }
    })
    .await
}

/// The old password stopped working and a recovery is already redialling
/// with it, refused each time: `update_secret` in the middle of it gives the
/// redials the new one, waits for both connections to be back, and then
/// sends it on them.
#[tokio::test(flavor = "multi_thread")]
async fn update_secret_in_the_middle_of_a_recovery_unblocks_it() {
    deadline(async {
        for b in brokers().await {
            let user = TestUser::create(&b, "before-pw").await;
            let events = RecoveryLog::default();
            let mut config = quick(&events, Config::default());
            config.publish_timeout = Duration::from_secs(60);
            let conn = Conn::open(&user.url("before-pw"), config)
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            user.change_password("after-pw").await;
            user.force_close().await;
            events
                .wait(&format!("{:?}: redials refused with the old password", b.kind), MINUTE, |e| {
                    ["publish", "consume"].iter().all(|which| {
                        e.iter().any(|e| matches!(e, RecoveryEvent::Retrying { which: w, attempt, .. } if w == which && *attempt >= 3))
                    })
                })
                .await;
            assert!(!conn.is_connected());
            conn.update_secret("after-pw")
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind));
            assert!(conn.is_connected(), "{:?}: update_secret returns once both are back", b.kind);
            // The event follows the link's change.
            events
                .wait(&format!("{:?}: both connections recovered", b.kind), MINUTE, |_| {
                    events.recovered_on("publish") >= 1 && events.recovered_on("consume") >= 1
                })
                .await;
            let refusals = events
                .all()
                .iter()
                .filter(|e| matches!(e, RecoveryEvent::Retrying { error, .. } if error.contains("403") || error.contains("ACCESS_REFUSED")))
                .count();
            assert!(refusals >= 2, "{:?}: {:#?}", b.kind, events.all());
            publishes(&conn, &format!("{:?} after the recovery", b.kind)).await;
            conn.close().await.unwrap();
        }
    })
    .await
}
