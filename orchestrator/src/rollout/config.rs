//! The `rollout:` section of the config file and its validated form.
//!
//! ```yaml
//! rollout:
//!   enabled: false                # --rollout[=BOOL], KUDOS_ROLLOUT
//!   dryRun: false                 # --dry-run-rollout[=BOOL], KUDOS_DRY_RUN_ROLLOUT
//!   baseImage: registry.example/kudos/device-plugin:0.1.0
//!   repository: registry.example/kudos/device-plugin-derived
//!   plainHttp: loopback           # never | loopback | always
//!   credentials:
//!     file: /etc/kudos/registry/config.json     # a Docker config.json (mounted Secret), or
//!     # secret: {namespace: kudos-system, name: registry}  # read through the API
//!   pushAttempts: 4
//!   resyncSeconds: 300
//!   monitorPeriodSeconds: 10
//!   daemonSet: {namespace: kudos-system, tolerations: [...], requests: {...}, limits: {...}}
//! ```
//!
//! Unknown fields are errors naming the field (`rollout.daemonSet: unknown field ...`).

use super::super::config::ConfigError;
use kudos_rollout::{CredentialSource, PlainHttp, RegistrySettings, RetryPolicy, RolloutSettings};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The `rollout:` section as written in the file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutFileConfig {
    /// Derive plugin images and apply plugin DaemonSets (needs a cluster). Default false.
    pub enabled: Option<bool>,
    /// Print the DaemonSet manifests to stdout instead of pushing and applying anything.
    /// Implies `enabled`. Default false.
    pub dry_run: Option<bool>,
    /// The base device-plugin image derived images are built on (pin it by digest).
    pub base_image: Option<String>,
    /// Repository derived images are pushed to, registry host included, without tag.
    pub repository: Option<String>,
    /// When to talk plain HTTP to the registry: `never`, `loopback` (default), `always`.
    pub plain_http: Option<PlainHttp>,
    /// Registry credentials; anonymous when empty.
    #[serde(default)]
    pub credentials: CredentialsConfig,
    /// Push attempts per image before the pass fails (the pass itself is retried with
    /// backoff). Default 4.
    pub push_attempts: Option<u32>,
    /// Seconds between reconcile passes when nothing changes (repairs drift). Default 300.
    pub resync_seconds: Option<f64>,
    /// Seconds between node-monitoring passes (also run on every change). Default 10.
    pub monitor_period_seconds: Option<f64>,
    /// Plugin DaemonSet settings: `namespace`, `namePrefix`, `serviceAccount`,
    /// `priorityClass`, `tolerations`, `requests`, `limits`, `nvmlLibraryDir`, `stateDir`,
    /// `devicePluginDir`, `env`, `imagePullSecrets`, `podTemplateFrom` (a DaemonSet whose pod
    /// the group DaemonSets copy: the chart's bootstrap plugin); each missing field keeps its
    /// default.
    pub daemon_set: Option<RolloutSettings>,
}

/// Where registry credentials come from (at most one).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialsConfig {
    /// A Docker `config.json`-style file, e.g. a mounted `kubernetes.io/dockerconfigjson`
    /// Secret.
    pub file: Option<PathBuf>,
    /// A Secret read through the API at each derivation.
    pub secret: Option<SecretRef>,
}

/// A Secret by namespace and name.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// The validated rollout settings.
#[derive(Clone, Debug)]
pub struct RolloutConfig {
    /// Rollout runs (apply mode needs a cluster).
    pub enabled: bool,
    /// Print manifests instead of pushing and applying.
    pub dry_run: bool,
    /// Registry settings; `None` only in a dry run without `baseImage`/`repository`.
    pub registry: Option<RegistrySettings>,
    /// DaemonSet settings.
    pub daemonsets: RolloutSettings,
    /// Resync period of the reconciler.
    pub resync: Duration,
    /// Node-monitoring period.
    pub monitor_period: Duration,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            dry_run: false,
            registry: None,
            daemonsets: RolloutSettings::default(),
            resync: Duration::from_secs(300),
            monitor_period: Duration::from_secs(10),
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

fn secs(field: &'static str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
    let v = v.unwrap_or(default);
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(invalid(
            field,
            format!("{v} must be a positive number of seconds"),
        ))
    }
}

impl RolloutConfig {
    /// Merges the flags (`--rollout`, `--dry-run-rollout`, already merged with their env
    /// variables by clap) over the file section and validates.
    pub fn resolve(
        file: RolloutFileConfig,
        enabled_flag: Option<bool>,
        dry_run_flag: Option<bool>,
    ) -> Result<Self, ConfigError> {
        let dry_run = dry_run_flag.or(file.dry_run).unwrap_or(false);
        let enabled = dry_run || enabled_flag.or(file.enabled).unwrap_or(false);
        let credentials = match (file.credentials.file, file.credentials.secret) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "rollout.credentials",
                    "set either `file` or `secret`, not both",
                ));
            }
            (Some(path), None) => CredentialSource::DockerConfigFile { path },
            (None, Some(s)) => {
                if s.namespace.is_empty() || s.name.is_empty() {
                    return Err(invalid(
                        "rollout.credentials.secret",
                        "namespace and name must not be empty",
                    ));
                }
                CredentialSource::Secret {
                    namespace: s.namespace,
                    name: s.name,
                }
            }
            (None, None) => CredentialSource::Anonymous,
        };
        let push_attempts = file.push_attempts.unwrap_or(4);
        if push_attempts == 0 {
            return Err(invalid("rollout.pushAttempts", "must be at least 1"));
        }
        let registry = match (file.base_image, file.repository) {
            (Some(base_image), Some(repository)) => {
                let settings = RegistrySettings {
                    base_image,
                    repository,
                    plain_http: file.plain_http.unwrap_or_default(),
                    credentials,
                    retry: RetryPolicy {
                        max_attempts: push_attempts,
                        ..RetryPolicy::default()
                    },
                    connect_timeout: Duration::from_secs(10),
                    read_timeout: Duration::from_secs(60),
                };
                // Parse both references now, the way the registry client will.
                if let Err(kudos_rollout::DeriveError::Reference { reference, source }) =
                    kudos_rollout::ImageDeriver::new(settings.clone(), Default::default())
                {
                    let field = if reference == settings.base_image {
                        "rollout.baseImage"
                    } else {
                        "rollout.repository"
                    };
                    return Err(invalid(
                        field,
                        format!("{reference:?} is not an image reference: {source}"),
                    ));
                }
                Some(settings)
            }
            (None, None) if !enabled || dry_run => None,
            (None, _) => {
                return Err(invalid(
                    "rollout.baseImage",
                    "required when rollout is enabled (the image plugin images are derived from)",
                ));
            }
            (Some(_), None) => {
                return Err(invalid(
                    "rollout.repository",
                    "required with rollout.baseImage (where derived images are pushed)",
                ));
            }
        };
        let daemonsets = file.daemon_set.unwrap_or_default();
        if daemonsets.namespace.is_empty() {
            return Err(invalid("rollout.daemonSet.namespace", "must not be empty"));
        }
        if daemonsets.name_prefix.is_empty() || daemonsets.name_prefix.len() > 20 {
            return Err(invalid(
                "rollout.daemonSet.namePrefix",
                "must be 1..=20 characters (DaemonSet names are <prefix>-<group>)",
            ));
        }
        if let Some(name) = &daemonsets.pod_template_from
            && kudos_api::bounds::validate_node_name(name).is_err()
        {
            return Err(invalid(
                "rollout.daemonSet.podTemplateFrom",
                "must name a DaemonSet (a DNS subdomain of at most 253 characters)",
            ));
        }
        Ok(Self {
            enabled,
            dry_run,
            registry,
            daemonsets,
            resync: secs("rollout.resyncSeconds", file.resync_seconds, 300.0)?,
            monitor_period: secs(
                "rollout.monitorPeriodSeconds",
                file.monitor_period_seconds,
                10.0,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FileConfig, Settings};
    use clap::Parser;

    const HEAD: &str = "apiVersion: kudos.dev/v1alpha1\nkind: OrchestratorConfig\n";

    fn resolve(yaml: &str, flags: &[&str]) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, format!("{HEAD}{yaml}")).unwrap();
        let mut argv = vec!["x", "--config", path.to_str().unwrap()];
        argv.extend_from_slice(flags);
        Settings::resolve(&crate::Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn example_section_parses_with_defaults_shown() {
        let cfg = FileConfig::parse(include_str!("../../examples/config.yaml")).unwrap();
        let r = RolloutConfig::resolve(cfg.rollout, None, None).unwrap();
        assert!(!r.enabled && !r.dry_run);
        assert_eq!(r.daemonsets, RolloutSettings::default());
        let reg = r.registry.unwrap();
        assert_eq!(
            reg.repository,
            "registry.example/kudos/device-plugin-derived"
        );
        assert!(matches!(
            reg.credentials,
            CredentialSource::DockerConfigFile { .. }
        ));
        assert_eq!(reg.retry.max_attempts, 4);
    }

    #[test]
    fn absent_section_is_off() {
        let s = resolve("", &[]).unwrap();
        assert!(!s.rollout.enabled);
        assert!(s.rollout.registry.is_none());
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = resolve("rollout:\n  baseImg: x\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout") && e.contains("baseImg"), "{e}");
        let e = resolve("rollout:\n  daemonSet:\n    tolerationz: []\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rollout.daemonSet") && e.contains("tolerationz"),
            "{e}"
        );
        let e = resolve("rollout:\n  plainHttp: sometimes\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.plainHttp"), "{e}");
    }

    #[test]
    fn invalid_values_name_their_field() {
        let e = resolve("rollout:\n  enabled: true\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.baseImage"), "{e}");
        let e = resolve("", &["--rollout"]).unwrap_err().to_string();
        assert!(e.contains("rollout.baseImage"), "{e}");
        let e = resolve("rollout:\n  baseImage: a/b:1\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.repository"), "{e}");
        let e = resolve(
            "rollout:\n  baseImage: a/b:1\n  repository: 'Bad Ref'\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rollout.repository"), "{e}");
        let e = resolve(
            "rollout:\n  credentials:\n    file: /x\n    secret: {namespace: a, name: b}\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rollout.credentials"), "{e}");
        let e = resolve("rollout:\n  resyncSeconds: 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.resyncSeconds"), "{e}");
        let e = resolve(
            "rollout:\n  daemonSet: {podTemplateFrom: Not_A_Name}\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rollout.daemonSet.podTemplateFrom"), "{e}");
    }

    #[test]
    fn flags_override_the_file_and_dry_run_implies_enabled() {
        let yaml = "rollout:\n  enabled: true\n  baseImage: 127.0.0.1:5000/p:base\n  repository: 127.0.0.1:5000/p-derived\n  credentials:\n    secret: {namespace: kudos-system, name: reg}\n  daemonSet:\n    namespace: gpu-plugins\n    limits: {cpu: 100m}\n";
        let s = resolve(yaml, &[]).unwrap();
        assert!(s.rollout.enabled && !s.rollout.dry_run);
        assert_eq!(s.rollout.daemonsets.namespace, "gpu-plugins");
        assert_eq!(s.rollout.daemonsets.limits["cpu"], "100m");
        assert_eq!(
            s.rollout.daemonsets.tolerations,
            RolloutSettings::default().tolerations,
            "missing fields keep their defaults"
        );
        assert!(!resolve(yaml, &["--rollout=false"]).unwrap().rollout.enabled);
        let s = resolve("", &["--dry-run-rollout"]).unwrap();
        assert!(s.rollout.enabled && s.rollout.dry_run && s.rollout.registry.is_none());
    }
}
