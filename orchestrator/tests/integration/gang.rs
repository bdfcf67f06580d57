//! Gang reservations through the router: the first member reserves slots for the gang, each
//! member is steered to a slot of its own, and bind honours the reservation.

use crate::common;

use common::*;

#[tokio::test]
async fn gang_is_reserved_and_steered() {
    let app = mk_app(standard_index());
    let mut pod = pod_json("g-0", Some("resnet50"), 4);
    pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/gang-name": "job", "kudos.dev/gang-size": "2", "kudos.dev/vendors": "nvidia,amd"});
    let body = serde_json::json!({"Pod": pod, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]});
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&body).unwrap()).await;
    let passed: Vec<String> = serde_json::from_value(v["NodeNames"].clone()).unwrap();
    assert!(
        !passed.is_empty() && !passed.contains(&"gpu-c".to_owned()),
        "{v}"
    );
    let (_, st) = get(&app, "/state").await;
    let slots = st["gangReservations"]["default/job"]["slots"]
        .as_array()
        .unwrap();
    assert_eq!(slots.len(), 2, "{st}");
    // The member holds one slot: filter passed its node only, prioritize scores it 10.
    assert_eq!(passed.len(), 1, "{v}");
    assert!(
        slots.iter().any(|s| s["node"] == passed[0].as_str()),
        "{st}"
    );
    let (_, v) = post(
        &app,
        "/kudos/v1/prioritize",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    for hp in v.as_array().unwrap() {
        let host = hp["Host"].as_str().unwrap();
        assert_eq!(hp["Score"] == 10, host == passed[0], "{v}");
    }
}

/// kube-scheduler evaluates the next member while the previous member's bind is in flight:
/// members filtered before any bind are each steered to a slot of their own (together exactly
/// the reserved slots, even with two slots on one node), and bind refuses a node where the
/// member holds no slot.
#[tokio::test]
async fn gang_members_in_flight_get_distinct_slots_and_bind_honours_them() {
    let app = mk_app(standard_index());
    let member = |i: usize| {
        let mut pod = pod_json(&format!("m-{i}"), Some("resnet50"), 4);
        pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/gang-name": "job", "kudos.dev/gang-size": "3", "kudos.dev/vendors": "nvidia,amd"});
        serde_json::json!({"Pod": pod, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]})
    };
    let mut chosen = Vec::new();
    for i in 0..3 {
        let body = serde_json::to_vec(&member(i)).unwrap();
        let (_, v) = post(&app, "/kudos/v1/filter", body).await;
        let passed: Vec<String> = serde_json::from_value(v["NodeNames"].clone()).unwrap();
        assert_eq!(passed.len(), 1, "member {i} steered to one slot: {v}");
        chosen.push(passed[0].clone());
    }
    let (_, st) = get(&app, "/state").await;
    let mut slots: Vec<String> = st["gangReservations"]["default/job"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap().to_owned())
        .collect();
    let mut sorted = chosen.clone();
    sorted.sort();
    slots.sort();
    assert_eq!(sorted, slots, "members hold exactly the reserved slots");
    let bind = |i: usize, node: &str| {
        serde_json::to_vec(
            &serde_json::json!({"PodName": format!("m-{i}"), "PodNamespace": "default",
            "PodUID": format!("uid-m-{i}"), "Node": node}),
        )
        .unwrap()
    };
    // Each member bound to another member's node: refused (that node has no slot for it).
    for i in 0..3 {
        if let Some(wrong) = chosen.iter().find(|n| **n != chosen[i]) {
            let (_, v) = post(&app, "/kudos/v1/bind", bind(i, wrong)).await;
            assert!(
                v["Error"].as_str().unwrap().contains("no open slot"),
                "member {i} on {wrong}: {v}"
            );
        }
    }
    for (i, node) in chosen.iter().enumerate() {
        let (_, v) = post(&app, "/kudos/v1/bind", bind(i, node)).await;
        assert_eq!(v["Error"], "", "member {i} on {node}");
    }
    let (_, st) = get(&app, "/state").await;
    let bound = st["gangReservations"]["default/job"]["bound"]
        .as_array()
        .unwrap();
    assert!(bound.iter().all(|b| b.is_string()), "{st}");
}

fn gang_member(gang: &str, i: usize, size: usize, gpus: u32) -> serde_json::Value {
    let mut pod = pod_json(&format!("{gang}-{i}"), Some("resnet50"), gpus);
    pod["metadata"]["annotations"] = serde_json::json!({"kudos.dev/gang-name": gang,
        "kudos.dev/gang-size": size.to_string(), "kudos.dev/vendors": "nvidia,amd"});
    serde_json::json!({"Pod": pod, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]})
}

fn passed(v: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(v["NodeNames"].clone()).unwrap_or_default()
}

/// A gang's reserved slots are not free for anyone else while its members have not bound: a
/// pod that fitted before the reservation does not fit after it, and fits again once the
/// reservation lapses.
#[tokio::test]
async fn reserved_slots_are_not_free_for_other_pods() {
    let app = mk_app(standard_index());
    // gpu-a 4 + gpu-b 8 + gpu-c 2 devices; an 8-device pod fits only on gpu-b.
    let mut big = pod_json("big", Some("resnet50"), 8);
    big["metadata"]["annotations"] = serde_json::json!({"kudos.dev/vendors": "nvidia,amd"});
    let big = serde_json::json!({"Pod": big, "NodeNames": ["gpu-a", "gpu-b", "gpu-c"]});
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&big).unwrap()).await;
    assert_eq!(passed(&v), ["gpu-b"], "{v}");
    // A gang of two 4-device members reserves 8 of the 14 devices.
    let (_, v) = post(
        &app,
        "/kudos/v1/filter",
        serde_json::to_vec(&gang_member("job", 0, 2, 4)).unwrap(),
    )
    .await;
    assert_eq!(passed(&v).len(), 1, "{v}");
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&big).unwrap()).await;
    assert!(
        passed(&v).is_empty(),
        "the reserved devices went to another pod: {v}"
    );
    assert!(
        v["FailedNodes"]["gpu-b"].as_str().is_some(),
        "gpu-b is refused as full for now, not as unfit: {v}"
    );
}

/// Two gangs that cannot both fit: the first reserves, the second cannot reserve devices the
/// first holds (its members are refused with the reason, nothing is held for it), and the
/// first gang's members all bind. Without counting reservations, both gangs reserved the same
/// devices and each bound part of itself: a deadlock.
#[tokio::test]
async fn a_second_gang_waits_instead_of_splitting_the_first_gangs_devices() {
    let app = mk_app(standard_index());
    // 14 devices; each gang needs 8 (two members of 4).
    let a0 = gang_member("a", 0, 2, 4);
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&a0).unwrap()).await;
    let a0_node = passed(&v);
    assert_eq!(a0_node.len(), 1, "{v}");
    for i in 0..2 {
        let (_, v) = post(
            &app,
            "/kudos/v1/filter",
            serde_json::to_vec(&gang_member("b", i, 2, 4)).unwrap(),
        )
        .await;
        assert!(passed(&v).is_empty(), "gang b member {i} got a node: {v}");
        assert!(v.to_string().contains("cannot be placed"), "{v}");
    }
    let (_, st) = get(&app, "/state").await;
    assert!(st["gangReservations"]["default/b"].is_null(), "{st}");
    let a1 = gang_member("a", 1, 2, 4);
    let (_, v) = post(&app, "/kudos/v1/filter", serde_json::to_vec(&a1).unwrap()).await;
    let a1_node = passed(&v);
    assert_eq!(a1_node.len(), 1, "{v}");
    for (i, node) in [(0, &a0_node[0]), (1, &a1_node[0])] {
        let bind = serde_json::json!({"PodName": format!("a-{i}"), "PodNamespace": "default",
            "PodUID": format!("uid-a-{i}"), "Node": node});
        let (_, v) = post(&app, "/kudos/v1/bind", serde_json::to_vec(&bind).unwrap()).await;
        assert_eq!(v["Error"], "", "gang a member {i} on {node}: {v}");
    }
}
