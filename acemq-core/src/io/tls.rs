//! TLS with rustls: server verification on by default (webpki roots, the
//! roots you give, or the OS trust store with the `native-roots` feature),
//! optional client certificate, SNI from the host name; or a whole
//! `rustls::ClientConfig` of the caller's.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// TLS settings for `amqps://` connections.
///
/// Whom it trusts: webpki's roots (Mozilla's list, compiled in) unless told
/// otherwise; the certificates of [`TlsConfig::with_root_pem`] instead;
/// with the `native-roots` feature, the operating system's trust store
/// ([`TlsConfig::with_native_roots`], beside any PEM roots given); or
/// whatever a `rustls::ClientConfig` of your own says
/// ([`TlsConfig::from_client_config`]).
#[derive(Clone, Default)]
pub struct TlsConfig {
    roots: Vec<CertificateDer<'static>>,
    native_roots: bool,
    client: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    server_name: Option<String>,
    client_config: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("custom_roots", &self.roots.len())
            .field("native_roots", &self.native_roots)
            .field("client_certificate", &self.client.is_some())
            .field("server_name", &self.server_name)
            .field("client_config", &self.client_config.is_some())
            .finish()
    }
}

/// Why TLS could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(pub String);

impl TlsConfig {
    /// Webpki's roots, no client certificate, SNI from the URL's host.
    pub fn new() -> Self {
        TlsConfig::default()
    }

    /// Uses `config` as it is for the TLS handshake: its roots or
    /// verifier, client certificate, protocol versions and crypto
    /// provider (e.g. for a corporate CA with a custom verifier, or a key
    /// kept in an HSM). Only [`TlsConfig::with_server_name`] still applies;
    /// the other settings of this type are ignored.
    pub fn from_client_config(config: Arc<rustls::ClientConfig>) -> Self {
        TlsConfig {
            client_config: Some(config),
            ..TlsConfig::default()
        }
    }

    /// Trusts the operating system's trust store (read with
    /// `rustls-native-certs` at each dial: on Linux the OpenSSL locations,
    /// or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set; the keychain on macOS;
    /// the system store on Windows), beside the certificates of
    /// [`TlsConfig::with_root_pem`], instead of webpki's roots. A store
    /// with no certificate at all fails the dial with a [`TlsError`].
    #[cfg(feature = "native-roots")]
    pub fn with_native_roots(mut self) -> Self {
        self.native_roots = true;
        self
    }

    /// Whether this is [`TlsConfig::new`] with nothing set.
    pub(crate) fn is_default(&self) -> bool {
        self.roots.is_empty()
            && !self.native_roots
            && self.client.is_none()
            && self.server_name.is_none()
            && self.client_config.is_none()
    }

    /// Trusts the certificates in this PEM (e.g. a private CA) instead of
    /// webpki's roots.
    pub fn with_root_pem(mut self, pem: &[u8]) -> Result<Self, TlsError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError(format!("root certificates: {e}")))?;
        if certs.is_empty() {
            return Err(TlsError("no certificate in the root PEM".into()));
        }
        self.roots.extend(certs);
        Ok(self)
    }

    /// Presents this certificate chain and key (PEM) to the server.
    pub fn with_client_cert_pem(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError(format!("client certificate: {e}")))?;
        if chain.is_empty() {
            return Err(TlsError("no certificate in the client PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError(format!("client key: {e}")))?;
        self.client = Some((chain, Arc::new(key)));
        Ok(self)
    }

    /// Verifies the server as this name instead of the URL's host.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    fn connector(&self) -> Result<TlsConnector, TlsError> {
        if let Some(config) = &self.client_config {
            return Ok(TlsConnector::from(config.clone()));
        }
        let mut roots = rustls::RootCertStore::empty();
        if self.native_roots {
            add_native_roots(&mut roots)?;
        }
        if self.roots.is_empty() && !self.native_roots {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        } else {
            for cert in &self.roots {
                roots
                    .add(cert.clone())
                    .map_err(|e| TlsError(format!("root certificate: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &self.client {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| TlsError(format!("client certificate: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }

    /// Runs the TLS handshake over `tcp`, verifying the server as `host`
    /// (or the configured server name).
    pub(crate) async fn connect(&self, host: &str, tcp: TcpStream) -> Result<TlsStream<TcpStream>, std::io::Error> {
        let connector = self.connector().map_err(std::io::Error::other)?;
        let name = self.server_name.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server name {name:?}: {e}")))?;
        connector.connect(server_name, tcp).await
    }
}

/// The operating system's trust store, into `roots`.
#[cfg(feature = "native-roots")]
fn add_native_roots(roots: &mut rustls::RootCertStore) -> Result<(), TlsError> {
    let found = rustls_native_certs::load_native_certs();
    // A certificate the store holds but rustls cannot use is skipped, as
    // is a store file that cannot be read, as long as some root is left.
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "it is empty".to_string(), ToString::to_string);
        return Err(TlsError(format!(
            "no usable certificate in the operating system's trust store: {why}"
        )));
    }
    Ok(())
}

#[cfg(not(feature = "native-roots"))]
fn add_native_roots(_roots: &mut rustls::RootCertStore) -> Result<(), TlsError> {
    // `native_roots` is set only by `with_native_roots`, behind the feature.
    Ok(())
}
