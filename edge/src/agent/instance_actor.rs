//! One actor per hosted function: runs its requests through the runtime driver.

use super::{ReleaseInstance, RequestDone, Residency, RunRequest, StopNow};
use crate::runtime::{RuntimeDriver, RuntimeError};
use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Recipient,
    ResponseActFuture, WrapFuture,
};
use gshare_core::model::{FunctionSpec, Slice};

/// Drives one function's runtime: starts it, runs what the executor
/// dispatches, and stops once released and idle. Every request it is
/// given ends in a [`RequestDone`].
pub struct InstanceActor {
    driver: Box<dyn RuntimeDriver>,
    spec: FunctionSpec,
    slices: Vec<Slice>,
    done: Recipient<RequestDone>,
    running: usize,
    released: bool,
}

impl InstanceActor {
    /// An actor for `spec` on `slices`.
    pub fn new(
        driver: Box<dyn RuntimeDriver>,
        spec: FunctionSpec,
        slices: Vec<Slice>,
        done: Recipient<RequestDone>,
    ) -> Self {
        Self {
            driver,
            spec,
            slices,
            done,
            running: 0,
            released: false,
        }
    }

    fn stop_if_idle(&mut self, ctx: &mut Context<Self>) {
        if self.released && self.running == 0 {
            let stop = self.driver.stop();
            ctx.wait(stop.into_actor(self).map(|_, _, ctx| ctx.stop()));
        }
    }
}

impl Actor for InstanceActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let start = self.driver.start(&self.spec, &self.slices);
        let name = format!("{}/{}", self.spec.tenant.0, self.spec.name);
        // Requests wait until the runtime is up (ctx.wait blocks other messages).
        ctx.wait(start.into_actor(self).map(move |r, _, _| {
            if let Err(e) = r {
                tracing::error!("{name}: runtime failed to start: {e}");
            }
        }));
    }
}

impl Handler<RunRequest> for InstanceActor {
    type Result = ();

    fn handle(&mut self, RunRequest(inv): RunRequest, ctx: &mut Context<Self>) {
        let (request, gpu) = (inv.request, inv.gpu);
        if self.released {
            self.done.do_send(RequestDone {
                request,
                gpu,
                result: Err(RuntimeError::NotRunning),
            });
            return;
        }
        self.running += 1;
        let fut = self.driver.invoke(inv);
        ctx.spawn(fut.into_actor(self).map(move |result, act, ctx| {
            act.running -= 1;
            act.done.do_send(RequestDone {
                request,
                gpu,
                result,
            });
            act.stop_if_idle(ctx);
        }));
    }
}

impl Handler<ReleaseInstance> for InstanceActor {
    type Result = ();

    fn handle(&mut self, _: ReleaseInstance, ctx: &mut Context<Self>) {
        self.released = true;
        self.stop_if_idle(ctx);
    }
}

impl Handler<Residency> for InstanceActor {
    type Result = ();

    fn handle(&mut self, Residency(change): Residency, ctx: &mut Context<Self>) {
        if self.released {
            return;
        }
        let place = self.driver.place(change);
        let name = format!("{}/{}", self.spec.tenant.0, self.spec.name);
        // Like a start: requests wait until the runtime is where its weights are.
        ctx.wait(place.into_actor(self).map(move |r, _, _| {
            if let Err(e) = r {
                tracing::error!("{name}: runtime failed to follow its weights ({change:?}): {e}");
            }
        }));
    }
}

impl Handler<StopNow> for InstanceActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: StopNow, _: &mut Context<Self>) -> Self::Result {
        self.released = true;
        let stop = self.driver.stop();
        Box::pin(stop.into_actor(self).map(|_, _, ctx| ctx.stop()))
    }
}
