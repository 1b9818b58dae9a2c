//! The `sim` runtime driver: no process, just the predicted service time.

use super::{FunctionReply, Invocation, RuntimeDriver, RuntimeError, RuntimeFuture};
use gshare_core::model::{FunctionSpec, Slice};
use std::time::Duration;

/// Serves a request by waiting its service time (the executor's prediction
/// from the latency profile and compute share), then echoing the body with
/// `200` (on the transparent route too: there is no HTTP here).
/// Swap-in and cold-start costs are paid by the GPU actor before the
/// executor dispatches here, exactly as in the serving simulator.
#[derive(Debug, Default)]
pub struct SimDriver {
    running: bool,
}

impl SimDriver {
    /// A stopped driver.
    pub fn new() -> Self {
        Self::default()
    }
}

impl RuntimeDriver for SimDriver {
    fn start(
        &mut self,
        _spec: &FunctionSpec,
        _slices: &[Slice],
    ) -> RuntimeFuture<Result<(), RuntimeError>> {
        self.running = true;
        Box::pin(async { Ok(()) })
    }

    fn invoke(
        &mut self,
        invocation: Invocation,
    ) -> RuntimeFuture<Result<FunctionReply, RuntimeError>> {
        let running = self.running;
        Box::pin(async move {
            if !running {
                return Err(RuntimeError::NotRunning);
            }
            // The echo needs the whole body (the ingress and the region
            // bound it by `max_request_bytes`); a cut one fails the call.
            // Reading it is bounded by the request's deadline, as the
            // process driver's call is: a body that trickles in (each part
            // inside the idle timeout) would otherwise keep the run, and
            // its compute share, for as long as the client likes. (The
            // service time itself is the executor's prediction, which it
            // dispatched to end by the deadline: not cut.)
            let collect = invocation.body.collect(usize::MAX);
            let read = match invocation.deadline {
                None => collect.await,
                Some(at) => tokio::time::timeout_at(tokio::time::Instant::from_std(at), collect)
                    .await
                    .map_err(|_| {
                        RuntimeError::DeadlineExceeded(
                            "the request's deadline passed before its body was read".into(),
                        )
                    })?,
            };
            let body = read.map_err(|e| RuntimeError::Failed(e.to_string()))?;
            if invocation.service_us > 0 {
                tokio::time::sleep(Duration::from_micros(invocation.service_us)).await;
            }
            Ok(FunctionReply::ok(body))
        })
    }

    fn stop(&mut self) -> RuntimeFuture<()> {
        self.running = false;
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gshare_core::executor::RequestId;

    fn inv(us: u64) -> Invocation {
        Invocation {
            request: RequestId(1),
            gpu: 0,
            compute_milli: 500,
            service_us: us,
            deadline: None,
            body: b"hi".to_vec().into(),
            http: None,
            stream_to: None,
        }
    }

    #[tokio::test]
    async fn serves_only_while_running_and_echoes() {
        let mut d = SimDriver::new();
        assert_eq!(d.invoke(inv(0)).await, Err(RuntimeError::NotRunning));
        d.running = true;
        assert_eq!(d.invoke(inv(0)).await.unwrap().body, b"hi".to_vec());
        d.stop().await;
        assert_eq!(d.invoke(inv(0)).await, Err(RuntimeError::NotRunning));
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_cut_at_the_deadline() {
        let mut d = SimDriver::new();
        d.running = true;
        let (tx, body) = crate::runtime::RequestBody::channel(4, Some(1_000));
        let mut late = inv(0);
        late.body = body;
        late.deadline = Some(std::time::Instant::now() + Duration::from_millis(50));
        let r = tokio::time::timeout(Duration::from_secs(10), d.invoke(late))
            .await
            .expect("answered by the deadline");
        assert!(matches!(r, Err(RuntimeError::DeadlineExceeded(_))), "{r:?}");
        drop(tx);
        // A whole body is not cut, nor is the service time after it (the
        // executor dispatched the run to end by the deadline).
        let mut timely = inv(20_000);
        timely.deadline = Some(std::time::Instant::now() + Duration::from_millis(1));
        assert_eq!(d.invoke(timely).await.unwrap().body, b"hi".to_vec());
    }
}
