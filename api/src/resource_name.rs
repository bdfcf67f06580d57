//! The unified resource name: its default, and the kubelet's extended-resource-name rules
//! (`IsExtendedResourceName` in k8s.io/kubernetes/pkg/apis/core/v1/helper). The orchestrator
//! checks a configured name and the device plugin checks the name it is given with the same
//! function, because the kubelet answers a bad name only with a registration error in its own
//! log.

/// Why a name is not a valid extended resource name.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    /// No `domain/` prefix: that is a native resource.
    #[error("{0:?} has no domain prefix (e.g. kudos.dev/gpu)")]
    NoDomain(String),
    /// Under `kubernetes.io/`, which is reserved for native resources.
    #[error("{0:?} is in the reserved kubernetes.io domain")]
    Reserved(String),
    /// Starts with `requests.`, which is reserved for quota.
    #[error("{0:?} starts with the reserved prefix requests.")]
    RequestsPrefix(String),
    /// Not a qualified name: DNS-1123 subdomain prefix, and a name of at most 63 characters
    /// of `[A-Za-z0-9._-]` starting and ending alphanumeric.
    #[error("{0:?} is not a qualified name: {1}")]
    Syntax(String, &'static str),
}

/// Default unified resource name every vendor's devices are registered under.
pub const DEFAULT_UNIFIED_RESOURCE_NAME: &str = "kudos.dev/gpu";

/// Checks `name` against the kubelet's rules.
pub fn validate(name: &str) -> Result<(), ResourceNameError> {
    let Some((prefix, local)) = name.split_once('/') else {
        return Err(ResourceNameError::NoDomain(name.into()));
    };
    if name.contains("kubernetes.io/") {
        return Err(ResourceNameError::Reserved(name.into()));
    }
    if name.starts_with("requests.") {
        return Err(ResourceNameError::RequestsPrefix(name.into()));
    }
    let syntax = |why| ResourceNameError::Syntax(name.into(), why);
    // The kubelet validates "requests." + name, so the prefix gets 9 characters less.
    if prefix.is_empty() || prefix.len() + "requests.".len() > 253 {
        return Err(syntax("prefix must be 1..=244 characters"));
    }
    for label in prefix.split('.') {
        let b = label.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric();
        if !ok {
            return Err(syntax("prefix must be a lower-case DNS subdomain"));
        }
    }
    let b = local.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if !ok {
        return Err(syntax(
            "name must be 1..=63 of [A-Za-z0-9._-], alphanumeric at both ends",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_domain_prefixed_names() {
        for n in [
            "kudos.dev/gpu",
            "nvidia.com/gpu",
            "amd.com/gpu",
            "example.com/GPU_v2.big",
            "a/b",
        ] {
            assert_eq!(validate(n), Ok(()), "{n}");
        }
    }

    #[test]
    fn rejects_what_the_kubelet_rejects() {
        assert!(matches!(
            validate("gpu"),
            Err(ResourceNameError::NoDomain(_))
        ));
        assert!(matches!(
            validate("kubernetes.io/gpu"),
            Err(ResourceNameError::Reserved(_))
        ));
        assert!(matches!(
            validate("foo.kubernetes.io/gpu"),
            Err(ResourceNameError::Reserved(_))
        ));
        assert!(matches!(
            validate("requests.kudos.dev/gpu"),
            Err(ResourceNameError::RequestsPrefix(_))
        ));
        for n in [
            "/gpu",
            "kudos.dev/",
            "Kudos.dev/gpu",
            "kudos..dev/gpu",
            "kudos.dev/-gpu",
            "kudos.dev/g/pu",
            "kudos.dev/g pu",
        ] {
            assert!(
                matches!(validate(n), Err(ResourceNameError::Syntax(..))),
                "{n}"
            );
        }
        assert!(validate(&format!("kudos.dev/{}", "g".repeat(64))).is_err());
        assert!(validate(&format!("{}/gpu", "a".repeat(250))).is_err());
    }
}
