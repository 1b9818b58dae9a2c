//! A seedable synthetic serving workload.
//!
//! - functions are deployments of common models (memory, typical service
//!   time and saturation share per model below), the model drawn uniformly;
//! - popularity is Zipf over functions (`zipf_s`, default 1.0);
//! - inter-arrivals are Weibull with shape < 1 (bursty: many short gaps,
//!   a heavy tail of long ones), as serverless traces show (Huawei Cloud's
//!   FaaS traces, EuroSys'25 "Serverless cold starts and where to find
//!   them"); shape and mean are parameters;
//! - each function's mean service time is its model's times a log-normal
//!   factor (σ = 0.5); each request's is the function's times a log-normal
//!   factor (σ = 0.3).

use super::{ServingTrace, TraceFunction, TraceRequest};
use crate::executor::FunctionProfile;
use crate::model::{Mib, Micros, MilliGpu, Tier};
use crate::rng::Rng;

/// Model name, GPU memory (MiB), mean service time on a whole GPU (ms),
/// saturation share (milli-GPU).
const MODELS: [(&str, Mib, u64, MilliGpu); 9] = [
    ("resnet-50", 512, 10, 250),
    ("bert-large", 1_536, 30, 350),
    ("whisper-large-v3", 4_096, 600, 500),
    ("qwen2.5-1.5b", 4_608, 400, 400),
    ("sd-1.5", 4_096, 2_000, 900),
    ("sdxl-1.0", 10_240, 6_000, 1000),
    ("mistral-7b", 18_432, 1_300, 600),
    ("llama-3.1-8b", 20_480, 1_500, 600),
    ("llama-2-13b", 30_720, 2_500, 800),
];

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticSpec {
    /// Number of functions.
    pub functions: u32,
    /// Number of requests.
    pub invocations: u64,
    /// Seed: the same spec gives the same trace.
    pub seed: u64,
    /// Mean gap between two requests (all functions), µs.
    pub mean_interarrival_us: Micros,
    /// Weibull shape of the gaps (< 1: bursty).
    pub weibull_shape: f64,
    /// Zipf exponent of popularity.
    pub zipf_s: f64,
}

impl SyntheticSpec {
    /// The defaults of `gsharectl sim serving --synthetic`.
    pub fn new(functions: u32, invocations: u64, seed: u64) -> Self {
        Self {
            functions,
            invocations,
            seed,
            mean_interarrival_us: 100_000,
            weibull_shape: 0.5,
            zipf_s: 1.0,
        }
    }

    /// Generate the trace.
    pub fn generate(&self) -> ServingTrace {
        let mut rng = Rng::new(self.seed);
        let n = self.functions.max(1) as usize;
        let mut functions = Vec::with_capacity(n);
        let mut mean_us = Vec::with_capacity(n);
        for i in 0..n {
            let (model, mem, ms, sat) = MODELS[rng.below(MODELS.len() as u64) as usize];
            functions.push(TraceFunction {
                name: format!("fn{i:04}-{model}"),
                profile: FunctionProfile {
                    tier: Tier::Oversubscribed,
                    memory_mib: mem,
                    saturation_milli: sat,
                    batch_ppm: 0,
                },
            });
            mean_us.push(ms as f64 * 1_000.0 * lognormal(&mut rng, 0.5));
        }
        // Zipf CDF over function indices (index 0 most popular).
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for rank in 1..=n {
            total += 1.0 / (rank as f64).powf(self.zipf_s);
            cdf.push(total);
        }
        let k = self.weibull_shape.max(0.05);
        let scale = self.mean_interarrival_us as f64 / gamma(1.0 + 1.0 / k);
        let mut requests = Vec::with_capacity(self.invocations as usize);
        let mut t = 0.0f64;
        for _ in 0..self.invocations {
            let u = rng.unit();
            let f = cdf.partition_point(|c| *c < u * total).min(n - 1);
            let exec = mean_us[f] * lognormal(&mut rng, 0.3);
            requests.push(TraceRequest {
                arrival_us: t as Micros,
                function: f as u32,
                full_gpu_us: exec.round().max(1.0) as Micros,
            });
            // Weibull gap by inversion.
            let v = 1.0 - rng.unit();
            t += scale * (-v.ln()).powf(1.0 / k);
        }
        ServingTrace {
            name: format!(
                "synthetic(functions={},invocations={},seed={})",
                self.functions, self.invocations, self.seed
            ),
            functions,
            requests,
            models_stay_resident: false,
        }
    }
}

/// exp(σ·Z − σ²/2) with Z standard normal (Box–Muller): mean 1.
fn lognormal(rng: &mut Rng, sigma: f64) -> f64 {
    let u1 = 1.0 - rng.unit();
    let u2 = rng.unit();
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    (sigma * z - sigma * sigma / 2.0).exp()
}

/// Γ(x) for x > 0 (Lanczos, g = 7).
fn gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x))
    } else {
        let x = x - 1.0;
        let mut a = C[0];
        let t = x + 7.5;
        for (i, c) in C.iter().enumerate().skip(1) {
            a += c / (x + i as f64);
        }
        (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_matches_factorials() {
        assert!((gamma(3.0) - 2.0).abs() < 1e-9);
        assert!((gamma(5.0) - 24.0).abs() < 1e-8);
        assert!((gamma(0.5) - std::f64::consts::PI.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn same_seed_same_trace_and_popularity_is_skewed() {
        let spec = SyntheticSpec::new(100, 20_000, 7);
        let a = spec.generate();
        assert_eq!(a, spec.generate());
        assert_ne!(a, SyntheticSpec::new(100, 20_000, 8).generate());
        let mut counts = vec![0u32; 100];
        for r in &a.requests {
            counts[r.function as usize] += 1;
        }
        // Zipf(1) over 100: the top function gets ~19 %, the last ~0.2 %.
        assert!(counts[0] > 10 * counts[99].max(1));
        assert!(a
            .requests
            .windows(2)
            .all(|w| w[0].arrival_us <= w[1].arrival_us));
        let mean_gap = a.span_us() as f64 / 19_999.0;
        assert!(
            (mean_gap / 100_000.0 - 1.0).abs() < 0.1,
            "mean gap {mean_gap}"
        );
    }
}
