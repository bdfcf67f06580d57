use super::*;
use proptest::prelude::*;

/// What a caller sees of a parse: the request as JSON, or serde_json's message.
fn outcome(r: Result<ExtenderArgs<'_>, serde_json::Error>) -> Result<serde_json::Value, String> {
    r.map(|a| serde_json::to_value(&a).unwrap())
        .map_err(|e| e.to_string())
}

fn same_as_serde(body: &[u8]) -> Result<(), TestCaseError> {
    let ours = outcome(ExtenderArgs::from_json(body));
    let serde = outcome(serde_json::from_slice(body));
    prop_assert_eq!(ours, serde, "{}", String::from_utf8_lossy(body));
    Ok(())
}

const POD: &str = r#"{"metadata":{"name":"p","namespace":"n","uid":"u","labels":{"kudos.dev/class":"c{]"}},"spec":{"containers":[{"name":"m","resources":{"requests":{"kudos.dev/gpu":"1"}}}]}}"#;

/// A request's members in some order, with `ws` around each token.
fn body(members: &[(&str, String)], ws: &[String]) -> String {
    let w = |k: usize| ws[k % ws.len()].as_str();
    let mut s = format!("{}{{", w(0));
    for (k, (key, value)) in members.iter().enumerate() {
        if k > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{}\"{key}\"{}:{}{value}{}",
            w(k + 1),
            w(k + 2),
            w(k + 3),
            w(k + 4)
        ));
    }
    s.push_str(&format!("}}{}", w(9)));
    s
}

fn list(names: &[String], ws: &[String]) -> String {
    let w = |k: usize| ws[k % ws.len()].as_str();
    let mut s = String::from("[");
    for (k, n) in names.iter().enumerate() {
        if k > 0 {
            s.push(',');
        }
        s.push_str(w(k + 5));
        s.push_str(&serde_json::to_string(n).unwrap());
        s.push_str(w(k + 6));
    }
    s.push_str(w(3));
    s.push(']');
    s
}

fn names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            4 => "[a-z0-9.-]{0,24}",
            1 => "[a-zé\u{1F600}\"\\\\\u{1}/]{0,6}",
            1 => any::<String>(),
        ],
        0..14,
    )
}

fn whitespace() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[ \t\r\n]{0,2}", 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any request with the known keys in any order (some twice, some unknown ones beside them),
    /// any names and whitespace, parses to what serde_json gives, or fails with its message.
    #[test]
    fn requests_parse_as_serde_json_parses_them(
        names in names(),
        ws in whitespace(),
        order in Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle(),
        present in prop::collection::vec(0u8..4, 5),
        null_names in any::<bool>(),
    ) {
        let values = [
            ("Pod", POD.to_owned()),
            ("Nodes", "null".to_owned()),
            ("NodeNames", if null_names { "null".to_owned() } else { list(&names, &ws) }),
            ("Pod", "null".to_owned()),
            ("Other", r#"{"a":[1,"]"]}"#.to_owned()),
        ];
        // Each member 0 (absent), 1 or 2 (once) or 3 (twice) times.
        let mut members = Vec::new();
        for &k in &order {
            let times = match present[k] { 0 => 0, 3 => 2, _ => 1 };
            for _ in 0..times {
                members.push(values[k].clone());
            }
        }
        let members: Vec<(&str, String)> = members.iter().map(|(k, v)| (*k, v.clone())).collect();
        same_as_serde(body(&members, &ws).as_bytes())?;
    }

    /// Every prefix of a request, and the request with one byte replaced anywhere, is accepted
    /// or refused as serde_json does it.
    #[test]
    fn damaged_requests_are_refused_as_serde_json_refuses_them(
        names in names(),
        ws in whitespace(),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b']'), Just(b'}'), Just(0u8), Just(0xff), any::<u8>()],
    ) {
        let text = body(&[("Pod", POD.to_owned()), ("NodeNames", list(&names, &ws))], &ws);
        let mut damaged = text.clone().into_bytes();
        let at = at.index(damaged.len());
        damaged[at] = byte;
        same_as_serde(&damaged)?;
        same_as_serde(&text.as_bytes()[..at])?;
    }

    /// The first `"`, `\` or control character, whatever bytes (non-ASCII included) come
    /// before and after it.
    #[test]
    fn the_first_special_byte_is_found(s in prop::collection::vec(any::<u8>(), 0..40)) {
        let naive = s.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        prop_assert_eq!(first_special(&s), naive);
    }
}

/// A request as kube-scheduler sends it takes the walk (not serde_json), its names borrowed
/// from the body; one with an escaped name or an unknown key is read by serde_json.
#[test]
fn kube_schedulers_request_is_read_in_one_pass() {
    let names: Vec<String> = (0..5000).map(|i| format!("node-{i:05}")).collect();
    let request = format!(
        r#"{{"Pod":{POD},"Nodes":null,"NodeNames":{}}}"#,
        serde_json::to_string(&names).unwrap()
    );
    let args = walk(request.as_bytes()).expect("the walk reads kube-scheduler's request");
    let got = args.node_names.as_ref().unwrap();
    assert_eq!(got.len(), 5000);
    assert!(
        got.iter()
            .zip(&names)
            .all(|(g, n)| matches!(g, Cow::Borrowed(b) if b == n))
    );
    assert_eq!(
        args.pod.as_ref().and_then(|p| p.metadata.name.as_deref()),
        Some("p")
    );
    assert_eq!(
        outcome(Ok(args)),
        outcome(serde_json::from_slice(request.as_bytes()))
    );

    let escaped = r#"{"NodeNames":["a","b\u002dc"]}"#;
    assert!(walk(escaped.as_bytes()).is_none());
    let args = ExtenderArgs::from_json(escaped.as_bytes()).unwrap();
    assert_eq!(args.node_names.unwrap(), ["a", "b-c"]);
    let unknown = r#"{"NodeNames":["a"],"Extra":1}"#;
    assert!(walk(unknown.as_bytes()).is_none());
    assert_eq!(
        ExtenderArgs::from_json(unknown.as_bytes())
            .unwrap()
            .node_names
            .unwrap(),
        ["a"]
    );
}

/// A request serde_json refuses is refused with serde_json's message.
#[test]
fn refusals_keep_serde_jsons_message() {
    for bad in [
        r#"{"NodeNames":["a",1]}"#,
        r#"{"NodeNames":["a"],"NodeNames":["b"]}"#,
        "{\"NodeNames\":[\"a\u{1}\"]}",
        r#"{"Pod":{"metadata":{"name":3}},"NodeNames":["a"]}"#,
        r#"{"NodeNames":["a"]} x"#,
        r#"{"NodeNames":["a"]"#,
        "",
    ] {
        let ours = ExtenderArgs::from_json(bad.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string());
        let serde = serde_json::from_slice::<ExtenderArgs>(bad.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(serde.is_err(), "{bad}");
        assert_eq!(ours, serde, "{bad}");
    }
}
