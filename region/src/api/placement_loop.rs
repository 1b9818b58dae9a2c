//! The leader's placement loop: functions below `min_instances` (after a
//! topology reload drained their node, a reshaping update, or a deploy
//! whose rollback was cut short by a leader change) are placed again.
//!
//! Every [`TICK`], the replica that leads plans one instance for each
//! function `underplaced()` lists, with the same planner and re-check as a
//! deploy. A function that cannot be placed now (quota, capacity) is tried
//! again on the next tick.

use std::time::Duration;

use gshare_core::model::FunctionSpec;

use super::functions::place_one;
use crate::http::HttpContext;

/// How often the leader looks for underplaced functions.
pub const TICK: Duration = Duration::from_secs(1);

/// Runs forever on the current tokio runtime (spawn it).
pub async fn run(ctx: HttpContext) {
    loop {
        tokio::time::sleep(TICK).await;
        let leads = ctx.replica.raft.metrics().borrow().current_leader == Some(ctx.replica.id);
        if !leads {
            continue;
        }
        let specs: Vec<FunctionSpec> = {
            let st = ctx.replica.state.read();
            let d = st.region.domain();
            d.underplaced()
                .into_iter()
                .filter_map(|(t, name, _)| d.function(&t, &name).ok().map(|f| f.spec.clone()))
                .collect()
        };
        for spec in specs {
            if let Err(e) = place_one(&ctx, &spec).await {
                tracing::debug!("re-placing {}/{}: {e}", spec.tenant, spec.name);
            }
        }
    }
}
