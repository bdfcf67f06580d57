//! Image derivation against a real registry: Debian's `docker-registry` on a random loopback
//! port (started by `kudos-testkit`), read back with `skopeo`. Skips (with a message) when
//! either binary is missing; `KUDOS_E2E_REQUIRE=1` turns the skip into a failure.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use kudos_rollout::image::sha256_digest;
use kudos_rollout::{
    DeriveError, ImageDeriver, PlainHttp, PluginConfig, RegistrySettings, RetryPolicy,
    RolloutMetrics, RolloutSettings,
};
use kudos_rollout::{DeviceRecord, VendorEntry};
use kudos_testkit::RunDir;
use kudos_testkit::proc::free_port;
use kudos_testkit::registry::{self, Registry, inspect, skopeo};
use oci_client::client::{ClientConfig, ClientProtocol};
use serde_json::Value;

use crate::util::Recorder;

fn settings(addr: &str, base: &str, retry: RetryPolicy) -> RegistrySettings {
    RegistrySettings {
        base_image: base.into(),
        repository: format!("{addr}/kudos/device-plugin-derived"),
        plain_http: PlainHttp::Loopback,
        credentials: Default::default(),
        retry,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(30),
    }
}

fn view() -> PluginConfig {
    let nv = VendorEntry {
        vendor_resource_name: "nvidia.com/gpu".into(),
        plugin_version: "0.1.0".into(),
        devices: vec![DeviceRecord {
            id: "nv-GPU-0".into(),
            model: "A100".into(),
            memory_bytes: 40 << 30,
            uuid: "GPU-0".into(),
            numa_node: Some(0),
        }],
    };
    PluginConfig {
        generation: 7,
        unified_resource_name: "kudos.dev/gpu".into(),
        nodes: BTreeMap::from([(
            "n1".to_string(),
            BTreeMap::from([("nvidia".to_string(), nv)]),
        )]),
        images: BTreeMap::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_image_reads_back_by_digest_and_is_reproducible() -> anyhow::Result<()> {
    let Some(run) = RunDir::for_test("rollout-registry", &registry::bins())? else {
        return Ok(());
    };
    kudos_rollout::install_crypto_provider();
    let reg = Registry::start(run.path(), free_port()).await?;
    let base = reg.push_plugin_base().await?;
    let metrics = RolloutMetrics::default();
    let deriver =
        ImageDeriver::new(settings(&reg.addr, &base, RetryPolicy::default()), metrics).unwrap();
    let v = view();
    let group = &v.groups().unwrap()[0];
    assert!(deriver.needs_derivation(&v, group).unwrap());
    let image = deriver.derive_with_retry(&v, group, None).await.unwrap();
    assert_eq!(image.tag, "nvidia-g7");
    assert_eq!(
        image.reference,
        format!("{}/kudos/device-plugin-derived@{}", reg.addr, image.digest)
    );

    let by_tag = format!("{}/kudos/device-plugin-derived:nvidia-g7", reg.addr);
    let by_digest = format!("docker://{}", image.reference);
    let inspected = inspect(&by_tag, &[])?;
    assert_eq!(inspected["Digest"], image.digest);
    assert_eq!(inspected["Layers"].as_array().unwrap().len(), 2);
    let env: Vec<&str> = inspected["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for want in [
        "PATH=/usr/bin:/bin",
        "KUDOS_RESOURCE_NAME=kudos.dev/gpu",
        "KUDOS_VENDOR=nvidia",
        "KUDOS_PLUGIN_CONFIG_DIR=/etc/kudos/plugin",
    ] {
        assert!(env.contains(&want), "{want} not in {env:?}");
    }

    let raw = skopeo(&["inspect", "--tls-verify=false", "--raw", &by_digest])?;
    assert_eq!(sha256_digest(&raw), image.digest);
    let manifest: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(
        layers[1]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );

    let config = inspect(&image.reference, &["--config"])?;
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert_eq!(diff_ids.len(), 2);
    assert_eq!(diff_ids[1], image.config_layer_diff_id);

    // The config layer, pulled back, decompresses to the tar whose sha256 is its diff_id and
    // carries the vendor's plugin configuration.
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    let target: oci_client::Reference = image.reference.parse().unwrap();
    let mut blob = Vec::new();
    client
        .pull_blob(&target, layers[1]["digest"].as_str().unwrap(), &mut blob)
        .await
        .unwrap();
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(blob.as_slice())
        .read_to_end(&mut tar)
        .unwrap();
    assert_eq!(sha256_digest(&tar), image.config_layer_diff_id);
    let mut archive = tar::Archive::new(tar.as_slice());
    let mut found = None;
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some("etc/kudos/plugin/nvidia.json") {
            let mut s = String::new();
            e.read_to_string(&mut s).unwrap();
            found = Some(serde_json::from_str::<Value>(&s).unwrap());
        }
    }
    let file = found.expect("plugin configuration file in the layer");
    assert_eq!(file["unifiedResourceName"], "kudos.dev/gpu");
    assert_eq!(file["nodes"]["n1"][0]["id"], "nv-GPU-0");

    // Same input (even at a later generation) → same digest; recorded → nothing to derive.
    let mut later = v.clone();
    later.generation = 8;
    let again = deriver
        .derive_with_retry(&later, group, None)
        .await
        .unwrap();
    assert_eq!(again.digest, image.digest);
    assert_eq!(again.tag, "nvidia-g8");
    later.images.insert("nvidia".into(), again);
    assert!(!deriver.needs_derivation(&later, group).unwrap());
    // A changed device list changes the image.
    let nvidia_on_n1 = later.nodes.get_mut("n1").and_then(|n| n.get_mut("nvidia"));
    nvidia_on_n1.expect("in the fixture").devices.clear();
    assert!(deriver.needs_derivation(&later, group).unwrap());
    let changed = deriver
        .derive_with_retry(&later, group, None)
        .await
        .unwrap();
    assert_ne!(changed.digest, image.digest);

    // A Docker-format (schema 2) base works too: layer media types become OCI ones.
    let policy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        policy.path(),
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .unwrap();
    let v2s2 = format!("{}/kudos/device-plugin-v2s2:base", reg.addr);
    skopeo(&[
        "copy",
        "--policy",
        policy.path().to_str().unwrap(),
        "--format",
        "v2s2",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{base}"),
        &format!("docker://{v2s2}"),
    ])?;
    let m = inspect(&v2s2, &["--raw"])?;
    assert_eq!(
        m["mediaType"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    let deriver = ImageDeriver::new(
        settings(&reg.addr, &v2s2, RetryPolicy::default()),
        RolloutMetrics::default(),
    )
    .unwrap();
    let from_v2s2 = deriver.derive_with_retry(&v, group, None).await.unwrap();
    let m = inspect(&from_v2s2.reference, &["--raw"])?;
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    for l in m["layers"].as_array().unwrap() {
        assert_eq!(
            l["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
    }
    let env = inspect(&from_v2s2.reference, &[])?["Env"].clone();
    assert!(
        env.as_array()
            .unwrap()
            .contains(&Value::String("KUDOS_VENDOR=nvidia".into()))
    );
    run.pass();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_leaves_configuration_unchanged_and_is_retried() -> anyhow::Result<()> {
    let Some(run) = RunDir::for_test("rollout-registry-down", &registry::bins())? else {
        return Ok(());
    };
    kudos_rollout::install_crypto_provider();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let retry = RetryPolicy {
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(4),
        multiplier: 2,
        max_attempts: 3,
    };
    let metrics = RolloutMetrics::default();
    let base = format!("{addr}/kudos/device-plugin:base");
    let deriver = ImageDeriver::new(settings(&addr, &base, retry), metrics.clone()).unwrap();
    let v = view();
    let group = &v.groups().unwrap()[0];

    match deriver.derive_with_retry(&v, group, None).await {
        Err(DeriveError::RetriesExhausted { attempts, last, .. }) => {
            assert_eq!(attempts, 3);
            assert!(last.is_transient());
        }
        other => panic!("expected exhausted retries, got {other:?}"),
    }
    assert_eq!(metrics.image_push_retries.get(), 2);

    // Through the reconciler: nothing recorded, error surfaces for backoff. The Kubernetes
    // client points at a closed port, so the pass fails either way; what matters is that
    // the configuration was not touched.
    let recorder = Arc::new(Recorder::default());
    let kube_config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let kube = kube::Client::try_from(kube_config).unwrap();
    let ctx = Arc::new(
        kudos_rollout::Ctx::new(
            RolloutSettings::default(),
            recorder.clone(),
            metrics.clone(),
        )
        .with_kube(kube)
        .with_deriver(deriver.clone()),
    );
    assert!(
        kudos_rollout::reconcile(Arc::new(v.clone()), ctx)
            .await
            .is_err()
    );
    assert!(recorder.0.lock().unwrap().is_empty());

    // The registry comes up; the next attempt succeeds.
    let reg = Registry::start(run.path(), port).await?;
    reg.push_plugin_base().await?;
    let image = deriver.derive_with_retry(&v, group, None).await.unwrap();
    assert!(
        image
            .reference
            .starts_with(&format!("{addr}/kudos/device-plugin-derived@sha256:"))
    );
    run.pass();
    Ok(())
}
