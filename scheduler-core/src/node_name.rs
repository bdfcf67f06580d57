//! [`NodeName`]: a node's name, shared rather than copied.
//!
//! Every ranking names each candidate once in its answer, and the caller builds the candidates
//! from its own index for every call; at thousands of nodes a `String` per name per call was a
//! fifth of `rank`'s time (an allocation, a copy and a free each). A `NodeName` is a reference
//! count to one allocation, so passing it along is an increment.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A node's name. Dereferences to `str`; serialises as a JSON string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeName(Arc<str>);

impl NodeName {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for NodeName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for NodeName {
    fn from(s: &str) -> Self {
        Self(Arc::from(s))
    }
}

impl From<String> for NodeName {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl From<&String> for NodeName {
    fn from(s: &String) -> Self {
        Self(Arc::from(s.as_str()))
    }
}

impl From<NodeName> for String {
    fn from(n: NodeName) -> Self {
        n.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for NodeName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for NodeName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_as_a_plain_string_and_compares_with_str() {
        let n = NodeName::from("gpu-a");
        assert_eq!(serde_json::to_string(&n).expect("json"), "\"gpu-a\"");
        let back: NodeName = serde_json::from_str("\"gpu-a\"").expect("parse");
        assert_eq!(back, n);
        assert_eq!(n, "gpu-a");
        assert_eq!(format!("{n} {n:?}"), "gpu-a \"gpu-a\"");
        let clone = n.clone();
        assert!(
            std::ptr::eq(clone.as_str(), n.as_str()),
            "a clone shares the text"
        );
    }
}
