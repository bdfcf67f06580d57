//! Input bounds both ends of every protocol enforce.
//!
//! A sender checks before it sends and a receiver checks what it receives, with the same
//! constants, so a value one side accepts is never refused by the other (the first wave's
//! device plugin accepted 21-character vendor names the orchestrator refused). The bounds
//! also keep state keyed by these values bounded.

/// Longest vendor key (`nvidia`). It becomes part of DaemonSet, pod and image-tag names, so a
/// group of two vendors still fits in [`MAX_PLUGIN_GROUP_LEN`].
pub const MAX_VENDOR_NAME_LEN: usize = 20;
/// Longest plugin group name (sorted vendor keys joined by `-`); DaemonSet and pod names add
/// a prefix and suffix and must stay within 63 characters.
pub const MAX_PLUGIN_GROUP_LEN: usize = 40;
/// Longest device ID: the kubelet stores IDs in checkpoints and CDI names, and 63 keeps them
/// valid label values too.
pub const MAX_DEVICE_ID_LEN: usize = 63;
/// Longest model name (NVML's own buffer for a device name is 96 bytes).
pub const MAX_MODEL_NAME_LEN: usize = 96;
/// Longest device UUID or PCI bus ID.
pub const MAX_DEVICE_UUID_LEN: usize = 96;
/// Longest plugin version string.
pub const MAX_PLUGIN_VERSION_LEN: usize = 64;
/// Longest class name: it is a label value.
pub const MAX_CLASS_NAME_LEN: usize = 63;
/// Longest node name: a DNS subdomain.
pub const MAX_NODE_NAME_LEN: usize = 253;
/// Longest run-report ID.
pub const MAX_REPORT_ID_LEN: usize = 256;
/// Most devices one node's plugin reports, and most device IDs in one kubelet request
/// (`Allocate`, `GetPreferredAllocation`). Sixteen GPUs split into seven MIG slices each is
/// 112; the bound leaves room above that.
pub const MAX_DEVICES_PER_NODE: usize = 256;

/// A value outside the bounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    /// Empty where a value is required.
    #[error("{what} must not be empty")]
    Empty {
        /// The field.
        what: &'static str,
    },
    /// Longer than allowed.
    #[error("{what} {value:?} is {len} bytes long, more than {max}")]
    TooLong {
        /// The field.
        what: &'static str,
        /// The value, cut to 80 bytes so one bad input cannot flood a log.
        value: String,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Characters or shape not allowed.
    #[error("{what} {value:?} must be {expected}")]
    Syntax {
        /// The field.
        what: &'static str,
        /// The value, cut to 80 bytes.
        value: String,
        /// What is allowed.
        expected: &'static str,
    },
    /// More items than allowed.
    #[error("{what}: {count} is more than {max}")]
    TooMany {
        /// The list.
        what: &'static str,
        /// Items given.
        count: usize,
        /// The bound.
        max: usize,
    },
}

/// `value` cut to at most 80 bytes on a character boundary, for error messages.
fn excerpt(value: &str) -> String {
    let mut end = value.len().min(80);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_owned()
}

fn check_len(what: &'static str, value: &str, max: usize) -> Result<(), BoundsError> {
    if value.is_empty() {
        return Err(BoundsError::Empty { what });
    }
    if value.len() > max {
        return Err(BoundsError::TooLong {
            what,
            value: excerpt(value),
            len: value.len(),
            max,
        });
    }
    Ok(())
}

fn syntax(what: &'static str, value: &str, expected: &'static str) -> BoundsError {
    BoundsError::Syntax {
        what,
        value: excerpt(value),
        expected,
    }
}

/// Whether `s` is a DNS-1123 label: lowercase alphanumerics and `-`, alphanumeric at both
/// ends (length checked by the caller).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain, as Kubernetes object names (nodes, schedulers) are:
/// at most 253 characters of dot-separated DNS labels of at most 63.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NODE_NAME_LEN && s.split('.').all(|l| l.len() <= 63 && is_dns_label(l))
}

/// A vendor key: a lowercase DNS label of at most [`MAX_VENDOR_NAME_LEN`] characters.
pub fn validate_vendor_name(vendor: &str) -> Result<(), BoundsError> {
    check_len("vendor name", vendor, MAX_VENDOR_NAME_LEN)?;
    if !is_dns_label(vendor) {
        return Err(syntax(
            "vendor name",
            vendor,
            "a lowercase DNS label (a-z, 0-9, '-')",
        ));
    }
    Ok(())
}

/// A plugin group name: at most [`MAX_PLUGIN_GROUP_LEN`] characters.
pub fn validate_plugin_group(group: &str) -> Result<(), BoundsError> {
    check_len("plugin group", group, MAX_PLUGIN_GROUP_LEN)?;
    if !is_dns_label(group) {
        return Err(syntax("plugin group", group, "a lowercase DNS label"));
    }
    Ok(())
}

/// A device ID: 1..=[`MAX_DEVICE_ID_LEN`] characters of `[A-Za-z0-9-_.:]`.
pub fn validate_device_id(id: &str) -> Result<(), BoundsError> {
    check_len("device ID", id, MAX_DEVICE_ID_LEN)?;
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err(syntax("device ID", id, "characters of [A-Za-z0-9-_.:]"));
    }
    Ok(())
}

/// A model name: printable, at most [`MAX_MODEL_NAME_LEN`] bytes; may be empty (unknown).
pub fn validate_model_name(model: &str) -> Result<(), BoundsError> {
    if model.is_empty() {
        return Ok(());
    }
    check_len("model name", model, MAX_MODEL_NAME_LEN)?;
    if model.chars().any(char::is_control) {
        return Err(syntax("model name", model, "free of control characters"));
    }
    Ok(())
}

/// A device UUID or PCI bus ID: printable ASCII, at most [`MAX_DEVICE_UUID_LEN`] bytes; may be
/// empty (unknown).
pub fn validate_device_uuid(uuid: &str) -> Result<(), BoundsError> {
    if uuid.is_empty() {
        return Ok(());
    }
    check_len("device UUID", uuid, MAX_DEVICE_UUID_LEN)?;
    if !uuid.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(syntax(
            "device UUID",
            uuid,
            "printable ASCII without spaces",
        ));
    }
    Ok(())
}

/// A plugin version: at most [`MAX_PLUGIN_VERSION_LEN`] bytes; may be empty.
pub fn validate_plugin_version(version: &str) -> Result<(), BoundsError> {
    if version.is_empty() {
        return Ok(());
    }
    check_len("plugin version", version, MAX_PLUGIN_VERSION_LEN)?;
    if !version.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(syntax(
            "plugin version",
            version,
            "printable ASCII without spaces",
        ));
    }
    Ok(())
}

/// A class name: a valid label value of 1..=[`MAX_CLASS_NAME_LEN`] characters.
pub fn validate_class_name(class: &str) -> Result<(), BoundsError> {
    check_len("class name", class, MAX_CLASS_NAME_LEN)?;
    let b = class.as_bytes();
    let ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if !ok {
        return Err(syntax(
            "class name",
            class,
            "a label value ([A-Za-z0-9-_.], alphanumeric at both ends)",
        ));
    }
    Ok(())
}

/// A node name: a DNS-1123 subdomain of at most [`MAX_NODE_NAME_LEN`] characters.
pub fn validate_node_name(node: &str) -> Result<(), BoundsError> {
    check_len("node name", node, MAX_NODE_NAME_LEN)?;
    if !is_dns_subdomain(node) {
        return Err(syntax("node name", node, "a lowercase DNS subdomain"));
    }
    Ok(())
}

/// A run-report ID: 1..=[`MAX_REPORT_ID_LEN`] bytes.
pub fn validate_report_id(id: &str) -> Result<(), BoundsError> {
    check_len("report ID", id, MAX_REPORT_ID_LEN)
}

/// The number of devices in one report or one kubelet request: at most
/// [`MAX_DEVICES_PER_NODE`].
pub fn validate_device_count(what: &'static str, count: usize) -> Result<(), BoundsError> {
    if count > MAX_DEVICES_PER_NODE {
        return Err(BoundsError::TooMany {
            what,
            count,
            max: MAX_DEVICES_PER_NODE,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_names_are_short_dns_labels() {
        for ok in ["nvidia", "amd", "intel-gaudi", "a1"] {
            assert_eq!(validate_vendor_name(ok), Ok(()), "{ok}");
        }
        assert!(matches!(
            validate_vendor_name(&"a".repeat(21)),
            Err(BoundsError::TooLong {
                len: 21,
                max: 20,
                ..
            })
        ));
        assert_eq!(validate_vendor_name(&"a".repeat(20)), Ok(()));
        for bad in ["NVIDIA", "-amd", "amd-", "a_b", "a.b"] {
            assert!(
                matches!(validate_vendor_name(bad), Err(BoundsError::Syntax { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            validate_vendor_name(""),
            Err(BoundsError::Empty {
                what: "vendor name"
            })
        );
    }

    #[test]
    fn device_ids_node_names_and_classes() {
        assert_eq!(validate_device_id("nv-GPU-0a:1_2.3"), Ok(()));
        assert!(validate_device_id(&"x".repeat(64)).is_err());
        assert!(validate_device_id("nv gpu").is_err());
        assert_eq!(validate_node_name("node-1.example.com"), Ok(()));
        assert!(validate_node_name("Node_1").is_err());
        assert!(validate_node_name(&"a".repeat(254)).is_err());
        assert_eq!(validate_class_name("resnet50.v2"), Ok(()));
        assert!(validate_class_name("-x").is_err());
        assert!(validate_class_name(&"c".repeat(64)).is_err());
        assert_eq!(validate_model_name(""), Ok(()));
        assert!(validate_model_name("H100\n").is_err());
        assert!(validate_device_count("devices", MAX_DEVICES_PER_NODE).is_ok());
        assert!(validate_device_count("devices", MAX_DEVICES_PER_NODE + 1).is_err());
    }

    #[test]
    fn errors_quote_at_most_80_bytes_of_the_value() {
        let long = "é".repeat(1000);
        let e = validate_model_name(&long).expect_err("too long");
        let BoundsError::TooLong { value, len, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(value.len() <= 80 && *len == 2000);
        assert!(e.to_string().len() < 200, "{e}");
    }
}
