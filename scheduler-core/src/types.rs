//! Domain types shared by every step of the pipeline: the cluster as the caller sees it (nodes,
//! device profiles, pods), and what the scheduler answers (predictions, reviews, rankings,
//! placements, feedback).
//!
//! These are the contract with the orchestrator and the simulator: plain data, `serde` for
//! persistence and `/explain`, no behaviour beyond small helpers.

use serde::{Deserialize, Serialize};

pub use crate::name::Name;

/// Seconds since an epoch chosen by the caller. The library never reads a clock.
pub type Timestamp = f64;

/// What a node offers: the accelerator model (free-form string, as the device plugin reports it),
/// how many devices the node has, and their memory. Nodes with the same profile pool their
/// history in the first model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// Vendor, e.g. `nvidia`, `amd`.
    pub vendor: Name,
    /// Device model as reported, e.g. `Tesla V100-SXM2-16GB`, `A100`, `MI300X`.
    pub model: Name,
    /// Devices of this model on the node.
    pub count: u32,
    /// Memory per device, bytes.
    pub memory_bytes: u64,
}

impl DeviceProfile {
    /// A stable string key for maps that must serialise as JSON objects.
    pub fn key(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.vendor, self.model, self.count, self.memory_bytes
        )
    }
}

/// The monitored health of a node. Only `Healthy` nodes are ranked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeHealth {
    /// Devices healthy and the agent heartbeating.
    Healthy,
    /// The plugin or the monitor marked the node unhealthy.
    Unhealthy {
        /// Why, for the operator.
        reason: String,
    },
    /// No heartbeat for a while.
    Stale {
        /// Seconds since the last heartbeat.
        age_seconds: f64,
    },
}

/// One candidate node as the caller sees it at ranking time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// Node name (unique within a call).
    pub name: Name,
    /// Its accelerators.
    pub profile: DeviceProfile,
    /// Devices not allocated to any pod.
    pub free_devices: u32,
    /// Allocatable CPU, millicores.
    pub cpu_allocatable_milli: u64,
    /// CPU requested by pods already on the node, millicores.
    pub cpu_requested_milli: u64,
    /// Allocatable memory, bytes.
    pub memory_allocatable_bytes: u64,
    /// Memory requested by pods already on the node, bytes.
    pub memory_requested_bytes: u64,
    /// Monitored health.
    pub health: NodeHealth,
}

/// Membership of a pod in a gang (a distributed job whose members run together).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangSpec {
    /// Gang name, shared by all members.
    pub name: String,
    /// Number of members (pods).
    pub size: u32,
}

/// The pod to place, as far as scheduling is concerned. `Default` is a pod of no class that
/// asks for nothing, for literals that set only what they need.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodSpec {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Algorithm class (`kudos.dev/class`); `None` gets a neutral score.
    pub class: Option<String>,
    /// Devices requested (`kudos.dev/gpu`).
    pub gpus: u32,
    /// CPU request, millicores.
    pub cpu_milli: u64,
    /// Memory request, bytes.
    pub memory_bytes: u64,
    /// Declared work in units of the class (`kudos.dev/work`); time scales linearly with it.
    pub work_units: Option<f64>,
    /// Deadline in seconds (`kudos.dev/deadline-seconds`): the review threshold when given.
    pub deadline_seconds: Option<f64>,
    /// Gang membership, if any.
    pub gang: Option<GangSpec>,
    /// Vendors whose devices the pod's image can use (`kudos.dev/vendors`), lower case; empty
    /// when the pod names none (then its class's `allowed_vendors`, else the configuration's
    /// `default_vendors`, decide).
    #[serde(default)]
    pub vendors: Vec<String>,
}

/// Where a prediction came from, most specific first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PredictionSource {
    /// Enough runs of this class on this very node.
    OwnHistory {
        /// Runs (effective, rounded) behind the estimate.
        runs: u32,
    },
    /// Runs of this class pooled over nodes with the same device profile.
    Profile {
        /// Runs behind the estimate.
        runs: u32,
    },
    /// The class's level combined with a profile speed factor learned from other classes.
    Transfer,
    /// Device capability table (and the class's level when it has any history).
    Prior,
}

/// A predicted compute time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Predicted compute time (median), seconds.
    pub seconds: f64,
    /// Standard deviation of the estimate of `ln(seconds)`.
    pub uncertainty_log_sd: f64,
    /// Which evidence the prediction rests on.
    pub source: PredictionSource,
}

/// A node's review for a class: would (or did) it finish within the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Review {
    /// At or below the threshold.
    Good,
    /// Above the threshold.
    Bad,
}

/// Why a node was left out, machine-readable. [`RejectionKind::is_permanent`] separates what
/// waiting can fix (room, health) from mismatches between the pod and the hardware, which an
/// extender reports as `FailedAndUnresolvableNodes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// Too few free devices, CPU or memory right now (the node has enough in total).
    #[default]
    NoRoom,
    /// The node has fewer devices in total than the pod requests (possibly none).
    NoDevices,
    /// The class's vendor or model lists exclude the node's devices.
    ClassForbidsDevice,
    /// The node's devices are of a vendor the pod cannot use (its `kudos.dev/vendors`, or the
    /// default vendors for a pod that names none).
    VendorNotAllowed,
    /// The node's devices have less memory than the class requires.
    InsufficientDeviceMemory,
    /// The node is marked unhealthy.
    Unhealthy,
    /// The node's agent has not reported for a while.
    Stale,
}

impl RejectionKind {
    /// Every kind, in declaration order (`kind as usize` is its index).
    pub const ALL: [RejectionKind; 7] = [
        Self::NoRoom,
        Self::NoDevices,
        Self::ClassForbidsDevice,
        Self::VendorNotAllowed,
        Self::InsufficientDeviceMemory,
        Self::Unhealthy,
        Self::Stale,
    ];

    /// A short camelCase identifier (metric labels, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoRoom => "noRoom",
            Self::NoDevices => "noDevices",
            Self::ClassForbidsDevice => "classForbidsDevice",
            Self::VendorNotAllowed => "vendorNotAllowed",
            Self::InsufficientDeviceMemory => "insufficientDeviceMemory",
            Self::Unhealthy => "unhealthy",
            Self::Stale => "stale",
        }
    }

    /// True for mismatches that no change in load or health can resolve for this pod.
    pub fn is_permanent(self) -> bool {
        matches!(
            self,
            Self::NoDevices
                | Self::ClassForbidsDevice
                | Self::VendorNotAllowed
                | Self::InsufficientDeviceMemory
        )
    }
}

/// A node left out of the ranking, with the reason an operator can act on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// Node name.
    pub node: Name,
    /// Why it cannot run the pod.
    pub reason: String,
    /// The reason's category, for the extender (`FailedAndUnresolvableNodes` when permanent).
    #[serde(default)]
    pub kind: RejectionKind,
}

/// One node in the recommended queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankEntry {
    /// Node name.
    pub node: Name,
    /// Predicted compute time, `None` for pods without a class.
    pub prediction: Option<Prediction>,
    /// Predicted review, `None` for pods without a class.
    pub review: Option<Review>,
    /// Good-review rate (posterior mean, before exploration), 0..=1.
    pub good_rate: f64,
    /// Kudos score 0..=10 (the first queue; what the extender returns).
    pub score: u8,
    /// kube-scheduler's default plugins reproduced (NodeResourcesFit + BalancedAllocation), 0..=200.
    pub default_score: f64,
    /// Weighted merge of both.
    pub merged_score: f64,
    /// 1-based position in the recommended queue.
    pub rank: usize,
    /// Position of this node in the `nodes` that were ranked, so that a caller joins the answer
    /// back to its own input by index rather than by looking names up (at thousands of nodes a
    /// map from name to score cost the extender as much as a tenth of a call). Not serialised: it
    /// means nothing without that input.
    #[serde(skip)]
    pub candidate: usize,
}

/// The answer of [`crate::Scheduler::rank`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod class.
    pub class: Option<String>,
    /// The review threshold used, seconds (`None` without a class or without candidates).
    pub threshold_seconds: Option<f64>,
    /// The recommended queue, best first.
    pub entries: Vec<RankEntry>,
    /// Nodes that cannot run the pod.
    pub rejected: Vec<Rejection>,
}

/// A completed or in-progress run, as the orchestrator reconstructs it from a node agent report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunObservation {
    /// Node that ran it.
    pub node: String,
    /// Algorithm class.
    pub class: String,
    /// The node's device profile.
    pub profile: DeviceProfile,
    /// Devices the run used.
    pub gpus: u32,
    /// Start time.
    pub start: Timestamp,
    /// End time, or the snapshot time while in progress.
    pub end: Timestamp,
    /// Whether the run finished.
    pub completed: bool,
    /// Fraction done, in (0, 1]; a run in progress needs it or `work_units`.
    pub progress: Option<f64>,
    /// Seconds the devices were busy, if measured.
    pub gpu_busy_seconds: Option<f64>,
    /// Work done by `end`, in units of the class: the whole run's in a final report, the work
    /// done so far in an in-progress snapshot (`kudos.dev/progress`). Time per unit is learned
    /// from it directly, with no declared total needed.
    pub work_units: Option<f64>,
}

/// What [`crate::Scheduler::observe`] learned from one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Feedback {
    /// Actual (or extrapolated) compute time, seconds.
    pub actual_seconds: f64,
    /// The actual review of the node for this run.
    pub review: Review,
    /// The third queue: nodes re-scored by this observation with their new score (0..=10),
    /// best first.
    pub third_queue: Vec<(String, u8)>,
}

/// One gang member's slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangSlot {
    /// Node name.
    pub node: String,
    /// Devices reserved on it for this member.
    pub gpus: u32,
}

/// A gang's chosen slots, reserved until `expires_at`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GangPlacement {
    /// One slot per member.
    pub members: Vec<GangSlot>,
    /// When the reservation lapses if the gang's pods have not all bound.
    pub expires_at: Timestamp,
    /// Predicted compute time of the slowest member, seconds (0 when the pod has no class).
    pub predicted_seconds: f64,
}
