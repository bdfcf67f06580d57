//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs have no JSON tags, so keys are the Go field names (PascalCase); nested
//! Kubernetes objects use their own camelCase JSON (k8s-openapi types). Every field may be
//! `null` or absent, so every input field is an `Option` with a default.
//!
//! Node names are borrowed from the request body (`Cow::Borrowed` unless the JSON escaped
//! something) and handed back in the answer without a copy: at 5,000 nodes that is 5,000
//! allocations fewer each way per call.

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// `ExtenderArgs`: the filter and prioritize request.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs<'a> {
    /// The pod being scheduled: only what Kudos reads of it (see [`crate::pod_view`]).
    #[serde(default, deserialize_with = "crate::pod_view::deserialize")]
    pub pod: Option<Pod>,
    /// Candidate nodes in full (`nodeCacheCapable: false`).
    #[serde(default)]
    pub nodes: Option<List<Node>>,
    /// Candidate node names (`nodeCacheCapable: true`), borrowed from the body.
    #[serde(default, borrow, deserialize_with = "borrowed_names")]
    pub node_names: Option<Vec<Cow<'a, str>>>,
}

/// A JSON string borrowed from the input when it has no escapes, else owned.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a node name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        d.deserialize_str(V).map(Name)
    }
}

/// `NodeNames` through serde_json: it checks the whole value once (`RawValue`); then a list of
/// plain strings, as kube-scheduler sends it, is split at its quotes without decoding each name
/// again. A list with an escape in it is decoded by serde_json. (The filter and prioritize
/// routes read their requests with [`ExtenderArgs::from_json`], which checks and splits the
/// list in one pass; this is its fallback, and the filter answer's reader.)
fn borrowed_names<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Cow<'de, str>>>, D::Error> {
    let Some(raw) = Option::<&'de serde_json::value::RawValue>::deserialize(d)? else {
        return Ok(None);
    };
    let raw = raw.get();
    if let Some(names) = plain_names(raw) {
        return Ok(Some(names));
    }
    let names: Vec<Name<'de>> = serde_json::from_str(raw).map_err(serde::de::Error::custom)?;
    Ok(Some(names.into_iter().map(|n| n.0).collect()))
}

/// The strings of `json`, a JSON array, if it holds only strings without escapes; else `None`.
fn plain_names(json: &str) -> Option<Vec<Cow<'_, str>>> {
    use super::args_json::{plain_list, skip_ws};
    let (names, end) = plain_list(json, skip_ws(json.as_bytes(), 0))?;
    (skip_ws(json.as_bytes(), end) == json.len()).then_some(names)
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult<'a> {
    /// Nodes that passed (when the request used `Nodes`).
    pub nodes: Option<List<Node>>,
    /// Names that passed (when the request used `NodeNames`).
    #[serde(borrow, deserialize_with = "borrowed_names")]
    pub node_names: Option<Vec<Cow<'a, str>>>,
    /// Rejected nodes and why; kube-scheduler may retry them (preemption can help).
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Rejected nodes that preemption cannot fix.
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// A non-empty error fails the whole call.
    #[serde(default)]
    pub error: String,
}

/// One `HostPriority`; the prioritize answer is a bare array of these.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority<'a> {
    /// Node name (borrowed from the request).
    #[serde(borrow)]
    pub host: Cow<'a, str>,
    /// 0..=10 (`MaxExtenderPriority`).
    pub score: i64,
}

/// The prioritize answer as JSON, byte for byte what `serde_json::to_vec` writes for it, into
/// one buffer of the right size.
///
/// This is on every GPU pod's scheduling path: at 5,000 candidates the derived serializer
/// grew its buffer a dozen times (each a copy of everything so far) and ran each name through
/// the escaper byte by byte. Names that need no escape (every name a Kubernetes node can have)
/// are copied as they are; any other goes through serde_json.
pub fn host_priorities_json(list: &[HostPriority<'_>]) -> Vec<u8> {
    // `{"Host":"","Score":10},` is 23 bytes around the name.
    let size = 2 + list.iter().map(|h| h.host.len() + 23).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(b'[');
    for (i, h) in list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"Host\":");
        json_str(&mut out, &h.host);
        out.extend_from_slice(b",\"Score\":");
        json_int(&mut out, h.score);
        out.push(b'}');
    }
    out.push(b']');
    out
}

/// The filter answer as JSON, byte for byte what `serde_json::to_vec` writes for it, into one
/// buffer of the right size (see [`host_priorities_json`] for why). An answer in the `Nodes`
/// form (whole Node objects) goes through serde_json.
pub fn filter_result_json(r: &ExtenderFilterResult<'_>) -> Vec<u8> {
    if r.nodes.is_some() {
        return serde_json::to_vec(r).unwrap_or_else(|e| {
            // Serialising plain data into a Vec does not fail; if it ever did, say so in the
            // answer's own error field rather than answering nothing.
            let error = format!("serialising the filter answer failed: {e}");
            let mut out = b"{\"Nodes\":null,\"NodeNames\":null,\"FailedNodes\":{},\"FailedAndUnresolvableNodes\":{},\"Error\":".to_vec();
            json_str(&mut out, &error);
            out.push(b'}');
            out
        });
    }
    let map_size =
        |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>();
    let names_size = r
        .node_names
        .as_ref()
        .map_or(4, |n| n.iter().map(|n| n.len() + 3).sum());
    let size = 96
        + names_size
        + map_size(&r.failed_nodes)
        + map_size(&r.failed_and_unresolvable_nodes)
        + r.error.len();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(b"{\"Nodes\":null,\"NodeNames\":");
    match &r.node_names {
        None => out.extend_from_slice(b"null"),
        Some(names) => {
            out.push(b'[');
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_str(&mut out, n);
            }
            out.push(b']');
        }
    }
    out.extend_from_slice(b",\"FailedNodes\":");
    json_map(&mut out, &r.failed_nodes);
    out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
    json_map(&mut out, &r.failed_and_unresolvable_nodes);
    out.extend_from_slice(b",\"Error\":");
    json_str(&mut out, &r.error);
    out.push(b'}');
    out
}

/// A map of strings as a JSON object, in the map's order.
fn json_map(out: &mut Vec<u8>, m: &BTreeMap<String, String>) {
    out.push(b'{');
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_str(out, k);
        out.push(b':');
        json_str(out, v);
    }
    out.push(b'}');
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if !needs_escape(s.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, s).is_err() {
        // Writing to a Vec cannot fail; an empty string keeps the JSON well formed regardless.
        out.extend_from_slice(b"\"\"");
    }
}

/// Whether serde_json would escape any byte of `s`: exactly the control characters, `"` and
/// `\`; everything else, non-ASCII included, it writes as it is. Eight bytes at a time: on
/// 10-byte node names a vectorised fold over each byte counted 35 instructions a name, this 18.
fn needs_escape(s: &[u8]) -> bool {
    super::args_json::first_special(s).is_some()
}

/// `v` in decimal.
fn json_int(out: &mut Vec<u8>, v: i64) {
    match u8::try_from(v) {
        Ok(v @ 0..=9) => out.push(b'0' + v),
        Ok(v @ 10..=99) => out.extend_from_slice(&[b'0' + v / 10, b'0' + v % 10]),
        _ => out.extend_from_slice(v.to_string().as_bytes()),
    }
}

/// `ExtenderBindingArgs`.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName", default)]
    pub pod_name: Option<String>,
    /// Pod namespace.
    #[serde(rename = "PodNamespace", default)]
    pub pod_namespace: Option<String>,
    /// Pod UID.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: Option<String>,
    /// Target node.
    #[serde(rename = "Node", default)]
    pub node: Option<String>,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    /// Empty on success.
    #[serde(default)]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// NodeNames come out as serde_json decodes them, whatever the names (escapes, quotes,
        /// non-ASCII) and the whitespace around them; a list that is not one of strings is
        /// refused.
        #[test]
        fn node_names_decode_as_serde_json_does(
            names in proptest::collection::vec(
                proptest::prop_oneof!["[a-z0-9.-]{0,20}", proptest::prelude::any::<String>()],
                0..12,
            ),
            ws in proptest::collection::vec("[ \t\r\n]{0,2}", 40),
        ) {
            let mut list = String::from("[");
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    list.push(',');
                }
                list.push_str(&ws[i % ws.len()]);
                list.push_str(&serde_json::to_string(n).unwrap());
                list.push_str(&ws[(i + 7) % ws.len()]);
            }
            list.push(']');
            let body = format!(r#"{{"NodeNames":{}{list}{} }}"#, ws[0], ws[1]);
            let args: ExtenderArgs = serde_json::from_str(&body).unwrap();
            let got: Vec<String> = args.node_names.unwrap().into_iter().map(Cow::into_owned).collect();
            proptest::prop_assert_eq!(got, names);
        }
    }

    #[test]
    fn node_names_that_are_not_strings_are_refused() {
        for bad in [
            r#"{"NodeNames": [1]}"#,
            r#"{"NodeNames": ["a", 2]}"#,
            r#"{"NodeNames": {"a": 1}}"#,
            r#"{"NodeNames": "a"}"#,
            r#"{"NodeNames": ["a" "b"]}"#,
        ] {
            assert!(serde_json::from_str::<ExtenderArgs>(bad).is_err(), "{bad}");
        }
        let ok: ExtenderArgs = serde_json::from_str(r#"{"NodeNames": [ ]}"#).unwrap();
        assert_eq!(ok.node_names, Some(vec![]));
    }

    /// Names are borrowed from the body; an escaped one is decoded into an owned copy.
    #[test]
    fn node_names_are_borrowed_from_the_body() {
        let body = br#"{"Pod": null, "NodeNames": ["node-1", "node\u002d2"]}"#;
        let args: ExtenderArgs = serde_json::from_slice(body).unwrap();
        let names = args.node_names.unwrap();
        assert!(matches!(&names[0], Cow::Borrowed("node-1")));
        assert!(matches!(&names[1], Cow::Owned(n) if n == "node-2"));
        let absent: ExtenderArgs = serde_json::from_slice(br#"{"NodeNames": null}"#).unwrap();
        assert!(absent.node_names.is_none());
    }

    proptest::proptest! {
        /// The filter answer is what serde_json writes for it, in the names form and the
        /// Nodes form, whatever the names and reasons.
        #[test]
        fn filter_answer_is_serde_jsons(
            names in proptest::option::of(proptest::collection::vec(
                proptest::prop_oneof!["[a-z0-9.-]{0,20}", proptest::prelude::any::<String>()],
                0..10,
            )),
            failed in proptest::collection::btree_map(
                proptest::prelude::any::<String>(), "[ -~\"\\\\\n\u{1}é]{0,30}", 0..5),
            unresolvable in proptest::collection::btree_map(
                "[a-z0-9.-]{1,20}", proptest::prelude::any::<String>(), 0..5),
            error in proptest::prelude::any::<String>(),
            nodes_form in proptest::prelude::any::<bool>(),
        ) {
            let r = ExtenderFilterResult {
                nodes: nodes_form.then(|| List { items: vec![Node::default()], ..Default::default() }),
                node_names: names.as_ref().map(|n| n.iter().map(|n| Cow::Borrowed(n.as_str())).collect()),
                failed_nodes: failed,
                failed_and_unresolvable_nodes: unresolvable,
                error,
            };
            proptest::prop_assert_eq!(
                String::from_utf8(filter_result_json(&r)).unwrap(),
                String::from_utf8(serde_json::to_vec(&r).unwrap()).unwrap()
            );
        }

        /// The prioritize answer is what serde_json writes for it, whatever the names (quotes,
        /// backslashes, control characters, non-ASCII) and scores.
        #[test]
        fn prioritize_answer_is_serde_jsons(
            hosts in proptest::collection::vec(
                proptest::prop_oneof![
                    "[a-z0-9.-]{0,30}",
                    proptest::prelude::any::<String>(),
                    "[\"\\\\\u{0}-\u{1f}a\u{7f}é]{0,6}",
                ],
                0..20,
            ),
            scores in proptest::collection::vec(proptest::prelude::any::<i64>(), 20),
        ) {
            let list: Vec<HostPriority> = hosts
                .iter()
                .zip(&scores)
                .enumerate()
                .map(|(i, (h, s))| HostPriority {
                    host: Cow::Borrowed(h.as_str()),
                    score: if i % 2 == 0 { s.rem_euclid(12) } else { *s },
                })
                .collect();
            proptest::prop_assert_eq!(
                String::from_utf8(host_priorities_json(&list)).unwrap(),
                String::from_utf8(serde_json::to_vec(&list).unwrap()).unwrap()
            );
        }
    }
}
