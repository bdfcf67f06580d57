//! Certificates for tests, made with the `openssl` command the way Helm, cert-manager and
//! kubeadm make them: a CA, and certificates it signs with the subject alternative names and
//! extended key usages a test asks for.

use crate::cluster::openssl;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// A CA under `dir/<name>` (`ca.crt`, `ca.key`) and what it signed.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// A new CA with common name `name`, valid for `days`, under `dir/<name>`.
    pub fn new(dir: &Path, name: &str, days: u32) -> Result<Self> {
        Self::new_in(&dir.join(name), name, days)
    }

    /// A new CA with common name `name`, valid for `days`, in `dir` itself.
    pub fn new_in(dir: &Path, name: &str, days: u32) -> Result<Self> {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let (subj, days) = (format!("/CN={name}"), days.to_string());
        openssl(
            &dir,
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.crt", "-days", &days, "-subj", &subj,
            ],
        )?;
        Ok(Self { dir })
    }

    /// Signs a certificate with common name `name` and `extensions` (openssl extfile lines,
    /// e.g. `subjectAltName=DNS:x` and `extendedKeyUsage=serverAuth`); its (cert, key) paths.
    /// The key is PKCS#1 (`RSA PRIVATE KEY`), as Helm's `genSignedCert` writes it.
    pub fn issue(&self, name: &str, extensions: &str) -> Result<(PathBuf, PathBuf)> {
        let d = &self.dir;
        let ext = format!("{name}.ext");
        std::fs::write(d.join(&ext), extensions)?;
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let subj = format!("/CN={name}");
        openssl(
            d,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subj,
            ],
        )?;
        openssl(d, &["rsa", "-in", &key, "-out", &key, "-traditional"])?;
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        )?;
        Ok((d.join(crt), d.join(key)))
    }

    /// A serving certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.issue(
            name,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
    }

    /// A client certificate naming DNS `name`.
    pub fn client(&self, name: &str) -> Result<(PathBuf, PathBuf)> {
        self.issue(
            name,
            &format!("subjectAltName=DNS:{name}\nextendedKeyUsage=clientAuth\n"),
        )
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}
