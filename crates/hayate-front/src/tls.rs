//! The server's TLS settings: certificate and key from PEM files (`[tls]`), optional client
//! certificates, reloaded on demand (SIGHUP in the `hayate` binary) without dropping
//! connections: a handshake uses the configuration current when it starts.

use std::sync::{Arc, RwLock};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::TlsSection;

/// A `[tls]` section, loaded; [`ServerTls::reload`] reads the files again.
#[derive(Debug)]
pub struct ServerTls {
    section: TlsSection,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

/// aws-lc-rs's suites with AES-128-GCM ahead of AES-256-GCM (as safe, and about a third less
/// work per byte; the server's order wins, see `ignore_client_order`), ChaCha20 next.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    let rank = |s: &rustls::SupportedCipherSuite| {
        let name = format!("{:?}", s.suite());
        if name.contains("AES_128_GCM") {
            0
        } else if name.contains("AES_256_GCM") {
            1
        } else {
            2
        }
    };
    // Stable: TLS 1.3 suites stay ahead of TLS 1.2 ones within each rank.
    p.cipher_suites.sort_by_key(|s| {
        (
            rank(s),
            s.version().version != rustls::ProtocolVersion::TLSv1_3,
        )
    });
    Arc::new(p)
}

/// Reads the certificates of a PEM file (at least one); `what` names the setting in errors.
pub fn load_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    hayate_io::transport::tls::load_certs(std::path::Path::new(path))
        .map_err(|e| format!("{what} {e}"))
}

fn build(s: &TlsSection) -> Result<Arc<rustls::ServerConfig>, String> {
    if s.cert.is_empty() || s.key.is_empty() {
        return Err("tls.cert and tls.key are both needed for a TLS listener".into());
    }
    let certs = load_certs(&s.cert, "tls.cert")?;
    let key =
        PrivateKeyDer::from_pem_file(&s.key).map_err(|e| format!("tls.key {:?}: {e}", s.key))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if s.client_ca.is_empty() {
        if s.require_client_cert || s.cert_user {
            return Err("tls.require_client_cert and tls.cert_user need tls.client_ca".into());
        }
        builder.with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        for c in load_certs(&s.client_ca, "tls.client_ca")? {
            roots
                .add(c)
                .map_err(|e| format!("tls.client_ca {:?}: {e}", s.client_ca))?;
        }
        let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
        let v = if s.require_client_cert {
            v
        } else {
            v.allow_unauthenticated()
        };
        builder.with_client_cert_verifier(v.build().map_err(|e| e.to_string())?)
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls.cert / tls.key: {e}"))?;
    // No ALPN: every listener speaks one protocol.
    cfg.alpn_protocols.clear();
    cfg.ignore_client_order = true;
    // hayate-io's TLS transport runs the record layer itself once the handshake is done.
    cfg.enable_secret_extraction = true;
    Ok(Arc::new(cfg))
}

impl ServerTls {
    /// Loads the section's files; a clear error for a missing or bad file.
    pub fn load(section: &TlsSection) -> Result<ServerTls, String> {
        Ok(ServerTls {
            current: RwLock::new(build(section)?),
            section: section.clone(),
        })
    }

    /// The configuration for a new handshake.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the certificate, key and CA files again; on error the current ones stay.
    pub fn reload(&self) -> Result<(), String> {
        let c = build(&self.section)?;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = c;
        Ok(())
    }

    /// Whether a verified client certificate's CN names the user.
    pub fn cert_user(&self) -> bool {
        self.section.cert_user
    }
}

/// The subject common name (CN) of a DER certificate, if it has one (a small DER walk:
/// TBSCertificate → subject → the first 2.5.4.3 attribute).
pub fn subject_cn(der: &[u8]) -> Option<String> {
    // (tag, content, rest)
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, b) = b.split_first()?;
        let (&l0, mut b) = b.split_first()?;
        let len = if l0 < 0x80 {
            usize::from(l0)
        } else {
            let n = usize::from(l0 & 0x7f);
            if n == 0 || n > 4 || b.len() < n {
                return None;
            }
            let mut len = 0usize;
            for &x in &b[..n] {
                len = (len << 8) | usize::from(x);
            }
            b = &b[n..];
            len
        };
        if b.len() < len {
            return None;
        }
        Some((tag, &b[..len], &b[len..]))
    }
    let (_, cert, _) = tlv(der)?; // Certificate SEQUENCE
    let (_, tbs, _) = tlv(cert)?; // TBSCertificate SEQUENCE
    let mut rest = tbs;
    let mut fields = Vec::new();
    while !rest.is_empty() && fields.len() < 7 {
        let (tag, content, r) = tlv(rest)?;
        fields.push((tag, content));
        rest = r;
    }
    // [0] version (optional), serial, signature, issuer, validity, subject.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (_, subject) = *fields.get(skip + 4)?;
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (_, set, r) = tlv(rdns)?;
        rdns = r;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (_, atv, r2) = tlv(attrs)?;
            attrs = r2;
            let (_, oid, val) = tlv(atv)?;
            if oid == [0x55, 0x04, 0x03] {
                let (_, s, _) = tlv(val)?;
                return String::from_utf8(s.to_vec()).ok();
            }
        }
    }
    None
}
