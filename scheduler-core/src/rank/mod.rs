//! The scheduling flow of design §2.2, steps 1 to 5: [`rank_lazily`] runs steps 1 to 4 as one
//! named function each, in order, and keeps what step 5 needs in a [`LazyRanking`], which
//! merges the queues when its order is first read; [`crate::Scheduler::rank`] writes that
//! ranking whole.
//!
//! | §2.2 step | Function | What it leaves for the next step |
//! | --- | --- | --- |
//! | 1 | [`node_set::node_set`] | one row per candidate, its profile; the rejections |
//! | 2 | [`evaluate::predict`] | a prediction per profile, and per node with its own history |
//! | 3 | [`evaluate::review_threshold`] | the threshold the reviews are made against |
//! | 4 | [`evaluate::score`] | good-review rate and 0..=10 score per evaluation |
//! | 5 | [`scored`], then [`merge::order`] when read | what the default plugins read per row; their scores and the recommended order |
//!
//! [`LazyRanking`] writes entries of the [`crate::Ranking`] from the scored rows; `table.rs` explains one.
//!
//! This is the extender's hot path: kube-scheduler calls it serially for every pod, over up to
//! thousands of nodes, so its shape follows from cost:
//! - Nodes share few device profiles. Class checks, the profile-level prediction and, for nodes
//!   without their own history, the review and score are computed once per profile ([`Eval`] on
//!   the [`ProfileRow`]); only a node with its own history (or a Thompson draw) gets its own.
//! - Per candidate there is one small plain-data [`Row`]; every per-call buffer lives in a
//!   thread-local [`Scratch`] reused across calls, so a call allocates its answer (per ranked
//!   node its name, evaluation and resources; the rejections) and nothing else that grows
//!   with the nodes. Entries are written only when read (see [`lazy`]).
//! - The merge sorts `(u64, u32)` keys: merged score, tie queue position and the name's leading
//!   bits after the common prefix; full names are compared only where those keys agree (see
//!   [`merge`]).

mod evaluate;
mod lazy;
mod merge;
mod node_set;
mod table;
#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::cell::Cell;

use crate::config::{ClassConfig, Exploration, SchedulerConfig};
use crate::predict::{ClassLookup, ClassState, LogPrediction, ModelState, work_scale};
use crate::queue::{DefaultPlugins, NodeResources};
use crate::types::{NodeState, PodSpec, Rejection, RejectionKind};

use evaluate::Threshold;
pub use lazy::LazyRanking;
use lazy::{NameText, Scored, ScoredRow};

/// [`Row::eval`] of a node that shares its profile's evaluation.
const SHARED: u32 = u32::MAX;

/// Rows beyond which an idle scratch gives memory back when a call uses under a quarter of it.
const SCRATCH_KEEP_ROWS: usize = 1 << 16;

/// What one ranking call reads: its arguments and the pod's class as the model knows it.
pub(super) struct Call<'a, N> {
    config: &'a SchedulerConfig,
    state: &'a ModelState,
    pod: &'a PodSpec,
    nodes: &'a [N],
    now: f64,
    seed: u64,
    class: Option<Class<'a>>,
}

impl<N: Borrow<NodeState>> Call<'_, N> {
    /// Candidate `i` (an index into the call's nodes).
    fn node(&self, i: u32) -> &NodeState {
        self.nodes[i as usize].borrow()
    }
}

/// The pod's class: configuration, learned state and the log of its declared work.
struct Class<'a> {
    name: &'a str,
    config: Option<&'a ClassConfig>,
    lookup: ClassLookup<'a>,
    /// The class's per-node cells, when it has any.
    history: Option<&'a ClassState>,
    ln_work: f64,
}

impl<'a> Class<'a> {
    /// The pod's class, if it has one.
    fn of(config: &'a SchedulerConfig, state: &'a ModelState, pod: &'a PodSpec) -> Option<Self> {
        let name = pod.class.as_deref()?;
        let lookup = state.class_for(name, pod.gpus);
        Some(Self {
            name,
            config: config.classes.get(name),
            lookup,
            history: lookup.own.filter(|c| !c.nodes.is_empty()),
            ln_work: work_scale(pod.work_units).ln(),
        })
    }
}

/// One candidate (a node that passed step 1).
#[derive(Clone, Copy, Debug)]
struct Row {
    /// Index into the call's nodes.
    node: u32,
    /// Index into [`Scratch::profiles`].
    profile: u32,
    /// Index into [`Scratch::evals`], or [`SHARED`]: the profile's evaluation.
    eval: u32,
}

/// One distinct device profile among the candidates.
#[derive(Clone, Debug)]
struct ProfileRow {
    /// The first node that has it (its profile is the one compared and predicted).
    first: u32,
    hash: u64,
    /// Step 1's class check.
    allowed: Result<(), (RejectionKind, String)>,
    /// Step 2's profile-level prediction (with a class).
    pred: Option<LogPrediction>,
    /// Candidates that share [`ProfileRow::eval`].
    shared_rows: u32,
    /// Steps 2 to 4 for the nodes without their own evaluation.
    eval: Eval,
}

/// Steps 2 to 4 for one node, or for every node of a profile that shares it.
#[derive(Clone, Copy, Debug)]
struct Eval {
    /// The prediction per work unit, `None` without a class.
    pred: Option<LogPrediction>,
    /// Predicted log time of the pod (0 without a prediction).
    log_time: f64,
    /// The log time the exploring score reviews (optimistic or sampled).
    point: f64,
    /// The node's actual reviews `(good, bad, as of)`, when it has its own history.
    reviews: Option<(f64, f64, f64)>,
    /// Good-review rate before exploration (reported).
    good_rate: f64,
    /// Rate behind the score, with exploration.
    rate: f64,
    score: u8,
    /// Predicted seconds.
    seconds: f64,
}

impl Eval {
    /// A pod without a class, or no threshold to review against: the neutral score.
    const NEUTRAL: Eval = Eval {
        pred: None,
        log_time: 0.0,
        point: 0.0,
        reviews: None,
        good_rate: 0.5,
        rate: 0.5,
        score: 5,
        seconds: 0.0,
    };
}

/// Per-call buffers, kept per thread so repeated calls reuse them.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    profiles: Vec<ProfileRow>,
    /// Profile keys (`DeviceProfile::key`), reused: profile `i` uses `profile_keys[i]`.
    profile_keys: Vec<String>,
    /// Recently matched profiles (index + 1, 0 for none), by the model name's allocation.
    /// [`node_set::RECENT_SLOTS`] of them once the first call sized it.
    recent_profiles: Vec<u32>,
    rows: Vec<Row>,
    /// Evaluations of nodes with their own history (or their own Thompson draw).
    evals: Vec<Eval>,
    /// Step 5's name keys (see [`crate::queue::name_key`]), by ranked node.
    name_keys: Vec<u64>,
    /// Step 5's position of each evaluation in the first queue, without names.
    queue_ranks: Vec<u32>,
    /// Step 5's sort keys; afterwards `(_, row)` in recommended order.
    order: Vec<(u64, u32)>,
    /// Step 5's keys with the row in their lowest bits, as sorted.
    packed: Vec<u64>,
    pair_ranks: merge::PairRanks,
}

impl Scratch {
    /// Gives memory back after an unusually large call, so one huge request does not pin it.
    fn trim(&mut self) {
        let large = |cap: usize, len: usize| cap > SCRATCH_KEEP_ROWS && len < cap / 4;
        if large(self.rows.capacity(), self.rows.len())
            || large(self.name_keys.capacity(), self.name_keys.len())
        {
            *self = Self {
                pair_ranks: std::mem::take(&mut self.pair_ranks),
                ..Self::default()
            };
        }
    }
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// Runs `f` on this thread's scratch. The scratch is taken out while `f` runs and put back after,
/// so a nested call (or one while the thread exits) works on a fresh one.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.try_with(Cell::take).unwrap_or_default();
    let out = f(&mut s);
    s.trim();
    let _ = SCRATCH.try_with(|cell| cell.set(s));
    out
}

/// Ranks `nodes` for `pod` (see [`crate::Scheduler::rank_lazily`]): steps 1 to 4, and what the
/// second queue reads of each node; its scores and the merge wait until the order is read.
pub fn rank_lazily<N: Borrow<NodeState>>(
    config: &SchedulerConfig,
    state: &ModelState,
    pod: &PodSpec,
    nodes: &[N],
    now: f64,
    seed: u64,
) -> LazyRanking {
    let call = Call {
        class: Class::of(config, state, pod),
        config,
        state,
        pod,
        nodes,
        now,
        seed,
    };
    with_scratch(|s| {
        let rejected = node_set::node_set(&call, s);
        let fastest = evaluate::predict(&call, s);
        let threshold = evaluate::review_threshold(&call, fastest);
        evaluate::score(&call, &threshold, s);
        scored(&call, &threshold, s, rejected)
    })
}

/// What step 5 needs of the call, kept once the call's nodes are gone: per ranked node its
/// name, its evaluation and what the default plugins (the second queue, reproduced) read of it.
fn scored<N: Borrow<NodeState>>(
    call: &Call<'_, N>,
    threshold: &Threshold,
    s: &Scratch,
    rejected: Vec<Rejection>,
) -> LazyRanking {
    let own = s.evals.len() as u32;
    let names = NameText::copied(s.rows.iter().map(|row| call.node(row.node).name.as_str()));
    let rows = s
        .rows
        .iter()
        .map(|row| {
            let node = call.node(row.node);
            ScoredRow {
                candidate: row.node,
                eval: match row.eval {
                    SHARED => own + row.profile,
                    e => e,
                },
                resources: NodeResources::of(node),
            }
        })
        .collect();
    let evals = s
        .evals
        .iter()
        .copied()
        .chain(s.profiles.iter().map(|p| p.eval))
        .collect();
    LazyRanking::scored(
        call.pod.namespace.clone(),
        call.pod.name.clone(),
        call.pod.class.clone(),
        threshold.seconds,
        rejected,
        Scored {
            rows,
            names,
            evals,
            plugins: DefaultPlugins::new(call.pod),
            weights: call.config.merge_weights.clone(),
        },
    )
}

/// Whether the exploring score reviews a point other than the prediction itself.
fn exploring(config: &SchedulerConfig) -> bool {
    !matches!(config.exploration, Exploration::None)
}
