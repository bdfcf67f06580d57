//! The prepared claims, on disk, so a plugin restart loses none: after a restart the kubelet
//! may unprepare a claim prepared before it, or prepare it again (idempotently), and neither
//! needs the API server.
//!
//! One JSON file in the plugin's data directory (`<plugins>/gpu.kudos.dev/checkpoint.json`),
//! written atomically after every change, with a version and a checksum (64-bit FNV-1a of the
//! serialized claims). A file that does not parse, has another version or a wrong checksum is
//! moved aside (`checkpoint.json.damaged-<unix time>`) and the plugin starts empty: the CDI
//! files are named by claim UID, so unpreparing an unknown claim still removes its spec, and
//! preparing it again asks the API server.

use super::cdi;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file format version.
pub const VERSION: &str = "v1";

/// Checkpoint errors (only I/O: damage is handled by moving the file aside).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading, writing or moving the file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// One device of a prepared claim, as answered to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedDevice {
    /// The claim's requests this device serves.
    pub request_names: Vec<String>,
    /// Pool (the node name).
    pub pool_name: String,
    /// DRA device name.
    pub device_name: String,
    /// CDI device IDs passed to the runtime.
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreparedClaim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// What NodePrepareResources answered.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec written (re-written from here if the file went missing).
    pub cdi_spec: cdi::Spec,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    version: String,
    checksum: String,
    claims: BTreeMap<String, PreparedClaim>,
}

/// What loading found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No file: nothing prepared.
    Fresh,
    /// This many prepared claims restored.
    Restored(usize),
    /// The file was damaged and moved to `to`; starting empty.
    MovedAside {
        /// Where the damaged file went.
        to: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Prepared claims by claim UID, mirrored to a file.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    claims: BTreeMap<String, PreparedClaim>,
}

/// 64-bit FNV-1a, hex: stable across releases and platforms.
fn checksum(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

fn encode_claims(claims: &BTreeMap<String, PreparedClaim>) -> Vec<u8> {
    // Plain data with string keys: serializing cannot fail.
    serde_json::to_vec(claims).unwrap_or_default()
}

/// Why `bytes` is not a usable checkpoint, or its claims.
fn decode(bytes: &[u8]) -> Result<BTreeMap<String, PreparedClaim>, String> {
    let file: File = serde_json::from_slice(bytes).map_err(|e| format!("does not parse: {e}"))?;
    if file.version != VERSION {
        return Err(format!(
            "version {:?}, this plugin reads {VERSION:?}",
            file.version
        ));
    }
    let sum = checksum(&encode_claims(&file.claims));
    if sum != file.checksum {
        return Err(format!(
            "checksum {} does not match the content ({sum})",
            file.checksum
        ));
    }
    Ok(file.claims)
}

impl Checkpoint {
    /// Loads the checkpoint at `path`; a damaged one is moved aside (see the module docs).
    pub fn load(path: &Path) -> Result<(Checkpoint, Loaded), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Checkpoint::empty(path), Loaded::Fresh));
            }
            Err(e) => return Err(io(e)),
        };
        match decode(&bytes) {
            Ok(claims) => {
                let n = claims.len();
                Ok((
                    Checkpoint {
                        path: path.to_owned(),
                        claims,
                    },
                    Loaded::Restored(n),
                ))
            }
            Err(reason) => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let mut to = path.as_os_str().to_owned();
                to.push(format!(".damaged-{secs}"));
                let to = PathBuf::from(to);
                std::fs::rename(path, &to).map_err(io)?;
                Ok((Checkpoint::empty(path), Loaded::MovedAside { to, reason }))
            }
        }
    }

    fn empty(path: &Path) -> Checkpoint {
        Checkpoint {
            path: path.to_owned(),
            claims: BTreeMap::new(),
        }
    }

    /// The prepared claim with this UID.
    pub fn get(&self, uid: &str) -> Option<&PreparedClaim> {
        self.claims.get(uid)
    }

    /// Prepared claims.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether nothing is prepared.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Records a prepared claim and writes the file; on failure nothing changes.
    pub fn insert(&mut self, uid: &str, claim: PreparedClaim) -> Result<(), CheckpointError> {
        let previous = self.claims.insert(uid.to_owned(), claim);
        let written = self.write();
        if written.is_err() {
            match previous {
                Some(p) => self.claims.insert(uid.to_owned(), p),
                None => self.claims.remove(uid),
            };
        }
        written
    }

    /// Forgets a claim and writes the file; returns whether it was known. On failure nothing
    /// changes.
    pub fn remove(&mut self, uid: &str) -> Result<bool, CheckpointError> {
        let Some(previous) = self.claims.remove(uid) else {
            return Ok(false);
        };
        if let Err(e) = self.write() {
            self.claims.insert(uid.to_owned(), previous);
            return Err(e);
        }
        Ok(true)
    }

    fn write(&self) -> Result<(), CheckpointError> {
        let claims = encode_claims(&self.claims);
        // The claims are embedded as already-encoded JSON so the checksum covers exactly the
        // bytes a reader re-encodes.
        let file = format!(
            "{{\"version\":\"{VERSION}\",\"checksum\":\"{}\",\"claims\":{}}}\n",
            checksum(&claims),
            String::from_utf8_lossy(&claims)
        );
        super::write_atomic(&self.path, file.as_bytes()).map_err(|source| CheckpointError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> PreparedClaim {
        PreparedClaim {
            namespace: "ml".into(),
            name: name.into(),
            devices: vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "nv-gpu-1".into(),
                cdi_device_ids: vec![cdi::qualified("u-1-nv-gpu-1")],
            }],
            cdi_spec: cdi::spec(vec![]),
        }
    }

    #[test]
    fn prepared_claims_survive_a_reload() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("plugin/checkpoint.json");
        let (mut cp, loaded) = Checkpoint::load(&path).expect("load");
        assert_eq!(loaded, Loaded::Fresh);
        cp.insert("u-1", claim("a")).expect("insert");
        cp.insert("u-2", claim("b")).expect("insert");
        assert!(cp.remove("u-2").expect("remove"));
        assert!(!cp.remove("u-9").expect("unknown"));
        let (back, loaded) = Checkpoint::load(&path).expect("reload");
        assert_eq!(loaded, Loaded::Restored(1));
        assert_eq!(back.get("u-1"), Some(&claim("a")));
        assert!(back.get("u-2").is_none());
    }

    #[test]
    fn a_damaged_checkpoint_is_moved_aside_not_trusted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("checkpoint.json");
        let (mut cp, _) = Checkpoint::load(&path).expect("load");
        cp.insert("u-1", claim("a")).expect("insert");
        let good = std::fs::read_to_string(&path).expect("read");
        let cases = [
            ("truncated", good[..good.len() / 2].to_string(), "parse"),
            ("edited", good.replace("node-a", "node-b"), "checksum"),
            ("future", good.replace("\"v1\"", "\"v2\""), "version"),
            ("empty", String::new(), "parse"),
            ("binary", "\u{0}\u{1}garbage".into(), "parse"),
        ];
        for (what, text, says) in cases {
            std::fs::write(&path, &text).expect("write");
            let (cp, loaded) = Checkpoint::load(&path).expect(what);
            assert!(cp.is_empty(), "{what}");
            let Loaded::MovedAside { to, reason } = loaded else {
                panic!("{what}: {loaded:?}")
            };
            assert!(reason.contains(says), "{what}: {reason}");
            assert_eq!(std::fs::read_to_string(&to).expect("kept"), text, "{what}");
            assert!(!path.exists(), "{what}");
            std::fs::remove_file(&to).expect("clean");
        }
        // The untouched file still loads.
        std::fs::write(&path, &good).expect("write");
        assert_eq!(
            Checkpoint::load(&path).expect("load").1,
            Loaded::Restored(1)
        );
    }

    #[test]
    fn a_failed_write_changes_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // The checkpoint's directory is a file: every write fails.
        std::fs::write(tmp.path().join("dir"), "").expect("write");
        let mut cp = Checkpoint::empty(&tmp.path().join("dir/checkpoint.json"));
        assert!(cp.insert("u-1", claim("a")).is_err());
        assert!(cp.is_empty());
    }
}
