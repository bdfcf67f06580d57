//! Pure image construction: the configuration layer, the derived image config and manifest.
//!
//! Everything here is a function of its inputs — no clock, no registry — so the same plugin
//! configuration on the same base image always yields the same layer, config and manifest
//! bytes, and therefore the same digest. That is what makes re-derivation idempotent and
//! keeps DaemonSets from rolling when nothing changed:
//! - tar entries are sorted, with mtime 0, uid/gid 0, modes 0755/0644 and no user names;
//! - gzip has mtime 0, no file name and a fixed OS byte;
//! - JSON is written with sorted keys and no timestamps of our own;
//! - `rootfs.diff_ids` gets the sha256 of the *uncompressed* tar, as the OCI image spec asks.

use std::collections::BTreeMap;
use std::io::Write;

use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE, IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
    IMAGE_LAYER_GZIP_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor,
    OciImageManifest,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use kudos_api::env::{self, DEFAULT_PLUGIN_CONFIG_DIR};
use kudos_api::{PluginConfig, PluginGroup, VendorPluginConfig};

/// Manifest annotation: the base image's reference (OCI pre-defined annotation).
pub const ANNOTATION_BASE_NAME: &str = "org.opencontainers.image.base.name";
/// Manifest annotation: the base image's manifest digest (OCI pre-defined annotation).
pub const ANNOTATION_BASE_DIGEST: &str = "org.opencontainers.image.base.digest";

/// Errors building a derived image from a base image's config and manifest.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Writing the tar or gzip stream failed (in memory, so only on a bug).
    #[error("building the configuration layer")]
    Layer(#[source] std::io::Error),
    /// A plugin configuration file could not be serialized.
    #[error("serializing a plugin configuration file")]
    Serialize(#[source] serde_json::Error),
    /// The base image config is not valid JSON.
    #[error("base image config is not JSON")]
    BaseConfigJson(#[source] serde_json::Error),
    /// The base image config lacks a required part, or does not match its manifest.
    #[error("base image config is unusable: {0}")]
    BaseConfig(String),
}

/// The configuration layer of a derived image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigLayer {
    /// The gzip-compressed tar, as pushed.
    pub compressed: Vec<u8>,
    /// `sha256:` of the compressed bytes: the layer's descriptor digest.
    pub digest: String,
    /// `sha256:` of the uncompressed tar: the layer's `diff_id`.
    pub diff_id: String,
    /// Size of the uncompressed tar in bytes.
    pub uncompressed_size: usize,
}

/// The tag a derived image is pushed under: `<group>-g<generation>`. Tags are for humans;
/// Kubernetes gets the digest.
pub fn derive_tag(group: &str, generation: u64) -> String {
    format!("{group}-g{generation}")
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// The files a group's configuration layer carries: `etc/kudos/plugin/<vendor>.json`,
/// written with the writer the device plugin's reader pairs with (`kudos-api`).
pub fn group_config_files(
    view: &PluginConfig,
    group: &PluginGroup,
) -> Result<BTreeMap<String, Vec<u8>>, ImageError> {
    let dir = DEFAULT_PLUGIN_CONFIG_DIR.trim_start_matches('/');
    let mut files = BTreeMap::new();
    for cfg in view.vendor_configs(group) {
        let body = cfg.to_file_bytes().map_err(ImageError::Serialize)?;
        let name = VendorPluginConfig::file_name(&cfg.vendor);
        files.insert(format!("{dir}/{name}"), body);
    }
    Ok(files)
}

/// Builds a deterministic gzip'd tar layer from relative paths → contents. Parent
/// directories are added as entries of their own.
pub fn build_layer(files: &BTreeMap<String, Vec<u8>>) -> Result<ConfigLayer, ImageError> {
    // Path → Some(contents) for files, None for directories; BTreeMap sorts them.
    let mut entries: BTreeMap<String, Option<&[u8]>> = BTreeMap::new();
    for (path, body) in files {
        let path = path.trim_start_matches('/');
        let mut parent = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            parent.push_str(part);
            parent.push('/');
            entries.entry(parent.clone()).or_insert(None);
        }
        entries.insert(path.to_string(), Some(body));
    }
    let mut builder = tar::Builder::new(Vec::new());
    for (path, body) in &entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match body {
            Some(body) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(body.len() as u64);
                builder
                    .append_data(&mut header, path, *body)
                    .map_err(ImageError::Layer)?;
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, path, std::io::empty())
                    .map_err(ImageError::Layer)?;
            }
        }
    }
    let tar = builder.into_inner().map_err(ImageError::Layer)?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).map_err(ImageError::Layer)?;
    let compressed = gz.finish().map_err(ImageError::Layer)?;
    Ok(ConfigLayer {
        digest: sha256_digest(&compressed),
        diff_id: sha256_digest(&tar),
        uncompressed_size: tar.len(),
        compressed,
    })
}

/// The env a derived image sets for its group.
pub fn group_env(view: &PluginConfig, group: &PluginGroup) -> Vec<(String, String)> {
    vec![
        (
            env::RESOURCE_NAME.into(),
            view.unified_resource_name.clone(),
        ),
        (
            env::VENDOR.into(),
            group.vendors.join(&env::VENDOR_SEPARATOR.to_string()),
        ),
        (
            env::PLUGIN_CONFIG_DIR.into(),
            DEFAULT_PLUGIN_CONFIG_DIR.into(),
        ),
    ]
}

/// Derives the image config: the base config with `env` set (replacing variables of the same
/// name), the layer's `diff_id` appended to `rootfs.diff_ids`, and a history entry when the
/// base keeps history. Unknown fields of the base config are kept.
pub fn derive_config(
    base_config: &str,
    base_layers: usize,
    layer: &ConfigLayer,
    env: &[(String, String)],
    group: &str,
) -> Result<Vec<u8>, ImageError> {
    let mut root: Value = serde_json::from_str(base_config).map_err(ImageError::BaseConfigJson)?;
    let obj = root
        .as_object_mut()
        .ok_or_else(|| ImageError::BaseConfig("config is not an object".into()))?;

    let rootfs = obj
        .get_mut("rootfs")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ImageError::BaseConfig("no rootfs".into()))?;
    let diff_ids = rootfs
        .get_mut("diff_ids")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| ImageError::BaseConfig("no rootfs.diff_ids".into()))?;
    if diff_ids.len() != base_layers {
        return Err(ImageError::BaseConfig(format!(
            "{} diff_ids for {base_layers} layers",
            diff_ids.len()
        )));
    }
    diff_ids.push(Value::String(layer.diff_id.clone()));

    let config = obj
        .entry("config")
        .or_insert_with(|| Value::Object(Default::default()));
    if config.is_null() {
        *config = Value::Object(Default::default());
    }
    let config = config
        .as_object_mut()
        .ok_or_else(|| ImageError::BaseConfig("config.config is not an object".into()))?;
    let mut vars: Vec<String> = match config.get("Env") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    for (name, value) in env {
        let prefix = format!("{name}=");
        vars.retain(|v| !v.starts_with(&prefix));
        vars.push(format!("{name}={value}"));
    }
    config.insert(
        "Env".into(),
        Value::Array(vars.into_iter().map(Value::String).collect()),
    );

    if let Some(Value::Array(history)) = obj.get_mut("history") {
        history.push(serde_json::json!({
            "created_by": format!("kudos-orchestrator: plugin configuration for group {group}"),
            "comment": "derived by kudos-rollout",
        }));
    }
    serde_json::to_vec(&root).map_err(ImageError::BaseConfigJson)
}

/// Derives the manifest: base layers (Docker layer media types mapped to their OCI
/// equivalents) plus the configuration layer, the new config, OCI media types throughout and
/// the base image recorded in the OCI `base.name`/`base.digest` annotations.
pub fn derive_manifest(
    base: &OciImageManifest,
    base_name: &str,
    base_digest: &str,
    config: &[u8],
    layer: &ConfigLayer,
) -> OciImageManifest {
    let mut layers: Vec<OciDescriptor> = base
        .layers
        .iter()
        .map(|l| {
            let mut l = l.clone();
            if l.media_type == IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE {
                l.media_type = IMAGE_LAYER_GZIP_MEDIA_TYPE.into();
            } else if l.media_type == IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE {
                l.media_type = IMAGE_LAYER_MEDIA_TYPE.into();
            }
            l
        })
        .collect();
    layers.push(OciDescriptor {
        media_type: IMAGE_LAYER_GZIP_MEDIA_TYPE.into(),
        digest: layer.digest.clone(),
        size: layer.compressed.len() as i64,
        ..OciDescriptor::default()
    });
    let mut annotations = base.annotations.clone().unwrap_or_default();
    annotations.insert(ANNOTATION_BASE_NAME.into(), base_name.into());
    annotations.insert(ANNOTATION_BASE_DIGEST.into(), base_digest.into());
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.into()),
        config: OciDescriptor {
            media_type: IMAGE_CONFIG_MEDIA_TYPE.into(),
            digest: sha256_digest(config),
            size: config.len() as i64,
            ..OciDescriptor::default()
        },
        layers,
        subject: None,
        artifact_type: None,
        annotations: Some(annotations),
    }
}

/// The exact manifest bytes pushed; the image digest is their sha256.
pub fn manifest_bytes(manifest: &OciImageManifest) -> Result<Vec<u8>, ImageError> {
    serde_json::to_vec(manifest).map_err(ImageError::Serialize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::mk_view;

    const BASE_CONFIG: &str = r#"{"architecture":"amd64","os":"linux","created":"2026-01-01T00:00:00Z",
        "config":{"Env":["PATH=/bin","KUDOS_VENDOR=old"],"Entrypoint":["/kudos-device-plugin"]},
        "rootfs":{"type":"layers","diff_ids":["sha256:aa"]},"history":[{"created_by":"base"}]}"#;

    fn layer() -> ConfigLayer {
        let v = mk_view();
        let g = &v.groups().unwrap()[2];
        build_layer(&group_config_files(&v, g).unwrap()).unwrap()
    }

    #[test]
    fn tag_is_group_and_generation() {
        assert_eq!(derive_tag("nvidia", 42), "nvidia-g42");
        assert_eq!(derive_tag("amd-nvidia", 0), "amd-nvidia-g0");
    }

    #[test]
    fn layer_is_deterministic_and_diff_id_is_of_uncompressed_tar() {
        let a = layer();
        let b = layer();
        assert_eq!(a, b);
        let mut tar = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(a.compressed.as_slice()),
            &mut tar,
        )
        .unwrap();
        assert_eq!(sha256_digest(&tar), a.diff_id);
        assert_eq!(sha256_digest(&a.compressed), a.digest);
        assert_eq!(tar.len(), a.uncompressed_size);
    }

    #[test]
    fn layer_entries_sorted_with_fixed_owner_mode_and_mtime() {
        let l = layer();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(l.compressed.as_slice()));
        let mut seen = Vec::new();
        for e in archive.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(
                (h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()),
                (0, 0, 0)
            );
            let dir = h.entry_type().is_dir();
            assert_eq!(h.mode().unwrap(), if dir { 0o755 } else { 0o644 });
            seen.push(e.path().unwrap().display().to_string());
        }
        assert_eq!(
            seen,
            [
                "etc/",
                "etc/kudos/",
                "etc/kudos/plugin/",
                "etc/kudos/plugin/nvidia.json"
            ]
        );
    }

    #[test]
    fn layer_changes_only_with_the_group_slice() {
        let v = mk_view();
        let groups = v.groups().unwrap();
        let before = build_layer(&group_config_files(&v, &groups[2]).unwrap()).unwrap();
        // Another group's node changes; the nvidia group's layer must not.
        let mut w = v.clone();
        w.generation += 1;
        w.nodes
            .get_mut("n3")
            .unwrap()
            .get_mut("amd")
            .unwrap()
            .devices
            .clear();
        let same = build_layer(&group_config_files(&w, &w.groups().unwrap()[2]).unwrap()).unwrap();
        assert_eq!(before, same);
        w.nodes
            .get_mut("n1")
            .unwrap()
            .get_mut("nvidia")
            .unwrap()
            .devices
            .clear();
        let changed =
            build_layer(&group_config_files(&w, &w.groups().unwrap()[2]).unwrap()).unwrap();
        assert_ne!(before.diff_id, changed.diff_id);
    }

    #[test]
    fn config_appends_diff_id_and_sets_env() {
        let l = layer();
        let env = vec![
            (env::RESOURCE_NAME.to_string(), "kudos.dev/gpu".to_string()),
            (env::VENDOR.to_string(), "nvidia".to_string()),
        ];
        let out = derive_config(BASE_CONFIG, 1, &l, &env, "nvidia").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["rootfs"]["diff_ids"][1], Value::String(l.diff_id.clone()));
        let vars: Vec<&str> = v["config"]["Env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(
            vars,
            [
                "PATH=/bin",
                "KUDOS_RESOURCE_NAME=kudos.dev/gpu",
                "KUDOS_VENDOR=nvidia"
            ]
        );
        assert_eq!(v["config"]["Entrypoint"][0], "/kudos-device-plugin");
        assert_eq!(v["history"].as_array().unwrap().len(), 2);
        assert_eq!(v["created"], "2026-01-01T00:00:00Z");
        assert_eq!(
            out,
            derive_config(BASE_CONFIG, 1, &l, &env, "nvidia").unwrap()
        );
        assert!(matches!(
            derive_config(BASE_CONFIG, 2, &l, &env, "nvidia"),
            Err(ImageError::BaseConfig(_))
        ));
        assert!(matches!(
            derive_config("[]", 0, &l, &env, "nvidia"),
            Err(ImageError::BaseConfig(_))
        ));
    }

    #[test]
    fn manifest_has_media_types_and_base_annotations() {
        let l = layer();
        let base = OciImageManifest {
            layers: vec![OciDescriptor {
                media_type: IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE.into(),
                digest: "sha256:bb".into(),
                size: 3,
                ..OciDescriptor::default()
            }],
            ..Default::default()
        };
        let m = derive_manifest(&base, "reg/base:1", "sha256:cc", b"{}", &l);
        assert_eq!(m.media_type.as_deref(), Some(OCI_IMAGE_MEDIA_TYPE));
        assert_eq!(m.config.media_type, IMAGE_CONFIG_MEDIA_TYPE);
        assert_eq!(m.config.digest, sha256_digest(b"{}"));
        assert_eq!(m.layers.len(), 2);
        assert_eq!(m.layers[0].media_type, IMAGE_LAYER_GZIP_MEDIA_TYPE);
        assert_eq!(m.layers[1].digest, l.digest);
        let ann = m.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_BASE_DIGEST], "sha256:cc");
        let bytes = manifest_bytes(&m).unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["mediaType"], OCI_IMAGE_MEDIA_TYPE);
        assert_eq!(v["schemaVersion"], 2);
    }
}
