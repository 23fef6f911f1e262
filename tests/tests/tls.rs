//! TLS trust: the operating system's trust store (`native-roots`), a whole
//! `rustls::ClientConfig` of the caller's (with a client certificate and
//! SASL EXTERNAL), and TLS settings or EXTERNAL with an `amqp://` URL
//! refused before anything is dialled. The TLS parts run on RabbitMQ 3.10
//! and 4.0 over TLS (acemq-memory has no TLS listener); the refusal runs on
//! every broker, acemq-memory served on TCP included.
//!
//! The trust-store test changes `SSL_CERT_FILE` and `SSL_CERT_DIR` of this
//! test process: it is the only test here that reads them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acemq_core::amqp::rustls;
use acemq_core::amqp::rustls::pki_types::pem::PemObject;
use acemq_core::amqp::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use acemq_core::amqp::{Config, Connection, Error, TlsConfig};
use acemq_tests::{all_brokers, brokers, deadline, unique, Broker};

/// The TLS brokers: RabbitMQ 3.10 and 4.0 over TLS.
async fn tls_brokers() -> Vec<Broker> {
    let tls: Vec<Broker> = all_brokers().await.into_iter().filter(|b| b.kind.is_tls()).collect();
    assert!(
        !tls.is_empty() || std::env::var("CI").is_err(),
        "no TLS broker under CI=true"
    );
    tls
}

fn tls_dir(b: &Broker) -> PathBuf {
    b.tls_dir
        .clone()
        .unwrap_or_else(|| panic!("{:?} has no TLS directory", b.kind))
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A private folder for this run.
fn private_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(what));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Connects with `tls` and closes again; the error if it failed.
async fn try_tls(b: &Broker, tls: TlsConfig) -> Result<(), Error> {
    let conn = Connection::open(&b.url, b.config().with_tls(tls)).await?;
    conn.close().await
}

#[tokio::test(flavor = "multi_thread")]
async fn native_roots_trust_a_server_only_when_the_os_store_holds_its_ca() {
    deadline(async {
        for b in tls_brokers().await {
            let dir = tls_dir(&b);
            let store = private_dir("trust");
            std::fs::copy(dir.join("ca.pem"), store.join("test-ca.pem")).unwrap();
            let other = private_dir("other-trust");
            // A certificate, but not one that signed the broker's.
            std::fs::copy(dir.join("client.pem"), other.join("not-the-ca.pem")).unwrap();
            let empty = other.join("empty.pem");
            std::fs::write(&empty, b"").unwrap();
            let native = TlsConfig::new().with_native_roots();

            std::env::remove_var("SSL_CERT_DIR");
            // The store is read at each dial: one TlsConfig, four stores.
            std::env::set_var("SSL_CERT_FILE", store.join("test-ca.pem"));
            try_tls(&b, native.clone())
                .await
                .unwrap_or_else(|e| panic!("{:?}: SSL_CERT_FILE holds the CA: {e}", b.kind));

            std::env::set_var("SSL_CERT_FILE", other.join("not-the-ca.pem"));
            let err = try_tls(&b, native.clone()).await.unwrap_err();
            assert!(err.to_string().contains("certificate"), "{:?}: {err}", b.kind);

            std::env::set_var("SSL_CERT_FILE", &empty);
            let err = try_tls(&b, native.clone()).await.unwrap_err();
            assert!(
                matches!(&err, Error::Io(e) if e.to_string().contains("trust store")),
                "{:?}: {err}",
                b.kind
            );

            std::env::remove_var("SSL_CERT_FILE");
            std::env::set_var("SSL_CERT_DIR", &store);
            try_tls(&b, native.clone())
                .await
                .unwrap_or_else(|e| panic!("{:?}: SSL_CERT_DIR holds the CA: {e}", b.kind));
            std::env::set_var("SSL_CERT_DIR", &other);
            let err = try_tls(&b, native.clone()).await.unwrap_err();
            assert!(err.to_string().contains("certificate"), "{:?}: {err}", b.kind);
            std::env::remove_var("SSL_CERT_DIR");

            // Beside a PEM root: either may vouch for the server.
            std::env::set_var("SSL_CERT_FILE", other.join("not-the-ca.pem"));
            let pem = std::fs::read(dir.join("ca.pem")).unwrap();
            try_tls(&b, native.clone().with_root_pem(&pem).unwrap())
                .await
                .unwrap_or_else(|e| panic!("{:?}: the PEM root holds the CA: {e}", b.kind));
            std::env::remove_var("SSL_CERT_FILE");

            let _ = std::fs::remove_dir_all(&store);
            let _ = std::fs::remove_dir_all(&other);
        }
    })
    .await
}

/// A `rustls::ClientConfig` of the caller's, used as given: its roots, its
/// client certificate (RabbitMQ's EXTERNAL mechanism logs in as the
/// certificate's CN, `acemq-client`), and nothing of webpki's.
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_client_config_is_used_as_given_with_its_client_certificate() {
    deadline(async {
        for b in tls_brokers().await {
            let dir = tls_dir(&b);
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs(&dir.join("ca.pem")) {
                roots.add(cert).unwrap();
            }
            let chain = certs(&dir.join("client.pem"));
            let key = PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = || {
                rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .unwrap()
            };
            let with_cert = Arc::new(
                builder()
                    .with_root_certificates(roots.clone())
                    .with_client_auth_cert(chain, key)
                    .unwrap(),
            );

            // EXTERNAL with the certificate: the broker knows who we are.
            let name = unique("acemq-tls-external");
            let config = b
                .config()
                .with_tls(TlsConfig::from_client_config(with_cert.clone()))
                .with_external_auth(true)
                .with_connection_name(name.as_str());
            let conn = Connection::open(&b.url, config)
                .await
                .unwrap_or_else(|e| panic!("{:?}: EXTERNAL with the client certificate: {e}", b.kind));
            let listing = b.rabbitmqctl(&["list_connections", "user", "client_properties"]);
            let line = listing
                .lines()
                .find(|l| l.contains(&name))
                .unwrap_or_else(|| panic!("{:?}: no connection {name} in:\n{listing}", b.kind));
            assert!(line.starts_with("acemq-client"), "{:?}: {line}", b.kind);
            conn.close().await.unwrap();

            // Without a client certificate, EXTERNAL has nothing to go by:
            // RabbitMQ does not offer it, and the dial fails.
            let without_cert = Arc::new(builder().with_root_certificates(roots.clone()).with_no_client_auth());
            let config = b
                .config()
                .with_tls(TlsConfig::from_client_config(without_cert.clone()))
                .with_external_auth(true);
            let err = Connection::open(&b.url, config).await.unwrap_err();
            assert!(err.to_string().contains("EXTERNAL"), "{:?}: {err}", b.kind);
            // With the URL's password it is an ordinary TLS connection.
            try_tls(&b, TlsConfig::from_client_config(without_cert.clone()))
                .await
                .unwrap_or_else(|e| panic!("{:?}: PLAIN over the given config: {e}", b.kind));

            // Its roots are all there is: without the CA the server is not
            // trusted, whatever else the TlsConfig would have trusted.
            let no_roots = Arc::new(
                builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            );
            let err = try_tls(&b, TlsConfig::from_client_config(no_roots)).await.unwrap_err();
            assert!(err.to_string().contains("certificate"), "{:?}: {err}", b.kind);

            // The server name still applies.
            let err = try_tls(
                &b,
                TlsConfig::from_client_config(without_cert).with_server_name("not-the-broker.example"),
            )
            .await
            .unwrap_err();
            assert!(
                err.to_string().to_lowercase().contains("not valid for name"),
                "{:?}: {err}",
                b.kind
            );
        }
    })
    .await
}

/// With `amqp://` nothing would be encrypted: a TLS setting, or EXTERNAL
/// (from the config or the URL), is a typed error before anything is
/// dialled, on every broker (acemq-memory served on TCP for an `amqp://`
/// URL). `memory://` stays in the process and takes them.
#[tokio::test(flavor = "multi_thread")]
async fn tls_settings_or_external_with_amqp_are_refused_before_dialling() {
    deadline(async {
        let ca = acemq_tests::rabbit_env(acemq_tests::RabbitVersion::V3_10)
            .and_then(|env| env.tls)
            .and_then(|(_, ca)| std::fs::read(ca).ok());
        for b in brokers().await {
            let url = match &b.memory {
                Some(memory) => {
                    let addr = memory.listen_tcp("127.0.0.1:0").await.unwrap();
                    format!("amqp://guest:guest@{addr}/")
                }
                None => b.url.clone(),
            };
            let mut settings = vec![
                ("server name", TlsConfig::new().with_server_name("broker.example")),
                ("native roots", TlsConfig::new().with_native_roots()),
                (
                    "client config",
                    TlsConfig::from_client_config(Arc::new(
                        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                            .with_safe_default_protocol_versions()
                            .unwrap()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth(),
                    )),
                ),
            ];
            if let Some(pem) = &ca {
                settings.push(("PEM root", TlsConfig::new().with_root_pem(pem).unwrap()));
            }
            for (what, tls) in settings {
                let config = Config::default().with_tls(tls.clone());
                let err = Connection::open(&url, config).await.unwrap_err();
                assert!(
                    matches!(
                        err,
                        Error::NotTls {
                            setting: "a TLS configuration"
                        }
                    ),
                    "{:?} {what}: {err:?}",
                    b.kind
                );
                assert!(err.to_string().contains("amqps://"), "{err}");
                let config = acemq_core::Config::default().with_tls(tls);
                let err = acemq_core::Conn::open(&url, config).await.unwrap_err();
                assert!(
                    matches!(err, acemq_core::Error::Engine(Error::NotTls { .. })),
                    "{:?} {what}: {err:?}",
                    b.kind
                );
            }
            let err = Connection::open(&url, Config::default().with_external_auth(true))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::NotTls {
                        setting: "EXTERNAL authentication"
                    }
                ),
                "{:?}: {err:?}",
                b.kind
            );
            let err = Connection::open(&format!("{url}?auth_mechanism=external"), Config::default())
                .await
                .unwrap_err();
            assert!(matches!(err, Error::NotTls { .. }), "{:?}: {err:?}", b.kind);
            if let Some(memory) = &b.memory {
                assert_eq!(memory.connection_count(), 0, "nothing reached the broker");
                // In process nothing goes on a wire: memory:// takes them.
                let conn = Connection::open(
                    &b.url,
                    Config::default().with_tls(TlsConfig::new().with_server_name("broker.example")),
                )
                .await
                .unwrap();
                conn.close().await.unwrap();
            }
            // And the same URL without them connects.
            Connection::open(&url, Config::default().with_connection_timeout(Duration::from_secs(10)))
                .await
                .unwrap_or_else(|e| panic!("{:?}: {e}", b.kind))
                .close()
                .await
                .unwrap();
        }

        // Nothing is dialled: a listener that would see the connection sees none.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("amqp://guest:guest@{}/", listener.local_addr().unwrap());
        let err = Connection::open(
            &url,
            Config::default().with_tls(TlsConfig::new().with_server_name("x.example")),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::NotTls { .. }));
        let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(accepted.is_err(), "the refused dial reached the socket");
    })
    .await
}
