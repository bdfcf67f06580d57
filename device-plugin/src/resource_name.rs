//! The kubelet's extended-resource-name rules (`IsExtendedResourceName` in
//! k8s.io/kubernetes/pkg/apis/core/v1/helper), checked before we register, because the kubelet
//! answers a bad name only with a registration error in its own log.

/// Why a name is not a valid extended resource name.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
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

/// Default unified resource name.
pub const DEFAULT: &str = "kudos.dev/gpu";

/// Checks `name` against the kubelet's rules.
pub fn validate(name: &str) -> Result<(), NameError> {
    let Some((prefix, local)) = name.split_once('/') else {
        return Err(NameError::NoDomain(name.into()));
    };
    if name.contains("kubernetes.io/") {
        return Err(NameError::Reserved(name.into()));
    }
    if name.starts_with("requests.") {
        return Err(NameError::RequestsPrefix(name.into()));
    }
    let syntax = |why| NameError::Syntax(name.into(), why);
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
        assert!(matches!(validate("gpu"), Err(NameError::NoDomain(_))));
        assert!(matches!(
            validate("kubernetes.io/gpu"),
            Err(NameError::Reserved(_))
        ));
        assert!(matches!(
            validate("foo.kubernetes.io/gpu"),
            Err(NameError::Reserved(_))
        ));
        assert!(matches!(
            validate("requests.kudos.dev/gpu"),
            Err(NameError::RequestsPrefix(_))
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
            assert!(matches!(validate(n), Err(NameError::Syntax(..))), "{n}");
        }
        assert!(validate(&format!("kudos.dev/{}", "g".repeat(64))).is_err());
        assert!(validate(&format!("{}/gpu", "a".repeat(250))).is_err());
    }
}
