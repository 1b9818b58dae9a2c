//! What the scheduler is asked to do, and what became of it.
//!
//! Plain serde types: a follower forwards an [`Evaluation`] to the leader
//! over the peer wire (bincode) and gets the [`EvalResult`] back.

use gshare_core::model::{FunctionSpec, NodeId, TenantId};
use gshare_core::state::{
    Applied, ApplyError, InstanceId, MigrationCause, MoveError, MoveTarget, NoDefrag, PlanRejection,
};
use serde::{Deserialize, Serialize};

/// One thing for the scheduler to decide (Nomad's evaluation).
///
/// Each kind names what triggered it. The autoscaler (`scale`) and
/// migration add their kinds here;
/// the worker's `match` is exhaustive, so a new kind cannot be forgotten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Evaluation {
    /// A tenant deploys a function: the deploy and the placements of its
    /// `min_instances` are one `FunctionCreate`, under the request's
    /// idempotency key.
    Deploy {
        /// The owner (the token's tenant).
        tenant: TenantId,
        /// The request's idempotency key.
        key: String,
        /// What the request was (a reused key with another fingerprint is refused).
        fingerprint: String,
        /// The spec (`spec.tenant == tenant`); boxed to keep the other
        /// kinds small (the wire form is the spec's own).
        spec: Box<FunctionSpec>,
    },
    /// A deployed function is below `min_instances` (a drained node, a
    /// reshaping update, GPUs an agent no longer has): place one more.
    Underplaced {
        /// The owner.
        tenant: TenantId,
        /// The function.
        function: String,
    },
    /// `node` has been `not_ready` past `node_replace_grace_ms`: move
    /// `instance` elsewhere in one step (`InstanceReplace`), under the
    /// function's pool preference.
    NodeNotReady {
        /// The node.
        node: NodeId,
        /// One of its instances.
        instance: InstanceId,
    },
    /// The operator drains `node`: place a new instance of `instance`'s
    /// function elsewhere first where `max_instances` allows (the drain
    /// controller releases the old one once the new one is delivered), or
    /// else move it in one step.
    Drain {
        /// The node.
        node: NodeId,
        /// One of its instances.
        instance: InstanceId,
    },
    /// A reshaping update left `instance` outgoing: place a current-version
    /// instance first (the roll releases the old one once the new one is
    /// resident), or, where capacity or quota has no room for both, move it
    /// in one step (see `gshare_core::state::plan_replacement`).
    Replace {
        /// The outgoing instance.
        instance: InstanceId,
    },
    /// The autoscaler wants `desired` instances of a function that has
    /// fewer: place one more (never past `max_instances`).
    ScaleOut {
        /// The owner.
        tenant: TenantId,
        /// The function.
        function: String,
        /// The autoscaler's decision.
        desired: u32,
    },
    /// The autoscaler wants fewer instances: release `instance` (never
    /// below `min_instances`).
    ScaleIn {
        /// The owner.
        tenant: TenantId,
        /// The function.
        function: String,
        /// The instance the autoscaler chose (`pick_scale_in`).
        instance: InstanceId,
    },
    /// Move `instance` into `target`, make-before-break
    /// (`InstanceMigrate`): an operator's move, or a spilled instance
    /// going back to its preferred pool. The leader releases the old one
    /// once the new one is ready (see `scheduler::migrate`).
    Migrate {
        /// The instance.
        instance: InstanceId,
        /// Where to.
        target: MoveTarget,
        /// Why.
        cause: MigrationCause,
    },
    /// Like [`Evaluation::ScaleOut`], for an `edge:<pool>` function whose
    /// edge nodes miss its deadlines: the new instance is planned in the
    /// center (the edge pool sheds load there).
    Shed {
        /// The owner.
        tenant: TenantId,
        /// The function.
        function: String,
        /// The autoscaler's decision.
        desired: u32,
    },
    /// One more instance of a function found no GPU although its pools
    /// have the room in sum (a scale-out, a shed or a function below
    /// `min_instances` answered `gpu_full`): move at most two small
    /// instances of other functions make-before-break to make room
    /// (`plan_defragment`; the first move is proposed, the next
    /// evaluation sees it leaving and plans the rest).
    Defragment {
        /// The owner.
        tenant: TenantId,
        /// The function.
        function: String,
        /// The instances it should have (`min_instances`, or the
        /// autoscaler's decision within `max_instances`).
        desired: u32,
        /// Planned in the center (a shed) rather than its own preference.
        shed: bool,
    },
}

impl Evaluation {
    /// A short stable name of the kind (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Evaluation::Deploy { .. } => "deploy",
            Evaluation::Underplaced { .. } => "underplaced",
            Evaluation::NodeNotReady { .. } => "node_not_ready",
            Evaluation::Drain { .. } => "drain",
            Evaluation::Replace { .. } => "replace",
            Evaluation::ScaleOut { .. } => "scale_out",
            Evaluation::ScaleIn { .. } => "scale_in",
            Evaluation::Migrate { .. } => "migrate",
            Evaluation::Shed { .. } => "shed",
            Evaluation::Defragment { .. } => "defragment",
        }
    }
}

/// An evaluation whose plan was committed (or found already committed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalDone {
    /// What the committed entry did (a replayed key: the first outcome;
    /// an underplaced function already at its minimum: nothing, `None`).
    pub applied: Option<Applied>,
    /// Plans made again because apply refused one planned on a view
    /// another write had changed.
    pub replans: u32,
}

/// Why an evaluation placed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum EvalError {
    /// The planner found no place; nothing was proposed.
    #[error(transparent)]
    Rejected(Box<PlanRejection>),
    /// The state machine refused the plan (or the view already shows it
    /// would); nothing changed.
    #[error(transparent)]
    Refused(ApplyError),
    /// No leader is known (or leadership moved); nothing was decided. Retry.
    #[error("no leader is known; retry")]
    NoLeader,
    /// The outcome is not known (a write or a forward lost its answer):
    /// retry under the same idempotency key.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The scheduler is stopping.
    #[error("the scheduler is stopping")]
    Stopped,
    /// The instance cannot move there; nothing was proposed.
    #[error(transparent)]
    Unmovable(MoveError),
    /// No room can be made by defragmentation; nothing was proposed.
    #[error("no room can be made: {0}")]
    NoRoom(NoDefrag),
}

/// The answer to one evaluation.
pub type EvalResult = Result<EvalDone, EvalError>;
