//! One actor per GPU: carries out loads and releases on its backend.

use super::{LoadDone, LoadWeights, ReleaseWeights};
use crate::gpu::SimulatedGpu;
use actix::{Actor, AsyncContext, Context, Handler, Recipient};
use std::time::Duration;

/// Carries out the executor's load commands for one GPU: accounts the
/// memory exactly and reports the load done after its duration (the copy
/// time by bandwidth the executor computed).
pub struct GpuActor {
    gpu: SimulatedGpu,
    done: Recipient<LoadDone>,
}

impl GpuActor {
    /// An actor for `gpu` reporting to `done`.
    pub fn new(gpu: SimulatedGpu, done: Recipient<LoadDone>) -> Self {
        Self { gpu, done }
    }
}

impl Actor for GpuActor {
    type Context = Context<Self>;
}

impl Handler<LoadWeights> for GpuActor {
    type Result = ();

    fn handle(&mut self, msg: LoadWeights, ctx: &mut Context<Self>) {
        let index = self.gpu.info().index;
        let error = self.gpu.load(msg.function, msg.memory_mib).err();
        if let Some(e) = &error {
            tracing::error!(gpu = index, "accounting refused a load: {e}");
        }
        let done = LoadDone {
            function: msg.function,
            gpu: index,
            error,
        };
        if msg.duration_us == 0 {
            self.done.do_send(done);
        } else {
            ctx.run_later(Duration::from_micros(msg.duration_us), move |a, _| {
                a.done.do_send(done)
            });
        }
    }
}

impl Handler<ReleaseWeights> for GpuActor {
    type Result = ();

    fn handle(&mut self, msg: ReleaseWeights, _: &mut Context<Self>) {
        if let Err(e) = self.gpu.release(msg.function) {
            tracing::error!("accounting: {e}");
        }
    }
}
