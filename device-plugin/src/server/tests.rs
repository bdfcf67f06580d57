//! The service without sockets: two fake vendors, a health view the test controls.

use super::*;
use crate::backend::fake::FakeBackend;
use crate::backend::{Backends, HealthSignal};
use crate::health::HealthTracker;
use api::device_plugin_server::DevicePlugin as _;
use std::time::Duration;
use tokio_stream::StreamExt as _;
use tonic::Code;

struct Fixture {
    server: PluginServer,
    health: watch::Sender<Arc<HealthMap>>,
    stop: watch::Sender<bool>,
    streams: Arc<Streams>,
    metrics: Metrics,
}

impl Fixture {
    /// A ListAndWatch stream, as the kubelet opens one.
    async fn list_and_watch(
        &self,
    ) -> <PluginServer as api::device_plugin_server::DevicePlugin>::ListAndWatchStream {
        self.server
            .list_and_watch(Request::new(api::Empty {}))
            .await
            .expect("stream")
            .into_inner()
    }
}

fn mk_server() -> Fixture {
    let a: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("alpha", 4, 2));
    let b: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::new("beta", 2, 1));
    let backends = Backends::new(vec![a, b]).expect("backends");
    let map: HealthMap = backends
        .devices()
        .map(|d| (d.id.clone(), Health::Healthy))
        .collect();
    let (health, health_rx) = watch::channel(Arc::new(map));
    let (stop, stop_rx) = watch::channel(false);
    let streams = Arc::new(Streams::default());
    let metrics = Metrics::new();
    let server = PluginServer::new(
        backends,
        health_rx,
        metrics.clone(),
        streams.clone(),
        stop_rx,
    );
    Fixture {
        server,
        health,
        stop,
        streams,
        metrics,
    }
}

fn alloc(containers: &[&[&str]]) -> Request<api::AllocateRequest> {
    Request::new(api::AllocateRequest {
        container_requests: containers
            .iter()
            .map(|ids| api::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    })
}

/// Containers' device IDs, and the number of responses or the error code.
type Case = (&'static [&'static [&'static str]], Result<usize, Code>);

#[tokio::test]
async fn allocate_table() {
    let f = mk_server();
    f.health.send_modify(|m| {
        Arc::make_mut(m).insert("alpha-dev3".into(), Health::Unhealthy);
    });
    let cases: Vec<Case> = vec![
        (&[&["alpha-dev0"], &["alpha-dev1", "beta-dev0"]], Ok(2)),
        (&[&["alpha-dev9"]], Err(Code::InvalidArgument)),
        (&[&["gamma-dev0"]], Err(Code::InvalidArgument)),
        (&[&["alpha-dev3"]], Err(Code::FailedPrecondition)),
        (
            &[&["alpha-dev0"], &["alpha-dev3"]],
            Err(Code::FailedPrecondition),
        ),
        (&[&[]], Err(Code::InvalidArgument)),
        (&[], Ok(0)),
    ];
    for (req, want) in cases {
        let got = f
            .server
            .allocate(alloc(req))
            .await
            .map(|r| r.into_inner().container_responses.len());
        match (got, want) {
            (Ok(n), Ok(m)) => assert_eq!(n, m, "{req:?}"),
            (Err(s), Err(code)) => assert_eq!(s.code(), code, "{req:?}: {}", s.message()),
            (got, want) => panic!("{req:?}: got {got:?}, want {want:?}"),
        }
    }
    assert!(
        f.metrics
            .encode()
            .contains("kudos_device_plugin_allocations_total{result=\"error\"} 5")
    );
}

#[tokio::test]
async fn allocate_merges_vendors_in_one_container() {
    let f = mk_server();
    let r = f
        .server
        .allocate(alloc(&[&["beta-dev1", "alpha-dev2", "alpha-dev0"]]))
        .await
        .expect("ok")
        .into_inner();
    let c = &r.container_responses[0];
    assert_eq!(
        c.envs.get("ALPHA_VISIBLE_DEVICES").map(String::as_str),
        Some("alpha-uuid-2,alpha-uuid-0")
    );
    assert_eq!(
        c.envs.get("BETA_VISIBLE_DEVICES").map(String::as_str),
        Some("beta-uuid-1")
    );
    let paths: Vec<&str> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
    // The shared node appears once although both vendors ask for it.
    assert_eq!(
        paths,
        vec![
            "/dev/shared",
            "/dev/beta-dev1",
            "/dev/alpha-dev2",
            "/dev/alpha-dev0"
        ]
    );
}

#[tokio::test]
async fn list_and_watch_streams_changes_and_reports_kubelet_closes() {
    let f = mk_server();
    let mut stream = f.list_and_watch().await;
    let first = stream.next().await.expect("first").expect("ok");
    assert_eq!(first.devices.len(), 6);
    assert!(first.devices.iter().all(|d| d.health == api::HEALTHY));
    assert_eq!(
        first.devices[2].topology.as_ref().map(|t| t.nodes[0].id),
        Some(1)
    );
    assert_eq!(f.streams.active(), 1);

    f.health.send_modify(|m| {
        Arc::make_mut(m).insert("beta-dev1".into(), Health::Unhealthy);
    });
    let second = stream.next().await.expect("second").expect("ok");
    let bad: Vec<&str> = second
        .devices
        .iter()
        .filter(|d| d.health == api::UNHEALTHY)
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(bad, vec!["beta-dev1"]);

    // The kubelet goes away: the runtime is told.
    let closed = f.streams.closed.notified();
    drop(stream);
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("closed reported");
    assert_eq!(f.streams.active(), 0);

    // Our own stop ends a stream without reporting a kubelet close.
    let mut stream = f.list_and_watch().await;
    stream.next().await.expect("first").expect("ok");
    f.stop.send(true).expect("stop");
    assert!(
        tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("ends")
            .is_none()
    );
    let again = f.streams.closed.notified();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), again)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn preferred_allocation_keeps_to_one_numa_node_and_vendor() {
    let f = mk_server();
    let req = api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: ["alpha-dev0", "alpha-dev2", "alpha-dev3", "beta-dev0"]
                .map(String::from)
                .to_vec(),
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        }],
    };
    let r = f
        .server
        .get_preferred_allocation(Request::new(req))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(
        r.container_responses[0].device_i_ds,
        vec!["alpha-dev2", "alpha-dev3"]
    );
}

#[tokio::test]
async fn preferred_allocation_refuses_made_up_and_too_many_ids_without_ranking_them() {
    let f = mk_server();
    // Asks for 2 of `available` with `must` included; the refusal it must get.
    let refusal = async |available: Vec<String>, must: Vec<&str>| {
        let req = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must.into_iter().map(Into::into).collect(),
                allocation_size: 2,
            }],
        };
        let e = f
            .server
            .get_preferred_allocation(Request::new(req))
            .await
            .expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument);
        e
    };
    // 2,000 IDs: ranking them would take minutes; the bound refuses them at once.
    let made_up: Vec<String> = (0..2000).map(|i| format!("alpha-x{i}")).collect();
    let e = refusal(made_up, vec![]).await;
    assert!(e.message().contains("more than 256"), "{}", e.message());
    // Within the bound but unknown: refused too, naming the device.
    let e = refusal(vec!["alpha-dev0".into(), "alpha-nope".into()], vec![]).await;
    assert!(e.message().contains("alpha-nope"), "{}", e.message());
    refusal(
        vec!["alpha-dev0".into(), "alpha-dev1".into()],
        vec!["beta-nope"],
    )
    .await;
}

#[tokio::test]
async fn allocate_refuses_more_ids_than_a_node_can_have() {
    let f = mk_server();
    let ids: Vec<String> = (0..=256).map(|i| format!("alpha-x{i}")).collect();
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
    };
    let e = f
        .server
        .allocate(Request::new(req))
        .await
        .expect_err("too many");
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// The health loop over `fake` (its event source connected), probing every `probe_every` and
/// holding a recovered device back for `quiet`; returns the health view and the stop switch
/// (the loop runs while it is held).
fn start_health_loop(
    fake: &Arc<FakeBackend>,
    quiet: Duration,
    probe_every: Duration,
    metrics: &Metrics,
) -> (watch::Receiver<Arc<HealthMap>>, watch::Sender<bool>) {
    let backends = Backends::new(vec![fake.clone() as Arc<dyn DeviceBackend>]).expect("backends");
    let tracker = HealthTracker::new(
        backends
            .devices()
            .map(|d| (d.id.as_str(), d.vendor.as_str())),
        quiet,
    );
    let (tx, rx) = watch::channel(Arc::new(tracker.snapshot()));
    let (sig_tx, sig_rx) = tokio::sync::mpsc::unbounded_channel();
    fake.watch(sig_tx).expect("watch");
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(crate::health::run(
        backends,
        tracker,
        sig_rx,
        probe_every,
        tx,
        metrics.clone(),
        stop_rx,
    ));
    (rx, stop)
}

#[tokio::test]
async fn health_loop_publishes_transitions_from_signals_and_probes() {
    let fake = Arc::new(FakeBackend::new("alpha", 2, 2));
    let metrics = Metrics::new();
    let (mut rx, _stop) = start_health_loop(
        &fake,
        Duration::from_millis(200),
        Duration::from_millis(20),
        &metrics,
    );
    let wait_for = |rx: &mut watch::Receiver<Arc<HealthMap>>, id: &'static str, h: Health| {
        let mut rx = rx.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(5),
                rx.wait_for(|m| m.get(id) == Some(&h)),
            )
            .await
            .expect("in time")
            .expect("open");
        }
    };
    fake.signal(HealthSignal::Critical {
        id: "alpha-dev1".into(),
        reason: "test".into(),
    });
    wait_for(&mut rx, "alpha-dev1", Health::Unhealthy).await;
    wait_for(&mut rx, "alpha-dev1", Health::Healthy).await;
    fake.set_probe("alpha-dev0", Some("gone"));
    wait_for(&mut rx, "alpha-dev0", Health::Unhealthy).await;
    fake.set_probe("alpha-dev0", None);
    wait_for(&mut rx, "alpha-dev0", Health::Healthy).await;
    let text = metrics.encode();
    assert!(
        text.contains(
            "kudos_device_plugin_health_transitions_total{vendor=\"alpha\",health=\"unhealthy\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains("kudos_device_plugin_devices{vendor=\"alpha\",health=\"healthy\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_hung_probe_marks_devices_unhealthy_then_they_recover() {
    let fake = Arc::new(FakeBackend::new("alpha", 2, 2));
    // The first round hangs for 3 s; the loop gives up on it after 2 s.
    fake.set_probe_delay(Some(Duration::from_secs(3)));
    let (rx, _stop) = start_health_loop(
        &fake,
        Duration::ZERO,
        Duration::from_millis(50),
        &Metrics::new(),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    fake.set_probe_delay(None);
    let mut r = rx.clone();
    let all = |h: Health| move |m: &Arc<HealthMap>| m.values().all(|v| *v == h);
    tokio::time::timeout(Duration::from_secs(5), r.wait_for(all(Health::Unhealthy)))
        .await
        .expect("in time")
        .expect("open");
    tokio::time::timeout(Duration::from_secs(5), r.wait_for(all(Health::Healthy)))
        .await
        .expect("in time")
        .expect("open");
}
