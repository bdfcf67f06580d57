//! Registry credentials: from a Docker `config.json`-style file (e.g. a mounted Secret) or
//! read from a Kubernetes Secret through the API (`kubernetes.io/dockerconfigjson` or
//! `kubernetes.io/basic-auth`), looked up per registry host.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use oci_client::secrets::RegistryAuth;
use serde::{Deserialize, Serialize};

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
}
