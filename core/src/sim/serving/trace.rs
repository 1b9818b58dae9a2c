//! Serving traces: requests (arrival, function, service time on a whole
//! GPU) and the functions they invoke.
//!
//! The CSV format is detected from the header:
//!
//! | header has                                                    | format                          | function            | service time (whole GPU)                  |
//! |---------------------------------------------------------------|---------------------------------|---------------------|-------------------------------------------|
//! | `gmt_create`, `exec_time_seconds`, `checkpoint_model_version_id` | Alibaba GenAI `lora_request_trace.csv` | base model id       | `exec_time_seconds`                      |
//! | `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`               | Azure LLM inference 2023        | one LLM (8B, fp16)  | 20 ms + 40 µs/context token + 6 ms/generated token |
//!
//! Every request of the file is kept, whatever its status: the trace is the
//! demand. Arrivals are made relative to the first one and sorted (stable).
//! Model ids get the default profile of [`ServingParams`] (the trace does
//! not describe the models); the Azure LLM function is an 8B model in fp16.

use super::ServingParams;
use crate::executor::FunctionProfile;
use crate::model::{Micros, MilliGpu, Tier};
use std::collections::HashMap;

/// A function of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceFunction {
    /// Its name in the trace (model id).
    pub name: String,
    /// How the executor serves it.
    pub profile: FunctionProfile,
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival, µs after the trace's first request.
    pub arrival_us: Micros,
    /// Index into [`ServingTrace::functions`].
    pub function: u32,
    /// Service time on a whole GPU, µs.
    pub full_gpu_us: Micros,
}

/// The formats [`ServingTrace::parse`] recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// Alibaba GenAI serving 2026, `lora_request_trace.csv`.
    AlibabaGenAi,
    /// Azure LLM inference trace 2023 (code or conversation).
    AzureLlm,
}

/// Requests sorted by arrival, and their functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingTrace {
    /// A name for reports.
    pub name: String,
    /// Functions, indexed by [`TraceRequest::function`].
    pub functions: Vec<TraceFunction>,
    /// Requests by arrival.
    pub requests: Vec<TraceRequest>,
    /// Whether the `bound` policy's EDF estimate must hold every requested
    /// model's memory on its GPUs at once (the LLM workload: no model loads
    /// within a short request's slack); the other traces' estimate keeps
    /// every model resident everywhere for free.
    pub models_stay_resident: bool,
}

/// A trace file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The header matches no known format.
    #[error("unknown trace format (header {header:?}); expected the Alibaba GenAI lora_request_trace or the Azure LLM inference CSV")]
    UnknownFormat {
        /// The header line.
        header: String,
    },
    /// A row that does not parse.
    #[error("line {line}: {message}")]
    BadRow {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// No request at all.
    #[error("the trace has no requests")]
    Empty,
}

/// Longest service time a row may ask for, s (a day; the traces' longest
/// requests take minutes). Beyond it a row is refused, so that every sum
/// of arrival and service times in the simulator stays far from overflow.
const MAX_SERVICE_S: f64 = 86_400.0;
/// [`MAX_SERVICE_S`] in µs.
const MAX_SERVICE_US: Micros = 86_400_000_000;
/// Years a timestamp may have (four digits, as the traces write them).
const YEARS: std::ops::RangeInclusive<i64> = 1970..=9999;

/// Azure LLM: fixed cost per request, µs.
const LLM_FIXED_US: Micros = 20_000;
/// Azure LLM: prefill cost per context token, µs.
const LLM_PREFILL_US_PER_TOKEN: Micros = 40;
/// Azure LLM: decode cost per generated token, µs.
const LLM_DECODE_US_PER_TOKEN: Micros = 6_000;
/// Azure LLM: an 8B model in fp16 with its KV cache.
const LLM_MEMORY_MIB: u64 = 20_480;
/// Azure LLM: decoding does not use a whole GPU.
const LLM_SATURATION: MilliGpu = 600;

impl ServingTrace {
    /// Which format a header line announces.
    pub fn detect(header: &str) -> Option<TraceFormat> {
        let cols: Vec<&str> = header.trim().split(',').map(str::trim).collect();
        let has = |c: &str| cols.contains(&c);
        if has("gmt_create") && has("exec_time_seconds") && has("checkpoint_model_version_id") {
            Some(TraceFormat::AlibabaGenAi)
        } else if has("TIMESTAMP") && has("ContextTokens") && has("GeneratedTokens") {
            Some(TraceFormat::AzureLlm)
        } else {
            None
        }
    }

    /// Parse a trace CSV, detecting its format from the header.
    pub fn parse(name: &str, text: &str, params: &ServingParams) -> Result<Self, TraceError> {
        let mut lines = text.lines();
        let header = lines.next().unwrap_or("");
        let format = Self::detect(header).ok_or_else(|| TraceError::UnknownFormat {
            header: header.to_string(),
        })?;
        let cols: Vec<&str> = header.trim().split(',').map(str::trim).collect();
        let col = |c: &str| cols.iter().position(|x| *x == c).expect("detected");
        let mut functions: Vec<TraceFunction> = Vec::new();
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut rows: Vec<(Micros, u32, Micros)> = Vec::new();
        let default_profile = FunctionProfile {
            tier: Tier::Oversubscribed,
            memory_mib: params.trace_memory_mib,
            saturation_milli: params.trace_saturation_milli,
            batch_ppm: 0,
        };
        let (c_time, c_a, c_b) = match format {
            TraceFormat::AlibabaGenAi => (
                col("gmt_create"),
                col("exec_time_seconds"),
                col("checkpoint_model_version_id"),
            ),
            TraceFormat::AzureLlm => (
                col("TIMESTAMP"),
                col("ContextTokens"),
                col("GeneratedTokens"),
            ),
        };
        if format == TraceFormat::AzureLlm {
            functions.push(TraceFunction {
                name: "llm-8b".into(),
                profile: FunctionProfile {
                    tier: Tier::Oversubscribed,
                    memory_mib: LLM_MEMORY_MIB.min(params.gpu_memory_mib),
                    saturation_milli: LLM_SATURATION,
                    batch_ppm: 0,
                },
            });
        }
        for (k, line) in lines.enumerate() {
            let line_no = k + 2;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: String| TraceError::BadRow {
                line: line_no,
                message,
            };
            let fields: Vec<&str> = line.split(',').collect();
            let get = |i: usize| {
                fields
                    .get(i)
                    .map(|s| s.trim())
                    .ok_or_else(|| bad(format!("missing column {}", cols[i])))
            };
            let at = parse_datetime_us(get(c_time)?)
                .ok_or_else(|| bad(format!("bad timestamp {:?}", fields[c_time])))?;
            match format {
                TraceFormat::AlibabaGenAi => {
                    let secs: f64 = get(c_a)?
                        .parse()
                        .map_err(|_| bad(format!("bad exec_time_seconds {:?}", fields[c_a])))?;
                    if !(secs >= 0.0 && secs.is_finite()) {
                        return Err(bad(format!("negative exec_time_seconds {secs}")));
                    }
                    if secs > MAX_SERVICE_S {
                        return Err(bad(format!(
                            "exec_time_seconds {secs} is over {MAX_SERVICE_S}"
                        )));
                    }
                    let model = get(c_b)?;
                    let next = functions.len() as u32;
                    let f = *ids.entry(model.to_string()).or_insert_with(|| {
                        functions.push(TraceFunction {
                            name: model.to_string(),
                            profile: default_profile,
                        });
                        next
                    });
                    rows.push((at, f, (secs * 1e6).round() as Micros));
                }
                TraceFormat::AzureLlm => {
                    let tokens = |i: usize| -> Result<u64, TraceError> {
                        get(i)?
                            .parse()
                            .map_err(|_| bad(format!("bad token count {:?}", fields[i])))
                    };
                    let (ctx, gen) = (tokens(c_a)?, tokens(c_b)?);
                    let us = ctx
                        .checked_mul(LLM_PREFILL_US_PER_TOKEN)
                        .zip(gen.checked_mul(LLM_DECODE_US_PER_TOKEN))
                        .and_then(|(p, d)| p.checked_add(d)?.checked_add(LLM_FIXED_US))
                        .filter(|us| *us <= MAX_SERVICE_US)
                        .ok_or_else(|| {
                            bad(format!(
                                "{ctx} context and {gen} generated tokens take over {MAX_SERVICE_S} s"
                            ))
                        })?;
                    rows.push((at, 0, us));
                }
            }
        }
        if rows.is_empty() {
            return Err(TraceError::Empty);
        }
        rows.sort_by_key(|r| r.0);
        let t0 = rows[0].0;
        Ok(Self {
            name: name.to_string(),
            functions,
            requests: rows
                .into_iter()
                .map(|(at, function, full_gpu_us)| TraceRequest {
                    arrival_us: at - t0,
                    function,
                    full_gpu_us,
                })
                .collect(),
            models_stay_resident: false,
        })
    }

    /// Time from the first to the last arrival, µs.
    pub fn span_us(&self) -> Micros {
        self.requests.last().map_or(0, |r| r.arrival_us)
    }
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC, proleptic Gregorian) to µs since 1970.
pub(super) fn parse_datetime_us(s: &str) -> Option<Micros> {
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let sec: i64 = t.next()?.parse().ok()?;
    // Bounded fields keep the arithmetic below far from i64's limits.
    if !YEARS.contains(&y)
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || !(0..=23).contains(&h)
        || !(0..=59).contains(&mi)
        || !(0..=60).contains(&sec)
    {
        return None;
    }
    let mut micros: i64 = 0;
    for (i, c) in frac.chars().take(6).enumerate() {
        micros += c.to_digit(10)? as i64 * 10i64.pow(5 - i as u32);
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let total = ((days * 24 + h) * 60 + mi) * 60 + sec;
    u64::try_from(total * 1_000_000 + micros).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ServingParams {
        ServingParams::from_toml(
            "topology.toml",
            include_str!("../../../../configs/examples/topology.toml"),
        )
        .unwrap()
    }

    #[test]
    fn datetimes_count_from_the_epoch() {
        assert_eq!(parse_datetime_us("1970-01-01 00:00:01"), Some(1_000_000));
        assert_eq!(
            parse_datetime_us("2024-11-15 16:57:50"),
            Some(1_731_689_870_000_000)
        );
        assert_eq!(
            parse_datetime_us("2023-11-16 18:17:03.9799600"),
            Some(1_700_158_623_979_960)
        );
        assert_eq!(parse_datetime_us("2024-13-01 00:00:00"), None);
        // Fields that would overflow the day count, or are negative.
        assert_eq!(
            parse_datetime_us("9223372036854775807-01-01 00:00:00"),
            None
        );
        assert_eq!(
            parse_datetime_us("-9223372036854775807-01-01 00:00:00"),
            None
        );
        assert_eq!(parse_datetime_us("2024-01-01 -5:00:00"), None);
        assert_eq!(
            parse_datetime_us("9999-12-31 23:59:59"),
            Some(253_402_300_799_000_000)
        );
    }

    #[test]
    fn rows_whose_service_time_would_overflow_are_refused() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,18446744073709551615,10\n";
        assert!(matches!(
            ServingTrace::parse("a", csv, &params()),
            Err(TraceError::BadRow { line: 2, .. })
        ));
        let csv =
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,3074457345618258603\n";
        assert!(matches!(
            ServingTrace::parse("a", csv, &params()),
            Err(TraceError::BadRow { line: 2, .. })
        ));
        let csv = "gmt_create,exec_time_seconds,checkpoint_model_version_id\n2024-11-15 16:57:52,1e300,M0\n";
        assert!(matches!(
            ServingTrace::parse("g", csv, &params()),
            Err(TraceError::BadRow { line: 2, .. })
        ));
    }

    #[test]
    fn parses_genai_rows_and_interns_models() {
        let csv = "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,negative_prompt_length,num_images_per_prompt,num_inference_steps,checkpoint_model_version_id,num_lora\n\
2024-11-15 16:57:52,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0\n\
2024-11-15 16:57:50,TXT_2_IMG,FAILED,0.5,G0001,93.0,,1.0,40.0,M0001,0\n\
2024-11-15 16:57:55,IMG_2_IMG,SUCCEED,4,G0001,93.0,,8.0,40.0,M0000,0\n";
        let t = ServingTrace::parse("t", csv, &params()).unwrap();
        assert_eq!(t.functions.len(), 2);
        assert_eq!(t.functions[0].name, "M0000");
        assert_eq!(
            t.requests,
            vec![
                TraceRequest {
                    arrival_us: 0,
                    function: 1,
                    full_gpu_us: 500_000
                },
                TraceRequest {
                    arrival_us: 2_000_000,
                    function: 0,
                    full_gpu_us: 32_000_000
                },
                TraceRequest {
                    arrival_us: 5_000_000,
                    function: 0,
                    full_gpu_us: 4_000_000
                },
            ]
        );
    }

    #[test]
    fn parses_azure_llm_rows() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n";
        let t = ServingTrace::parse("a", csv, &params()).unwrap();
        assert_eq!(t.functions.len(), 1);
        assert_eq!(t.requests[1].arrival_us, 52_000);
        assert_eq!(t.requests[0].full_gpu_us, 20_000 + 4808 * 40 + 10 * 6_000);
    }

    #[test]
    fn unknown_header_and_bad_rows_are_reported() {
        assert!(matches!(
            ServingTrace::parse("x", "a,b\n1,2\n", &params()),
            Err(TraceError::UnknownFormat { .. })
        ));
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,10\n";
        assert_eq!(
            ServingTrace::parse("a", csv, &params()).unwrap_err(),
            TraceError::BadRow {
                line: 2,
                message: "bad token count \"x\"".into()
            }
        );
    }
}
