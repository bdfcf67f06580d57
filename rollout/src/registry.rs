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
//! Credentials come from a Docker config file or a Kubernetes Secret
//! (`kubernetes.io/dockerconfigjson` or `kubernetes.io/basic-auth`); plain HTTP is used for
//! loopback registries only, unless configured otherwise.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::config::{ConfigError, DerivedImage, PluginConfigView, PluginGroup};
use crate::image::{self, ImageError};
use crate::metrics::{GroupLabels, Outcome, RolloutMetrics};
use crate::retry::RetryPolicy;

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

/// Where registry credentials come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum CredentialSource {
    /// No credentials.
    #[default]
    Anonymous,
    /// A Docker `config.json`-style file (`{"auths": {...}}`), e.g. a mounted Secret.
    DockerConfigFile {
        /// Path of the file.
        path: PathBuf,
    },
    /// A Kubernetes Secret of type `kubernetes.io/dockerconfigjson` or
    /// `kubernetes.io/basic-auth`, read through the API at each derivation.
    Secret {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },
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

/// Errors reading registry credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The credentials file could not be read.
    #[error("reading registry credentials from {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The Secret could not be fetched.
    #[error("fetching registry credentials Secret {namespace}/{name}")]
    Fetch {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// A Secret source is configured but no Kubernetes client was given.
    #[error("registry credentials come from a Secret but there is no Kubernetes client")]
    NoClient,
    /// The Docker config is not valid JSON of the expected shape.
    #[error("registry credentials are not a valid Docker config")]
    Parse(#[source] serde_json::Error),
    /// An `auth` entry is not base64 of `user:password`.
    #[error("registry credentials entry for {0} has a malformed auth field")]
    MalformedAuth(String),
    /// The Secret has neither `.dockerconfigjson` nor `username`/`password`.
    #[error("Secret has no .dockerconfigjson or username/password keys")]
    UnsupportedSecret,
}

/// Errors deriving and pushing an image.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// The configuration view is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
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

// === credentials ===

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// `https://reg.example:5000/v1/` → `reg.example:5000`.
fn registry_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

/// Credentials for `registry` from a Docker config (`{"auths": {...}}`); anonymous when the
/// config has no entry for it.
pub fn auth_from_docker_config(
    json: &[u8],
    registry: &str,
) -> Result<RegistryAuth, CredentialsError> {
    use base64::Engine as _;
    let cfg: DockerConfig = serde_json::from_slice(json).map_err(CredentialsError::Parse)?;
    let Some((key, entry)) = cfg.auths.iter().find(|(k, _)| registry_host(k) == registry) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let Some(token) = &entry.identity_token {
        return Ok(RegistryAuth::Bearer(token.clone()));
    }
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    if let Some(auth) = &entry.auth {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| CredentialsError::MalformedAuth(key.clone()))?;
        let text =
            String::from_utf8(raw).map_err(|_| CredentialsError::MalformedAuth(key.clone()))?;
        let (u, p) = text
            .split_once(':')
            .ok_or_else(|| CredentialsError::MalformedAuth(key.clone()))?;
        return Ok(RegistryAuth::Basic(u.into(), p.into()));
    }
    Ok(RegistryAuth::Anonymous)
}

/// Credentials for `registry` from a Secret of type `kubernetes.io/dockerconfigjson`
/// (`.dockerconfigjson`) or `kubernetes.io/basic-auth` (`username`, `password`).
pub fn auth_from_secret(secret: &Secret, registry: &str) -> Result<RegistryAuth, CredentialsError> {
    let data = secret.data.clone().unwrap_or_default();
    if let Some(cfg) = data.get(".dockerconfigjson") {
        return auth_from_docker_config(&cfg.0, registry);
    }
    match (data.get("username"), data.get("password")) {
        (Some(u), Some(p)) => Ok(RegistryAuth::Basic(
            String::from_utf8_lossy(&u.0).into_owned(),
            String::from_utf8_lossy(&p.0).into_owned(),
        )),
        _ => Err(CredentialsError::UnsupportedSecret),
    }
}

/// Resolves `source` for `registry`; `client` is needed only for [`CredentialSource::Secret`].
pub async fn resolve_auth(
    source: &CredentialSource,
    registry: &str,
    client: Option<&kube::Client>,
) -> Result<RegistryAuth, CredentialsError> {
    match source {
        CredentialSource::Anonymous => Ok(RegistryAuth::Anonymous),
        CredentialSource::DockerConfigFile { path } => {
            let bytes = tokio::fs::read(path)
                .await
                .map_err(|source| CredentialsError::Read {
                    path: path.clone(),
                    source,
                })?;
            auth_from_docker_config(&bytes, registry)
        }
        CredentialSource::Secret { namespace, name } => {
            let client = client.ok_or(CredentialsError::NoClient)?;
            let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
            let secret = api.get(name).await.map_err(|e| CredentialsError::Fetch {
                namespace: namespace.clone(),
                name: name.clone(),
                source: Box::new(e),
            })?;
            auth_from_secret(&secret, registry)
        }
    }
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
        Ok(Self {
            client: Client::new(config),
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
        view: &PluginConfigView,
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
        view: &PluginConfigView,
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
        view: &PluginConfigView,
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
    use base64::Engine as _;
    use k8s_openapi::ByteString;

    #[test]
    fn docker_config_auth_forms() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et");
        let json = format!(
            r#"{{"auths":{{"https://reg.example:5000/v1/":{{"auth":"{b64}"}},
                "other.example":{{"username":"bob","password":"pw"}},
                "tok.example":{{"identitytoken":"t0k"}}}}}}"#
        );
        let a = auth_from_docker_config(json.as_bytes(), "reg.example:5000").unwrap();
        assert_eq!(a, RegistryAuth::Basic("alice".into(), "s3cr:et".into()));
        let b = auth_from_docker_config(json.as_bytes(), "other.example").unwrap();
        assert_eq!(b, RegistryAuth::Basic("bob".into(), "pw".into()));
        let t = auth_from_docker_config(json.as_bytes(), "tok.example").unwrap();
        assert_eq!(t, RegistryAuth::Bearer("t0k".into()));
        let none = auth_from_docker_config(json.as_bytes(), "nowhere").unwrap();
        assert_eq!(none, RegistryAuth::Anonymous);
        assert!(matches!(
            auth_from_docker_config(br#"{"auths":{"x":{"auth":"!!"}}}"#, "x"),
            Err(CredentialsError::MalformedAuth(_))
        ));
        assert!(matches!(
            auth_from_docker_config(b"nope", "x"),
            Err(CredentialsError::Parse(_))
        ));
    }

    #[test]
    fn secret_auth_forms() {
        let mut s = Secret::default();
        assert!(matches!(
            auth_from_secret(&s, "r"),
            Err(CredentialsError::UnsupportedSecret)
        ));
        s.data = Some(
            [
                ("username".to_string(), ByteString(b"u".to_vec())),
                ("password".to_string(), ByteString(b"p".to_vec())),
            ]
            .into(),
        );
        assert_eq!(
            auth_from_secret(&s, "r").unwrap(),
            RegistryAuth::Basic("u".into(), "p".into())
        );
        s.data = Some(
            [(
                ".dockerconfigjson".to_string(),
                ByteString(br#"{"auths":{"r":{"username":"x","password":"y"}}}"#.to_vec()),
            )]
            .into(),
        );
        assert_eq!(
            auth_from_secret(&s, "r").unwrap(),
            RegistryAuth::Basic("x".into(), "y".into())
        );
    }

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
        assert!(!DeriveError::Config(ConfigError::NodeWithoutVendors("n".into())).is_transient());
    }
}
