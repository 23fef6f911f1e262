//! TLS with rustls: server verification on by default (webpki roots, or the
//! roots you give), optional client certificate, SNI from the host name.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// TLS settings for `amqps://` connections.
#[derive(Clone, Default)]
pub struct TlsConfig {
    roots: Vec<CertificateDer<'static>>,
    client: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("custom_roots", &self.roots.len())
            .field("client_certificate", &self.client.is_some())
            .field("server_name", &self.server_name)
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
        let mut roots = rustls::RootCertStore::empty();
        if self.roots.is_empty() {
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
