//! Device health as a stream of transitions, so devices can recover (NVIDIA's plugin never
//! marks a device healthy again; see the FIXME in its `ListAndWatch`).
//!
//! Inputs: backend signals (a non-ignored XID, NVML not answering) and periodic probes.
//! Rule: a device turns Unhealthy on a critical signal or a failed probe; it turns Healthy
//! again once its probe succeeds and no critical signal arrived for `quiet_for`. The
//! [`HealthTracker`] is pure (time is an argument); [`run`] drives it. The last critical
//! signal of each device outlives a restart ([`CriticalLog`]).

use crate::backend::{Backends, Health, HealthSignal};
use crate::metrics::Metrics;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};

/// Health of every device by ID, as published to the server.
pub type HealthMap = BTreeMap<String, Health>;

// === impl XidIgnoreList ===

/// XIDs that say the application did something wrong, not the GPU: they must not take a
/// device out of service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidIgnoreList(BTreeSet<u64>);

impl XidIgnoreList {
    /// Graphics engine exception (13), MMU fault (31), channel stopped (43), preemptive
    /// cleanup (45), video processor exception (68), context-switch timeout (109).
    pub const DEFAULT: [u64; 6] = [13, 31, 43, 45, 68, 109];

    /// Whether `xid` is ignored.
    pub fn ignores(&self, xid: u64) -> bool {
        self.0.contains(&xid)
    }
}

impl Default for XidIgnoreList {
    fn default() -> Self {
        XidIgnoreList(Self::DEFAULT.into_iter().collect())
    }
}

impl FromStr for XidIgnoreList {
    type Err = String;

    /// A comma-separated list (`13,31,43`), `default`, or `none`/empty for no exceptions.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s {
            "default" => return Ok(Self::default()),
            "" | "none" => return Ok(XidIgnoreList(BTreeSet::new())),
            _ => {}
        }
        s.split(',')
            .map(|x| {
                x.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{x:?} is not an XID number"))
            })
            .collect::<Result<_, _>>()
            .map(XidIgnoreList)
    }
}

impl std::fmt::Display for XidIgnoreList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&v.join(","))
    }
}

// === impl HealthTracker ===

/// One change of one device's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Device ID.
    pub id: String,
    /// Vendor key.
    pub vendor: String,
    /// New health.
    pub to: Health,
    /// Why, for the log.
    pub reason: String,
}

#[derive(Debug)]
struct DeviceState {
    vendor: String,
    health: Health,
    last_critical: Option<Instant>,
}

/// Per-device health state machine.
#[derive(Debug)]
pub struct HealthTracker {
    quiet_for: Duration,
    devices: BTreeMap<String, DeviceState>,
    log: Option<CriticalLog>,
    /// What the log holds now, so a burst of signals within one second writes it once.
    logged: BTreeMap<String, u64>,
}

impl HealthTracker {
    /// Starts with every device healthy. `quiet_for`: how long after the last critical signal
    /// a device with a passing probe becomes healthy again.
    pub fn new<'a>(
        devices: impl IntoIterator<Item = (&'a str, &'a str)>,
        quiet_for: Duration,
    ) -> Self {
        let devices = devices
            .into_iter()
            .map(|(id, vendor)| {
                (
                    id.to_owned(),
                    DeviceState {
                        vendor: vendor.to_owned(),
                        health: Health::Healthy,
                        last_critical: None,
                    },
                )
            })
            .collect();
        HealthTracker {
            quiet_for,
            devices,
            log: None,
            logged: BTreeMap::new(),
        }
    }

    /// Keeps the critical events in `log` ([`HealthTracker::record`]) and seeds the devices
    /// whose last one is recent ([`HealthTracker::restore`]); returns how many were seeded.
    pub fn with_log(&mut self, log: CriticalLog, now_wall: SystemTime, now: Instant) -> usize {
        let events = log.load();
        let seeded = self.restore(&events, now_wall, now);
        self.logged = events;
        self.log = Some(log);
        seeded
    }

    /// Writes the recent critical events to the log, if there is one and they changed (each
    /// write is flushed to disk; an XID storm must not become one per XID).
    pub fn record(&mut self, now_wall: SystemTime, now: Instant) {
        let Some(log) = &self.log else {
            return;
        };
        let events = self.critical_events(now_wall, now);
        if events != self.logged && log.store(&events) {
            self.logged = events;
        }
    }

    /// Current health of every device.
    pub fn snapshot(&self) -> HealthMap {
        self.devices
            .iter()
            .map(|(id, s)| (id.clone(), s.health))
            .collect()
    }

    fn mark_unhealthy(
        &mut self,
        id: &str,
        now: Instant,
        reason: &str,
        critical: bool,
    ) -> Option<Transition> {
        let s = self.devices.get_mut(id)?;
        if critical {
            s.last_critical = Some(now);
        }
        if s.health == Health::Unhealthy {
            return None;
        }
        s.health = Health::Unhealthy;
        Some(Transition {
            id: id.to_owned(),
            vendor: s.vendor.clone(),
            to: Health::Unhealthy,
            reason: reason.to_owned(),
        })
    }

    /// Applies a backend signal.
    pub fn on_signal(&mut self, signal: &HealthSignal, now: Instant) -> Vec<Transition> {
        match signal {
            HealthSignal::Critical { id, reason } => self
                .mark_unhealthy(id, now, reason, true)
                .into_iter()
                .collect(),
            HealthSignal::BackendDown { vendor, reason } => {
                let ids: Vec<String> = self
                    .devices
                    .iter()
                    .filter(|(_, s)| &s.vendor == vendor)
                    .map(|(id, _)| id.clone())
                    .collect();
                ids.iter()
                    .filter_map(|id| self.mark_unhealthy(id, now, reason, true))
                    .collect()
            }
        }
    }

    /// Applies one probe result.
    pub fn on_probe(
        &mut self,
        id: &str,
        result: Result<(), String>,
        now: Instant,
    ) -> Option<Transition> {
        match result {
            Err(reason) => self.mark_unhealthy(id, now, &format!("probe failed: {reason}"), false),
            Ok(()) => {
                let quiet_for = self.quiet_for;
                let s = self.devices.get_mut(id)?;
                let quiet = s
                    .last_critical
                    .is_none_or(|t| now.saturating_duration_since(t) >= quiet_for);
                if s.health == Health::Unhealthy && quiet {
                    s.health = Health::Healthy;
                    return Some(Transition {
                        id: id.to_owned(),
                        vendor: s.vendor.clone(),
                        to: Health::Healthy,
                        reason: format!("probe passes and no critical event for {quiet_for:?}"),
                    });
                }
                None
            }
        }
    }

    /// Seeds the devices whose last critical signal (`events`: device ID → Unix seconds) came
    /// less than the quiet period before `now_wall`: they start unhealthy and recover once the
    /// rest of the period has passed. Unknown IDs are ignored. Returns how many were seeded.
    pub fn restore(
        &mut self,
        events: &BTreeMap<String, u64>,
        now_wall: SystemTime,
        now: Instant,
    ) -> usize {
        let mut seeded = 0;
        for (id, secs) in events {
            let Some(s) = self.devices.get_mut(id) else {
                continue;
            };
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(*secs);
            let age = now_wall.duration_since(at).unwrap_or(Duration::ZERO);
            if age < self.quiet_for {
                s.health = Health::Unhealthy;
                s.last_critical = Some(now.checked_sub(age).unwrap_or(now));
                seeded += 1;
            }
        }
        seeded
    }

    /// The last critical signal of each device still within its quiet period, as Unix seconds
    /// (rounded up: a restored device waits at least as long as it would have).
    pub fn critical_events(&self, now_wall: SystemTime, now: Instant) -> BTreeMap<String, u64> {
        self.devices
            .iter()
            .filter_map(|(id, s)| {
                let age = now.saturating_duration_since(s.last_critical?);
                (age < self.quiet_for).then_some(())?;
                let at = now_wall.checked_sub(age)?;
                let d = at.duration_since(SystemTime::UNIX_EPOCH).ok()?;
                Some((id.clone(), d.as_secs() + u64::from(d.subsec_nanos() > 0)))
            })
            .collect()
    }
}

// === critical signals across restarts ===

/// The last critical signal of each device, on disk beside the name cache
/// (`critical-events`), so a restarted plugin keeps a device that raised XIDs out of service
/// for the rest of its quiet period. NVML does not replay XIDs to a new event set: without
/// this, an upgrade or a crash would publish a failing GPU as healthy at once.
#[derive(Clone, Debug)]
pub struct CriticalLog {
    path: PathBuf,
}

impl CriticalLog {
    /// The log beside the name cache `name_cache`.
    pub fn beside(name_cache: &Path) -> Self {
        CriticalLog {
            path: name_cache.with_file_name("critical-events"),
        }
    }

    /// Device ID → Unix seconds of its last critical signal; empty when there is no file, and
    /// when it is damaged (logged: the devices then start healthy, as before this log).
    pub fn load(&self) -> BTreeMap<String, u64> {
        let Ok(bytes) = std::fs::read(&self.path) else {
            return BTreeMap::new();
        };
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %self.path.display(), error = %e, "ignoring a damaged critical-event log");
            BTreeMap::new()
        })
    }

    /// Replaces the log with `events`; whether it was written (failures are logged, not
    /// fatal).
    pub fn store(&self, events: &BTreeMap<String, u64>) -> bool {
        let written = serde_json::to_vec(events)
            .map_err(std::io::Error::other)
            .and_then(|b| crate::dra::write_atomic(&self.path, &b));
        if let Err(e) = &written {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot record critical events");
        }
        written.is_ok()
    }
}

// === run ===

/// Drives the tracker: backend signals as they come, probes every `probe_every`, and
/// publishes every change. Returns when `shutdown` fires or the publisher has no readers.
pub async fn run(
    backends: Backends,
    mut tracker: HealthTracker,
    mut signals: mpsc::UnboundedReceiver<HealthSignal>,
    probe_every: Duration,
    publish: watch::Sender<Arc<HealthMap>>,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    // A hung vendor library must not stall the loop: probes get this long, and while one
    // is still stuck no second thread is sent after it.
    let probe_timeout = probe_every.max(Duration::from_secs(2));
    let mut probing: Option<ProbeRound> = None;
    let mut tick = tokio::time::interval(probe_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let transitions = tokio::select! {
            _ = shutdown.changed() => return,
            Some(signal) = signals.recv() => {
                let transitions = tracker.on_signal(&signal, Instant::now());
                tracker.record(SystemTime::now(), Instant::now());
                transitions
            }
            _ = tick.tick() => {
                let results = probe_all(&backends, &mut probing, probe_timeout).await;
                let now = Instant::now();
                results.into_iter().filter_map(|(id, r)| tracker.on_probe(&id, r, now)).collect()
            }
        };
        if transitions.is_empty() {
            continue;
        }
        for t in &transitions {
            match t.to {
                Health::Healthy => {
                    tracing::info!(device = %t.id, vendor = %t.vendor, reason = %t.reason, "device healthy again")
                }
                Health::Unhealthy => {
                    tracing::warn!(device = %t.id, vendor = %t.vendor, reason = %t.reason, "device unhealthy")
                }
            }
            metrics.health_transition(&t.vendor, t.to);
        }
        metrics.set_devices(&backends, &tracker.snapshot());
        if publish.send(Arc::new(tracker.snapshot())).is_err() {
            return;
        }
    }
}

/// Probe results by device ID.
type ProbeResults = Vec<(String, Result<(), String>)>;
/// A probe round running on a blocking thread.
type ProbeRound = tokio::task::JoinHandle<ProbeResults>;

/// Probes every device on a blocking thread (vendor libraries block). A probe round that
/// does not finish within `timeout` fails every device; the stuck round is awaited on later
/// ticks instead of starting another.
async fn probe_all(
    backends: &Backends,
    probing: &mut Option<ProbeRound>,
    timeout: Duration,
) -> ProbeResults {
    let handle = probing.get_or_insert_with(|| {
        let b = backends.clone();
        tokio::task::spawn_blocking(move || {
            b.iter()
                .flat_map(|be| {
                    be.devices()
                        .iter()
                        .map(move |d| (d.id.clone(), be.probe(d)))
                })
                .collect()
        })
    });
    match tokio::time::timeout(timeout, handle).await {
        Ok(done) => {
            *probing = None;
            done.unwrap_or_default()
        }
        Err(_) => {
            let reason = format!("probe did not return within {timeout:?}");
            tracing::warn!("{reason}; marking devices unhealthy");
            backends
                .devices()
                .map(|d| (d.id.clone(), Err(reason.clone())))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_list_parses_and_defaults() {
        let d = XidIgnoreList::default();
        for x in [13, 31, 43, 45, 68, 109] {
            assert!(d.ignores(x));
        }
        assert!(!d.ignores(79) && !d.ignores(48));
        let custom: XidIgnoreList = "13, 79".parse().expect("list");
        assert!(custom.ignores(79) && !custom.ignores(31));
        assert_eq!(custom.to_string(), "13,79");
        assert!(!"none".parse::<XidIgnoreList>().expect("none").ignores(13));
        assert_eq!("default".parse::<XidIgnoreList>(), Ok(d));
        assert!("13,x".parse::<XidIgnoreList>().is_err());
    }

    #[test]
    fn devices_go_unhealthy_and_recover_after_a_quiet_period() {
        let t0 = Instant::now();
        let mut t = HealthTracker::new(
            [("nv-a", "nvidia"), ("nv-b", "nvidia"), ("amd-c", "amd")],
            Duration::from_secs(10),
        );
        let crit = HealthSignal::Critical {
            id: "nv-a".into(),
            reason: "XID 79".into(),
        };
        let tr = t.on_signal(&crit, t0);
        assert_eq!(tr.len(), 1);
        assert_eq!((tr[0].id.as_str(), tr[0].to), ("nv-a", Health::Unhealthy));
        assert!(t.on_signal(&crit, t0).is_empty(), "no duplicate transition");
        // Probe passes, but the quiet period has not elapsed.
        assert_eq!(
            t.on_probe("nv-a", Ok(()), t0 + Duration::from_secs(5)),
            None
        );
        let back = t
            .on_probe("nv-a", Ok(()), t0 + Duration::from_secs(10))
            .expect("recovers");
        assert_eq!(back.to, Health::Healthy);

        // NVML down: every NVIDIA device, not AMD.
        let down = HealthSignal::BackendDown {
            vendor: "nvidia".into(),
            reason: "NVML timeout".into(),
        };
        assert_eq!(t.on_signal(&down, t0 + Duration::from_secs(20)).len(), 2);
        assert_eq!(t.snapshot()["amd-c"], Health::Healthy);

        // A failing probe keeps it down; recovery needs both a passing probe and quiet.
        assert!(
            t.on_probe("nv-b", Err("lost".into()), t0 + Duration::from_secs(40))
                .is_none()
        );
        assert!(
            t.on_probe("nv-b", Ok(()), t0 + Duration::from_secs(41))
                .is_some()
        );
        // Probe failure alone (no critical event) recovers as soon as the probe passes.
        assert!(t.on_probe("amd-c", Err("gone".into()), t0).is_some());
        assert!(t.on_probe("amd-c", Ok(()), t0).is_some());
        assert!(t.on_probe("unknown", Err("x".into()), t0).is_none());
    }

    /// Found on a real kubelet: a restarted plugin published a device that kept raising XIDs
    /// as healthy, and the scheduler allocated it before the next XID.
    #[test]
    fn a_restart_keeps_a_recently_failing_device_down_for_the_rest_of_its_quiet_period() {
        let quiet = Duration::from_secs(60);
        let (t0, wall0) = (Instant::now(), SystemTime::now());
        let mut before = HealthTracker::new([("nv-a", "nvidia"), ("nv-b", "nvidia")], quiet);
        let crit = HealthSignal::Critical {
            id: "nv-a".into(),
            reason: "XID 79".into(),
        };
        before.on_signal(&crit, t0);
        let events = before.critical_events(wall0, t0 + Duration::from_secs(20));
        assert_eq!(events.keys().collect::<Vec<_>>(), ["nv-a"]);

        let dir = tempfile::tempdir().expect("tempdir");
        let log = CriticalLog::beside(&dir.path().join("resource-name"));
        assert!(log.load().is_empty(), "no file yet");
        assert_eq!(before.with_log(log.clone(), wall0, t0), 0);
        before.record(wall0, t0 + Duration::from_secs(20));
        assert_eq!(log.load(), events);
        // Unchanged events are not written again (each write is flushed to disk).
        let file = dir.path().join("critical-events");
        std::fs::remove_file(&file).expect("remove");
        before.record(wall0, t0 + Duration::from_secs(20));
        assert!(!file.exists(), "rewritten without a change");
        before.on_signal(&crit, t0 + Duration::from_secs(30));
        before.record(
            wall0 + Duration::from_secs(30),
            t0 + Duration::from_secs(30),
        );
        assert!(file.exists(), "a new critical event is written");
        std::fs::write(&file, serde_json::to_vec(&events).expect("json")).expect("restore file");

        // Restarted 30 s after the XID: down for about 30 s more, then recovers.
        let t1 = t0 + Duration::from_secs(100);
        let mut after = HealthTracker::new([("nv-a", "nvidia"), ("nv-b", "nvidia")], quiet);
        let seeded = after.restore(&log.load(), wall0 + Duration::from_secs(10), t1);
        assert_eq!(seeded, 1);
        assert_eq!(after.snapshot()["nv-a"], Health::Unhealthy);
        assert_eq!(after.snapshot()["nv-b"], Health::Healthy);
        assert!(
            after
                .on_probe("nv-a", Ok(()), t1 + Duration::from_secs(29))
                .is_none()
        );
        assert!(
            after
                .on_probe("nv-a", Ok(()), t1 + Duration::from_secs(32))
                .is_some()
        );

        // Older than the quiet period, an unknown device, or a damaged file: nothing seeded.
        let mut late = HealthTracker::new([("nv-a", "nvidia")], quiet);
        assert_eq!(
            late.restore(&events, wall0 + Duration::from_secs(61), t1),
            0
        );
        let unknown = BTreeMap::from([("gone".to_owned(), events["nv-a"])]);
        assert_eq!(late.restore(&unknown, wall0, t1), 0);
        std::fs::write(dir.path().join("critical-events"), b"{not json").expect("write");
        assert!(log.load().is_empty());
    }
}
