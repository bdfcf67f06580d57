//! Deriving plugin images in an OCI registry.
//!
//! [`ImageDeriver::derive_plugin_image`] pulls the configured base plugin image's manifest and
//! config, appends one layer with the group's plugin configuration files (see
//! [`crate::image`]), sets the env, pushes blobs and manifest under
//! `<repository>:<group>-g<generation>` and returns the reference **by digest**. Nothing is
//! recorded here: the caller stores the returned [`DerivedImage`] in its configuration, so a
//! failed push leaves the configuration unchanged. [`ImageDeriver::derive_with_retry`] retries
//! transient registry failures with the configured [`RetryPolicy`].
//!
//! Credentials come from [`crate::credentials`]; plain HTTP is used for loopback registries
//! only, unless configured otherwise.

use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::credentials::{CredentialSource, CredentialsError, resolve_auth};
use crate::image::{self, ImageError};
use crate::metrics::{GroupLabels, Outcome, RolloutMetrics};
use crate::retry::RetryPolicy;
use kudos_api::{DerivedImage, PluginConfig, PluginConfigError, PluginGroup};

/// When to talk plain HTTP to a registry instead of HTTPS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PlainHttp {
    /// Always HTTPS.
    Never,
    /// Plain HTTP for `localhost`, `127.0.0.0/8` and `[::1]` registries only (test and
    /// node-local registries); HTTPS elsewhere.
    #[default]
    Loopback,
    /// Always plain HTTP (never in production).
    Always,
}

/// Registry configuration of image derivation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrySettings {
    /// The base plugin image, e.g. `registry.example/kudos/device-plugin:0.1.0`; pin it by
    /// digest in production, since a moved tag is not noticed.
    pub base_image: String,
    /// Repository derived images are pushed to, without tag:
    /// `registry.example/kudos/device-plugin-derived`.
    pub repository: String,
    /// Plain HTTP policy.
    #[serde(default)]
    pub plain_http: PlainHttp,
    /// Credentials; the entry for each registry (base, target) is looked up separately.
    #[serde(default)]
    pub credentials: CredentialSource,
    /// Retry policy for transient registry failures.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Connect timeout.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: Duration,
    /// Read timeout.
    #[serde(default = "default_read_timeout")]
    pub read_timeout: Duration,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_read_timeout() -> Duration {
    Duration::from_secs(60)
}

/// Errors deriving and pushing an image.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// The configuration view is invalid.
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    /// An image reference in the settings does not parse.
    #[error("invalid image reference {reference:?}")]
    Reference {
        /// The reference.
        reference: String,
        /// Cause.
        #[source]
        source: oci_client::ParseError,
    },
    /// Building the image failed (bad base image).
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Credentials could not be resolved.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// A registry operation failed.
    #[error("registry: {op} {reference}")]
    Registry {
        /// What was being done.
        op: &'static str,
        /// On which reference.
        reference: String,
        /// Cause.
        #[source]
        source: Box<OciDistributionError>,
    },
    /// The registry client cannot be built, e.g. no CA certificates where the TLS stack
    /// looks for them (a FROM-scratch image without `/etc/ssl/certs`; `SSL_CERT_FILE` names
    /// another bundle).
    #[error("building the registry client (TLS roots: /etc/ssl/certs or SSL_CERT_FILE)")]
    Client(#[source] Box<OciDistributionError>),
    /// Every attempt failed; the last error is kept.
    #[error("deriving the image for group {group} failed after {attempts} attempts")]
    RetriesExhausted {
        /// The plugin group.
        group: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        #[source]
        last: Box<DeriveError>,
    },
}

impl DeriveError {
    /// Whether retrying may help: registry and credential-fetch failures, not bad input.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Registry { .. } | Self::Credentials(CredentialsError::Fetch { .. })
        )
    }
}

/// Installs rustls' `ring` provider as the process default (idempotent). oci-client is built
/// without a provider of its own so that only `ring` is linked.
pub fn install_crypto_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => registry.split(':').next().unwrap_or(registry),
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

// === impl ImageDeriver ===

/// Derives and pushes plugin images. Cheap to clone.
#[derive(Clone)]
pub struct ImageDeriver {
    client: Client,
    settings: RegistrySettings,
    base: Reference,
    target: Reference,
    metrics: RolloutMetrics,
}

impl std::fmt::Debug for ImageDeriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageDeriver")
            .field("base", &self.settings.base_image)
            .field("repository", &self.settings.repository)
            .finish_non_exhaustive()
    }
}

fn parse_ref(s: &str) -> Result<Reference, DeriveError> {
    s.parse().map_err(|source| DeriveError::Reference {
        reference: s.into(),
        source,
    })
}

fn registry_err(
    op: &'static str,
    r: &Reference,
) -> impl FnOnce(OciDistributionError) -> DeriveError {
    let reference = r.whole();
    move |e| DeriveError::Registry {
        op,
        reference,
        source: Box::new(e),
    }
}

impl ImageDeriver {
    /// Builds a deriver; parses the references and sets the protocol per [`PlainHttp`].
    pub fn new(settings: RegistrySettings, metrics: RolloutMetrics) -> Result<Self, DeriveError> {
        install_crypto_provider();
        let base = parse_ref(&settings.base_image)?;
        let target = parse_ref(&settings.repository)?;
        let protocol = match settings.plain_http {
            PlainHttp::Never => ClientProtocol::Https,
            PlainHttp::Always => ClientProtocol::Http,
            PlainHttp::Loopback => ClientProtocol::HttpsExcept(
                [base.resolve_registry(), target.resolve_registry()]
                    .into_iter()
                    .filter(|r| is_loopback(r))
                    .map(str::to_string)
                    .collect(),
            ),
        };
        let config = ClientConfig {
            protocol,
            connect_timeout: Some(settings.connect_timeout),
            read_timeout: Some(settings.read_timeout),
            ..ClientConfig::default()
        };
        // Not Client::new: on error it falls back to a default client, whose construction
        // panics for the same reason (seen as a crash loop of the orchestrator pod).
        let client = Client::try_from(config).map_err(|e| DeriveError::Client(Box::new(e)))?;
        Ok(Self {
            client,
            settings,
            base,
            target,
            metrics,
        })
    }

    /// The registry settings.
    pub fn settings(&self) -> &RegistrySettings {
        &self.settings
    }

    /// The registry host derived images go to (for [`resolve_auth`]).
    pub fn target_registry(&self) -> &str {
        self.target.resolve_registry()
    }

    /// Whether `group` needs a (new) image: none recorded, a different base image, or a
    /// configuration layer that differs from the recorded one. Pure; no registry access.
    pub fn needs_derivation(
        &self,
        view: &PluginConfig,
        group: &PluginGroup,
    ) -> Result<bool, DeriveError> {
        let Some(current) = view.images.get(&group.name) else {
            return Ok(true);
        };
        if current.base_image != self.settings.base_image {
            return Ok(true);
        }
        let layer = image::build_layer(&image::group_config_files(view, group)?)?;
        Ok(layer.diff_id != current.config_layer_diff_id)
    }

    /// One attempt: derive `group`'s image from the base and push it. Returns the image by
    /// digest; records nothing. `base_auth` and `target_auth` are the credentials for the
    /// base image's and the target repository's registries (often the same).
    #[tracing::instrument(skip_all, fields(group = %group.name, generation = view.generation))]
    pub async fn derive_plugin_image(
        &self,
        view: &PluginConfig,
        group: &PluginGroup,
        base_auth: &RegistryAuth,
        target_auth: &RegistryAuth,
    ) -> Result<DerivedImage, DeriveError> {
        let layer = image::build_layer(&image::group_config_files(view, group)?)?;
        let c = &self.client;
        c.store_auth_if_needed(self.target.resolve_registry(), target_auth)
            .await;

        let (base_manifest, base_digest, base_config) = c
            .pull_manifest_and_config(&self.base, base_auth)
            .await
            .map_err(registry_err("pull base manifest", &self.base))?;
        let config = image::derive_config(
            &base_config,
            base_manifest.layers.len(),
            &layer,
            &image::group_env(view, group),
            &group.name,
        )?;
        let manifest = image::derive_manifest(
            &base_manifest,
            &self.settings.base_image,
            &base_digest,
            &config,
            &layer,
        );
        let body = image::manifest_bytes(&manifest)?;
        let digest = image::sha256_digest(&body);
        let tag = image::derive_tag(&group.name, view.generation);
        let target = Reference::with_tag(
            self.target.registry().to_string(),
            self.target.repository().to_string(),
            tag.clone(),
        );

        self.copy_base_layers(&base_manifest, &target).await?;
        self.push_blob_if_missing(&target, layer.compressed.clone(), &layer.digest)
            .await?;
        self.push_blob_if_missing(&target, config, &manifest.config.digest)
            .await?;
        let content_type = http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE);
        c.push_manifest_raw(&target, body, content_type)
            .await
            .map_err(registry_err("push manifest", &target))?;

        let reference = format!(
            "{}/{}@{digest}",
            self.target.registry(),
            self.target.repository()
        );
        info!(%reference, %tag, "pushed derived plugin image");
        Ok(DerivedImage {
            reference,
            digest,
            tag,
            generation: view.generation,
            base_image: self.settings.base_image.clone(),
            config_layer_diff_id: layer.diff_id,
        })
    }

    /// [`Self::derive_plugin_image`] with credentials resolved per attempt and transient
    /// failures retried per the [`RetryPolicy`]. Counts pushes, retries and durations.
    #[tracing::instrument(skip_all, fields(group = %group.name, generation = view.generation))]
    pub async fn derive_with_retry(
        &self,
        view: &PluginConfig,
        group: &PluginGroup,
        kube: Option<&kube::Client>,
    ) -> Result<DerivedImage, DeriveError> {
        let started = Instant::now();
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            let outcome: Result<DerivedImage, DeriveError> = async {
                let source = &self.settings.credentials;
                let target_auth = resolve_auth(source, self.target_registry(), kube).await?;
                let base_registry = self.base.resolve_registry();
                let base_auth = if base_registry == self.target_registry() {
                    target_auth.clone()
                } else {
                    resolve_auth(source, base_registry, kube).await?
                };
                self.derive_plugin_image(view, group, &base_auth, &target_auth)
                    .await
            }
            .await;
            match outcome {
                Ok(image) => break Ok(image),
                Err(e) if e.is_transient() => match self.settings.retry.delay_after(attempt) {
                    Some(delay) => {
                        warn!(error = %e, attempt, ?delay, "image push failed; retrying");
                        self.metrics.image_push_retries.inc();
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        break Err(DeriveError::RetriesExhausted {
                            group: group.name.clone(),
                            attempts: attempt,
                            last: Box::new(e),
                        });
                    }
                },
                Err(e) => break Err(e),
            }
        };
        let outcome = if result.is_ok() {
            Outcome::Success
        } else {
            Outcome::Failure
        };
        self.metrics
            .image_pushes
            .get_or_create(&GroupLabels {
                group: group.name.clone(),
                outcome,
            })
            .inc();
        self.metrics
            .image_push_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        result
    }

    async fn push_blob_if_missing(
        &self,
        target: &Reference,
        data: Vec<u8>,
        digest: &str,
    ) -> Result<(), DeriveError> {
        let c = &self.client;
        if c.blob_exists(target, digest)
            .await
            .map_err(registry_err("check blob", target))?
        {
            debug!(digest, "blob already present");
            return Ok(());
        }
        c.push_blob(target, data, digest)
            .await
            .map_err(registry_err("push blob", target))?;
        Ok(())
    }

    /// Makes the base layers available in the target repository: nothing if present, a
    /// cross-repository mount within one registry, else a copy through memory.
    async fn copy_base_layers(
        &self,
        base_manifest: &OciImageManifest,
        target: &Reference,
    ) -> Result<(), DeriveError> {
        let c = &self.client;
        for layer in &base_manifest.layers {
            if c.blob_exists(target, &layer.digest)
                .await
                .map_err(registry_err("check blob", target))?
            {
                continue;
            }
            if self.base.resolve_registry() == target.resolve_registry()
                && c.mount_blob(target, &self.base, &layer.digest)
                    .await
                    .is_ok()
            {
                debug!(digest = %layer.digest, "mounted base layer");
                continue;
            }
            let mut data = Vec::new();
            c.pull_blob(&self.base, layer, &mut data)
                .await
                .map_err(registry_err("pull base layer", &self.base))?;
            c.push_blob(target, data, &layer.digest)
                .await
                .map_err(registry_err("push base layer", target))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        for r in [
            "127.0.0.1:5000",
            "localhost:1",
            "localhost",
            "[::1]:5000",
            "127.3.2.1",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in ["reg.example:5000", "10.0.0.1:5000", "index.docker.io"] {
            assert!(!is_loopback(r), "{r}");
        }
    }

    #[test]
    fn transient_classification() {
        let e = DeriveError::Registry {
            op: "x",
            reference: "r".into(),
            source: Box::new(OciDistributionError::GenericError(None)),
        };
        assert!(e.is_transient());
        assert!(
            !DeriveError::Config(PluginConfigError::NodeWithoutVendors("n".into())).is_transient()
        );
    }
}
